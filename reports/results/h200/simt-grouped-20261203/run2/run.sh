#!/bin/bash
# run 3: review fixes of the CUDA-core grouped GEMMs (dispatch, limits, tests: paper 2's 1x128 weights in the
# captured Group Linear, no cuBLASLt call for device splits) and the column quantizer's helpers folded back:
# every GEMM GPU test, the column quantizer GPU tests.
set -u
R=$OUT/r; mkdir -p $R
T0=$(date +%s); t(){ echo "$(( $(date +%s)-T0 ))s $*" >> $R/summary.txt; }
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm --format=csv > $R/gpu.txt 2>&1
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > $R/configure.log 2>&1
cmake --build build -j 16 --target fp4moe_tests_gpu_gemm fp4moe_tests_gpu_quant > $R/build.log 2>&1; t "build rc=$?"
grep -E "warning|error" $R/build.log | grep -v stringop-overflow | grep -v alloc-size-larger | head -40 > $R/build_warnings.txt
FP4MOE_REQUIRE_GPU=1 timeout 100 build/tests/fp4moe_tests_gpu_quant --gtest_filter='*Col*' > $R/col_quant_tests.log 2>&1; t "column quant tests rc=$?"
FP4MOE_REQUIRE_GPU=1 timeout 330 build/tests/fp4moe_tests_gpu_gemm > $R/gemm_tests.log 2>&1; t "gemm tests rc=$?"
sed -i "s#$PWD/##g; s#$OUT/r/##g" $R/*.log $R/*.txt 2>/dev/null
t done
cd $OUT && tar czf r.tgz r && rm -rf r
