import json, struct, sys, math
def load(p):
    b = open(p, 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + n]); t = h['logits']
    s, e = t['data_offsets']; T, V = t['shape']
    v = struct.unpack('<%df' % (T * V), b[8 + n + s:8 + n + e]); return T, V, v
T, V, cpu = load(sys.argv[1])
for p in sys.argv[2:]:
    _, _, g = load(p); worst = max(abs(a - c) for a, c in zip(g, cpu)); rms = math.sqrt(sum((a - c) ** 2 for a, c in zip(g, cpu)) / len(cpu))
    agree = sum(max(range(V), key=lambda j: g[t * V + j]) == max(range(V), key=lambda j: cpu[t * V + j]) for t in range(T))
    print(p, 'max', round(worst, 4), 'rms', round(rms, 5), 'argmax agree', agree, '/', T)
