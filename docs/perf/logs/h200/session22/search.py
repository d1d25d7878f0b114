# Placements of an MXFP4 word's 4 fp16 pairs (session 22): each pair's 8 bits (magnitudes at
# 9-11 / 25-27, signs at 15 / 31) come out of the word through one transform and a mask; find
# four transforms whose source bits are disjoint and fill the word, cheapest first. Transforms:
# the word itself, rotations, shifts, byte permutes, and a bit reversal (shared) then a rotation.
# Run: python3 search.py
import itertools
T = [9,10,11,15,25,26,27,31]
# A transform maps source word bits to output bits; we need pre-image of T positions: for each output p in T, source bit s(p).
def rot(r): return lambda p: (p - r) % 32            # out = rotl(w, r): out bit p = w bit p-r
def shl(r): return lambda p: (p - r) if p - r >= 0 else None
def shr(r): return lambda p: (p + r) if p + r < 32 else None
def brev_rot(r): return lambda p: 31 - ((p - r) % 32)   # out = rotl(brev(w), r)
def prmt(b1, b3): # out byte1 = w byte b1, out byte3 = w byte b3
    def f(p):
        byte, bit = divmod(p, 8)
        src = b1 if byte == 1 else b3
        return src * 8 + bit
    return f
cands = [('mask', lambda p: p, 1)]
for r in range(1, 32): cands.append((f'rot{r}', rot(r), 2))
for r in range(1, 32): cands.append((f'shl{r}', shl(r), 2)); cands.append((f'shr{r}', shr(r), 2))
for r in range(0, 32): cands.append((f'brevrot{r}', brev_rot(r), 2 if r == 0 else 3))  # brev shared across pairs counted below
for b1 in range(4):
    for b3 in range(4): cands.append((f'prmt{b1}{b3}', prmt(b1, b3), 2))
pre = []
for name, f, cost in cands:
    s = [f(p) for p in T]
    if None in s or len(set(s)) != 8: continue
    pre.append((name, frozenset(s), cost))
# dedupe by set keeping min cost
best = {}
for n, s, c in pre:
    if s not in best or best[s][1] > c: best[s] = (n, c)
items = [(v[0], s, v[1]) for s, v in best.items()]
print(len(items), 'distinct pre-images')
results = []
for combo in itertools.combinations(items, 4):
    sets = [c[1] for c in combo]
    u = set()
    ok = True
    for s in sets:
        if u & s: ok = False; break
        u |= s
    if not ok or len(u) != 32: continue
    names = [c[0] for c in combo]
    cost = sum(c[2] for c in combo)
    # brev shared: each brevrot with r>0 costs 2 (rot+mask) + shared brev once; r == 0 costs mask + shared brev
    nb = sum(n.startswith('brevrot') for n in names)
    if nb:
        cost = sum((1 if c[0].startswith('brevrot0') else 2 if c[0].startswith('brevrot') else c[2]) for c in combo) + 1
    results.append((cost, names))
results.sort()
for r in results[:15]: print(r)
print(len(results))
