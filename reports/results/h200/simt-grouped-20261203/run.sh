#!/bin/bash
# run 2: the CUDA-core grouped GEMMs from device offsets (grouped_gemm_simt.h) and Group Linear without a host copy
# for every recipe: build the GEMM GPU tests, run all of them.
set -u
R=$OUT/r; mkdir -p $R
T0=$(date +%s); t(){ echo "$(( $(date +%s)-T0 ))s $*" >> $R/summary.txt; }
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm --format=csv > $R/gpu.txt 2>&1
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > $R/configure.log 2>&1
cmake --build build -j 16 --target fp4moe_tests_gpu_gemm > $R/build.log 2>&1; t "build rc=$?"
grep -E "warning|error" $R/build.log | grep -v stringop-overflow | grep -v alloc-size-larger | head -40 > $R/build_warnings.txt
FP4MOE_REQUIRE_GPU=1 timeout 150 build/tests/fp4moe_tests_gpu_gemm --gtest_filter='GroupedGemmSimt*:*DeviceOnlySplit*:GroupedGemm.*' > $R/simt_and_graph_tests.log 2>&1; t "simt and graph tests rc=$?"
FP4MOE_REQUIRE_GPU=1 timeout 300 build/tests/fp4moe_tests_gpu_gemm --gtest_filter='-GroupedGemmSimt*:*DeviceOnlySplit*:GroupedGemm.*' > $R/other_gemm_tests.log 2>&1; t "other gemm tests rc=$?"
sed -i "s#$PWD/##g; s#$OUT/r/##g" $R/*.log $R/*.txt 2>/dev/null
t done
cd $OUT && tar czf r.tgz r && rm -rf r
