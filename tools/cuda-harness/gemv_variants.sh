#!/bin/bash
# Usage (on a GPU machine, from the repo root): bash tools/cuda-harness/gemv_variants.sh; DEPTHS="4 6" narrows it.
# Batch-1 GEMV depth variants (ANVIL_GEMV_DEPTH1) timed by the harness.
cd "$(dirname "$0")/../.."
o=/tmp/g; mkdir -p $o
flags="-std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -Isrc"
nvcc $flags -c src/backend/cuda/moe_quantized.cu -o $o/moe.o &
for D in ${DEPTHS:-4 6 8 10 12}; do
  nvcc $flags -DANVIL_GEMV_DEPTH1=$D -Xptxas -v -c tools/cuda-harness/harness.cu -o $o/h$D.o 2> $o/ptxas$D.txt &
done
wait
for D in ${DEPTHS:-4 6 8 10 12}; do
  nvcc -gencode=arch=compute_90a,code=sm_90a $o/h$D.o $o/moe.o -o $o/h$D || { echo "link $D failed"; continue; }
  echo "== depth $D: $(grep -A1 'gemv_kernelILi1ELi8ELb0E' $o/ptxas$D.txt | grep -o 'Used [0-9]* registers\|[0-9]* bytes spill stores' | sort -u | tr '\n' ' ')"
  timeout 60 $o/h$D gemv > $o/run$D.txt 2>&1  # raw output per depth stays in /tmp/g
  grep -E "PERF|FAIL" $o/run$D.txt | cut -c6-120
done
