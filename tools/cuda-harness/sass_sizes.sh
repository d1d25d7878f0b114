#!/usr/bin/env bash
# Static SASS instruction count of every kernel in a cubin (each instruction is 16 bytes from
# SM70 on), read from its ELF section sizes: a proxy for an inner loop's cost when neither
# cuobjdump nor nvdisasm is at hand (this repo's build machine has neither). Compare two builds
# of the same file: a change confined to an unrolled loop moves its kernels by the loop's change
# times the unroll. Spills and registers come from `nvcc -Xptxas -v`.
#
# Usage: bash tools/cuda-harness/sass_sizes.sh FILE.cubin [FILTER]
#   nvcc -std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -Isrc \
#     -cubin -o /tmp/moe.cubin src/backend/cuda/moe_quantized.cu
set -euo pipefail
cubin=${1:?usage: sass_sizes.sh FILE.cubin [FILTER]}
readelf -S -W "$cubin" 2>/dev/null | grep ' \.text\.' | grep -- "${2:-.}" | sed 's/^ *\[ *[0-9]*\] *//' |
  while read -r name type addr off size rest; do echo "$((16#$size / 16)) ${name#.text.}"; done
