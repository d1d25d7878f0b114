#!/usr/bin/env bash
# Builds the current commit with patches applied, one CUDA build per variant, so that several
# candidates are measured against the commit in one lease: scripts/gpu_carry.sh carries what this
# leaves in build-variants/out/NAME/ (anvil and anvil_gpu_tests), and scripts/gpu_ab.sh times
# name=binary pairs. Builds happen here, before the lease: the GPU machine's time is for running.
#
# Usage: bash scripts/gpu_variants.sh NAME=PATCH[+PATCH...] ...
#   e.g. bash scripts/gpu_variants.sh \
#          brev=docs/perf/logs/h200/session22/mxfp4-brev-layout-unmeasured.patch
#   ANVIL_CUDA_TARGETS (default sm_90a: the lent H200) and JOBS (default 2) shape the builds;
#   ANVIL_VARIANT_TESTS=0 builds and keeps only anvil (the carry holds 64 MiB: give the GPU tests
#   to the variants whose code they must check, e.g. one with every patch).
#   Each variant keeps its tree and build under build-variants/NAME/, so a rerun rebuilds only
#   what its patches touch.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
[ $# -gt 0 ] || { echo "usage: gpu_variants.sh NAME=PATCH[+PATCH...] ..." >&2; exit 2; }
targets=${ANVIL_CUDA_TARGETS:-sm_90a}
jobs=${JOBS:-2}
targets_built=(anvil)
[ "${ANVIL_VARIANT_TESTS:-1}" = 0 ] || targets_built+=(anvil_gpu_tests)
commit=$(git rev-parse HEAD)
for spec in "$@"; do
  name=${spec%%=*}
  patches=${spec#*=}
  [[ "$spec" == *=* && "$name" =~ ^[A-Za-z0-9._-]+$ && "$name" != out ]] || { echo "gpu_variants.sh: '$spec' is not NAME=PATCH" >&2; exit 2; }
  tree=$root/build-variants/$name/tree
  build=$root/build-variants/$name/build
  if [ -d "$tree" ]; then
    git -C "$tree" checkout -q --detach "$commit"
    git -C "$tree" reset -q --hard "$commit"
  else
    mkdir -p "$(dirname "$tree")"
    git worktree add -q --detach "$tree" "$commit"
  fi
  IFS='+' read -r -a list <<< "$patches"
  for patch in "${list[@]}"; do
    git -C "$tree" apply --whitespace=nowarn "$root/$patch" ||
      { echo "gpu_variants.sh: $patch does not apply to $commit" >&2; exit 1; }
  done
  cmake -S "$tree" -B "$build" -DCMAKE_BUILD_TYPE=Release -DANVIL_CUDA_TARGETS="$targets" -DANVIL_BUILD_TESTS=ON \
    > "$root/build-variants/$name/configure.log"
  nice cmake --build "$build" -j "$jobs" --target "${targets_built[@]}" > "$root/build-variants/$name/build.log" 2>&1 ||
    { tail -20 "$root/build-variants/$name/build.log" >&2; exit 1; }
  out=$root/build-variants/out/$name
  rm -rf "$out"
  mkdir -p "$out"
  cp "$build/anvil" "$out/"
  [ "${ANVIL_VARIANT_TESTS:-1}" = 0 ] || cp "$build/tests/anvil_gpu_tests" "$out/"
  printf '%s\n' "$commit" "$patches" > "$out/SOURCE"
  echo "gpu_variants.sh: $name ($patches on ${commit:0:7}) -> build-variants/out/$name"
done
