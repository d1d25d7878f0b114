#!/bin/bash
# variant NAME FLAGS...: rebuild moe_quantized.cu with FLAGS, relink anvil as /tmp/variants/anvil-NAME
set -e
name=$1; shift
cd /work/main/build-gpu
mkdir -p /tmp/variants/$name
nvcc --options-file CMakeFiles/anvil_cuda.dir/includes_CUDA.rsp -DANVIL_WITH_CUDA=1 -DFMT_SHARED -O3 -DNDEBUG -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -std=c++17 "$@" -c ../src/backend/cuda/moe_quantized.cu -o /tmp/variants/$name/moe_quantized.cu.o
cp libanvil_cuda.a /tmp/variants/$name/libanvil_cuda.a
ar r /tmp/variants/$name/libanvil_cuda.a /tmp/variants/$name/moe_quantized.cu.o 2>/dev/null || true
# the archive member name must match
(cd /tmp/variants/$name && ar t libanvil_cuda.a | grep moe_quantized)
sed "s#libanvil_cuda.a#/tmp/variants/$name/libanvil_cuda.a#g; s#-o anvil #-o /tmp/variants/anvil-$name #" CMakeFiles/anvil.dir/link.txt > /tmp/variants/$name/link.sh
bash /tmp/variants/$name/link.sh
ls -la /tmp/variants/anvil-$name
