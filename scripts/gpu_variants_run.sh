#!/usr/bin/env bash
# On the lent GPU machine, in one `run` call (carry [".gpu-pack"]): unpacks what gpu_carry.sh
# packed, runs the full GPU suite of each carried variant that has one (scripts/gpu_variants.sh),
# dumps the SASS of named kernels where cuobjdump is at hand, then times the base build against
# the variants with scripts/gpu_ab.sh. Everything lands under $OUT, packed as $OUT/variants.tgz.
#
#   bash scripts/gpu_variants_run.sh [NAME=BINARY[,VAR=VALUE...] ...]
#   extra gpu_ab.sh specs are timed beside base and the variants, e.g.
#   chunks3=.gpu-carry/variants/chunks/anvil,ANVIL_ATTENTION_CHUNKS=3
#
# VARIANTS (default: every carried one) narrows the list; ANVIL_AB_* shape the A/B as in
# gpu_ab.sh (ANVIL_AB_SKIP=1 runs the tests only); ANVIL_SASS_KERNELS: substrings of kernel
# names to dump (e.g. "moe_decode_f16_kernelILi2ELb1"); OUT (default /tmp/anvil-variants).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/anvil-variants}
mkdir -p "$OUT"
tar -xzf .gpu-pack/carry.tgz
export ANVIL_FIXTURES_DIR=$PWD/.gpu-carry/fixtures
LIB=.gpu-carry/lib
names=${VARIANTS:-$(ls .gpu-carry/variants 2>/dev/null)}

dump_sass() {  # NAME BINARY
  [ -n "${ANVIL_SASS_KERNELS:-}" ] && command -v cuobjdump > /dev/null || return 0
  cuobjdump --dump-sass "$2" > "$OUT/full-sass-$1.txt" 2>&1 || return 0
  for kernel in $ANVIL_SASS_KERNELS; do
    # One function's listing: from its header to the next function's.
    awk -v k="$kernel" '/Function :/ {on = index($0, k) > 0} on' "$OUT/full-sass-$1.txt" > "$OUT/sass-$1-$kernel.txt"
    echo "$1 $kernel: $(grep -c '/\*[0-9a-f]*\*/' "$OUT/sass-$1-$kernel.txt") SASS lines"
  done
}

status=0
specs=("base=.gpu-carry/anvil")
dump_sass base .gpu-carry/anvil
for name in $names; do
  dir=.gpu-carry/variants/$name
  [ -x "$dir/anvil" ] || { echo "gpu_variants_run.sh: no variant $name" >&2; status=1; continue; }
  echo "$name: $(tr '\n' ' ' < "$dir/SOURCE")"
  if [ -x "$dir/anvil_gpu_tests" ]; then
    timeout "${ANVIL_TEST_TIMEOUT:-300}" env "LD_LIBRARY_PATH=$LIB" "$dir/anvil_gpu_tests" > "$OUT/tests-$name.log" 2>&1
    rc=$?
    echo "$name: GPU tests rc $rc $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/tests-$name.log" | tr '\n' ' ')"
    [ "$rc" -eq 0 ] || { status=1; grep -E '^\[  FAILED' "$OUT/tests-$name.log" | head -10; }
  fi
  dump_sass "$name" "$dir/anvil"
  specs+=("$name=$dir/anvil")
done
if [ -z "${ANVIL_AB_SKIP:-}" ]; then
  OUT=$OUT/ab bash scripts/gpu_ab.sh "${specs[@]}" "$@" || status=1
fi
tar -czf "$OUT/variants.tgz" --exclude=variants.tgz --exclude='full-sass-*' -C "$(dirname "$OUT")" "$(basename "$OUT")"
exit $status
