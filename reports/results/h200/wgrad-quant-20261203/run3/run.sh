#!/bin/bash
# final check: the GEMM and attention GPU test programs after the launcher refactor
set -u
R=$OUT/r; mkdir -p $R
T0=$(date +%s); t(){ echo "$(( $(date +%s)-T0 ))s $*" >> $R/summary.txt; }
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > $R/configure.log 2>&1
cmake --build build -j 16 --target fp4moe_tests_gpu_gemm fp4moe_tests_gpu_attention fp4moe_tests_cpu > $R/build.log 2>&1; t "build rc=$?"
timeout 200 build/tests/fp4moe_tests_gpu_gemm > $R/gemm_tests.log 2>&1; t "gemm tests rc=$?"
timeout 150 build/tests/fp4moe_tests_gpu_attention > $R/attention_tests.log 2>&1; t "attention tests rc=$?"
timeout 60 build/tests/fp4moe_tests_cpu --gtest_filter='GroupedWgradSm90LaunchChecks.*:GroupedGemmRef.*:SetmaxnregCheck.*' > $R/cpu_checks.log 2>&1; t "cpu checks rc=$?"
sed -i "s#$PWD/##g; s#$OUT/r/##g" $R/*.log 2>/dev/null
t done
