#!/usr/bin/env bash
# Session 33's tenth call (carry [".gpu-pack33h"]: tools/cuda-harness/phase_handoff.cu built on the
# development machine, nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Isrc): step 0
# of docs/perf/persistent-decode.md, a dependent phase handed on by PDL kernels or by counters in
# one persistent kernel, each phase streaming its own weights.
set -uo pipefail
cd "$(dirname "$0")/../../../../.."
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 120 .gpu-pack33h/handoff | tee "${OUT:-/tmp}/handoff.txt"
