#!/bin/sh
# Builds the stand-in CUDA libraries into a pip-like tree and the workload linked against them.
# Usage: build.sh OUT_DIR   ->  OUT_DIR/site-packages/nvidia/cu13/lib/{libcudart.so.13,libcuda.so.1}
#                               OUT_DIR/workload
#                               OUT_DIR/runtime-only/libcudart.so.13 (no libcuda beneath it)
set -eu
src=$(cd "$(dirname "$0")" && pwd)
out=$1
lib="$out/site-packages/nvidia/cu13/lib"
mkdir -p "$lib"
cc=${CC:-gcc}
$cc -O2 -fPIC -shared -Wall -Wl,-soname,libcuda.so.1 -o "$lib/libcuda.so.1" "$src/cuda.c"
$cc -O2 -fPIC -shared -Wall -Wl,-soname,libcudart.so.13 -o "$lib/libcudart.so.13" "$src/cudart.c" \
    -L"$lib" -l:libcuda.so.1 -Wl,-rpath,"$lib"
mkdir -p "$out/runtime-only"
$cc -O2 -fPIC -shared -Wall -DSTANDIN_NO_DRIVER -Wl,-soname,libcudart.so.13 -o "$out/runtime-only/libcudart.so.13" \
    "$src/cudart.c"
$cc -O2 -Wall -pthread -o "$out/workload" "$src/workload.c" -L"$lib" -l:libcudart.so.13 -l:libcuda.so.1 -Wl,-rpath,"$lib"
# frame pointers, no sibling calls: every function of the stand-in training loop keeps a frame the walk passes
$cc -O2 -Wall -fno-omit-frame-pointer -fno-optimize-sibling-calls -o "$out/stacks" "$src/stacks.c" \
    -L"$lib" -l:libcudart.so.13 -Wl,-rpath,"$lib"
