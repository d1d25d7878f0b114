#!/bin/bash
# Usage (on a GPU machine, from the repo root): bash tools/cuda-harness/variants.sh; OUT=dir keeps the raw runs.
# MoE decode launch-shape variants (MINB1 STAGES PREFETCH_TILES): build each against the harness, time moedec.
cd "$(dirname "$0")/../.."
o=/tmp/b; mkdir -p $o
flags="-std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -Isrc"
VARIANTS=${VARIANTS:-"4_8_2 6_4_2 6_4_0 8_4_0 6_6_0 5_6_2 4_8_0"}
nvcc $flags -c tools/cuda-harness/harness.cu -o $o/harness.o &
for V in $VARIANTS; do
  IFS=_ read a b c <<< "$V"
  nvcc $flags -DANVIL_DECODE_MINB1=$a -DANVIL_DECODE_STAGES=$b -DANVIL_DECODE_PREFETCH_TILES=$c -Xptxas -v \
    -c src/backend/cuda/moe_quantized.cu -o $o/moe_$V.o 2> $o/ptxas_$V.txt &
done
wait
for V in $VARIANTS; do
  nvcc -gencode=arch=compute_90a,code=sm_90a $o/harness.o $o/moe_$V.o -o $o/h_$V || { echo "link $V failed"; tail -5 $o/ptxas_$V.txt; continue; }
  echo "== $V $(grep -A1 'moe_decode_kernelILi1E' $o/ptxas_$V.txt | grep -o 'Used [0-9]* registers\|[0-9]* bytes spill stores' | tr '\n' ' ')"
  timeout 90 $o/h_$V moedec > $o/run_$V.txt 2>&1
  grep -E "PERF|FAIL" $o/run_$V.txt | grep -v copy | cut -c6-110
done
OUT=${OUT:-$o}
mkdir -p $OUT/v && cp $o/run_*.txt $o/ptxas_*.txt $OUT/v/ 2>/dev/null; tar -C $OUT -czf $OUT/variants.tgz v && rm -rf $OUT/v
