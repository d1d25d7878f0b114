#!/usr/bin/env bash
# Packs binaries built here, their non-glibc shared libraries and the GPU fixtures into one
# tarball, .gpu-pack/carry.tgz, for the lent GPU machine (whose working-tree copy is capped at
# 64 MiB, and which has no ../shared). On the GPU machine:
#
#   tar -xzf .gpu-pack/carry.tgz && ANVIL_PREBUILT=.gpu-carry \
#     ANVIL_FIXTURES_DIR=$PWD/.gpu-carry/fixtures bash scripts/gpu_check.sh
#
# Usage: bash scripts/gpu_carry.sh BUILD_DIR [BASE_ANVIL]
#   BUILD_DIR   a CUDA build with the anvil and anvil_gpu_tests targets built
#   BASE_ANVIL  optional: an earlier anvil binary, carried as anvil-base, for gpu_check.sh's
#               A/B mode (ANVIL_BASE=.gpu-carry/anvil-base): both benchmarked in one lease
# Variants built by scripts/gpu_variants.sh (build-variants/out/NAME/) travel as
# .gpu-carry/variants/NAME/ (anvil, anvil_gpu_tests, SOURCE). ANVIL_CARRY_TRACE=1 adds the
# kernel-timeline library (tools/cuda-harness/kernel_trace.cpp, built here) and CUPTI's:
#   CUDA_INJECTION64_PATH=$PWD/.gpu-carry/libkernel_trace.so ANVIL_TRACE_OUT=t.csv ...
# The copy the GPU machine gets (tracked files, ~29 MiB of them, plus the carry) is capped at
# 64 MiB, so a pack may have to be split: ANVIL_CARRY_VARIANTS="a b" carries only those variants,
# ANVIL_CARRY_TESTS=0 leaves out every GPU test binary and the fixtures (enough for timings with
# dummy weights). ANVIL_CARRY_DIR (default .gpu-pack) names the folder the tarball goes to, so that
# a second pack for a later call of the same lease can wait beside the first (carry only its folder).
# ANVIL_CARRY_EXTRA="file ..." adds standalone executables built here (tools/cuda-harness probes)
# as .gpu-carry/extra/NAME.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:?usage: gpu_carry.sh BUILD_DIR [BASE_ANVIL]}
base=${2:-}
fixtures=${ANVIL_FIXTURES_DIR:-$(cd .. && pwd)/shared/fixtures}
tests=${ANVIL_CARRY_TESTS:-1}
for f in "$build/anvil" "$build/tests/anvil_gpu_tests" ${base:+"$base"}; do
  [ -x "$f" ] || { echo "gpu_carry.sh: $f: no such executable" >&2; exit 1; }
done
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
carry=$stage/.gpu-carry
mkdir -p "$carry/lib" "$carry/fixtures/o200k_harmony"
cp "$build/anvil" "$carry/"
[ "$tests" = 1 ] && cp "$build/tests/anvil_gpu_tests" "$carry/"
[ -n "$base" ] && cp "$base" "$carry/anvil-base"
if [ -d build-variants/out ]; then
  mkdir -p "$carry/variants"
  for dir in build-variants/out/*/; do
    name=$(basename "$dir")
    [ -z "${ANVIL_CARRY_VARIANTS:-}" ] || [[ " $ANVIL_CARRY_VARIANTS " == *" $name "* ]] || continue
    cp -r "$dir" "$carry/variants/$name"
    [ "$tests" = 1 ] || rm -f "$carry/variants/$name/anvil_gpu_tests"
  done
fi
for bin in "$carry"/anvil* "$carry"/variants/*/anvil*; do
  [ -e "$bin" ] || continue
  # glibc and the driver come from the GPU machine; everything else travels.
  ldd "$bin" | awk '/=> \// {print $3}' |
    grep -v -E '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*|libgcc_s|libcuda)\.so' |
    while read -r lib; do cp -L "$lib" "$carry/lib/"; done
done
if [ -n "${ANVIL_CARRY_EXTRA:-}" ]; then
  mkdir -p "$carry/extra"
  for f in $ANVIL_CARRY_EXTRA; do
    [ -x "$f" ] || { echo "gpu_carry.sh: $f: no such executable" >&2; exit 1; }
    cp "$f" "$carry/extra/"
  done
fi
strip "$carry"/anvil* "$carry"/variants/*/anvil* "$carry"/extra/* 2>/dev/null || true
if [ "${ANVIL_CARRY_TRACE:-0}" = 1 ]; then
  cuda=${CUDA_HOME:-/usr/local/cuda}
  g++ -O2 -shared -fPIC -I"$cuda/include" tools/cuda-harness/kernel_trace.cpp -L"$cuda/lib64" -lcupti \
    -o "$carry/libkernel_trace.so"
  cp -L "$cuda"/lib64/libcupti.so.* "$carry/lib/" 2>/dev/null || true
fi
if [ "$tests" = 1 ]; then
  for model in gpt-oss-tiny qwen3-tiny qwen3moe-tiny; do cp -r "$fixtures/$model" "$carry/fixtures/"; done
  cp "$fixtures/o200k_harmony/tokenizer.json.gz" "$carry/fixtures/o200k_harmony/"
fi
pack_dir=${ANVIL_CARRY_DIR:-.gpu-pack}
mkdir -p "$pack_dir"
tar -czf "$pack_dir/carry.tgz" -C "$stage" .gpu-carry
echo "gpu_carry.sh: $pack_dir/carry.tgz $(du -h "$pack_dir/carry.tgz" | cut -f1) (carry [\"$pack_dir\"])"
# The device tool refuses a working tree over 64 MiB (tracked files plus the carry): say so here,
# before a lease is spent finding out.
tracked=$(git ls-files -z | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
pack=$(stat -c %s "$pack_dir/carry.tgz")
if ((tracked + pack > 64 * 1024 * 1024)); then
  echo "gpu_carry.sh: tracked files $((tracked >> 20)) MiB + pack $((pack >> 20)) MiB exceed the device's 64 MiB;" \
    "narrow it (ANVIL_CARRY_VARIANTS, ANVIL_CARRY_TESTS=0)" >&2
  exit 1
fi
