#!/bin/bash
# the Wgrad kernel's tests, with the bad-offsets case
set -u
R=$OUT/r; mkdir -p $R
T0=$(date +%s); t(){ echo "$(( $(date +%s)-T0 ))s $*" >> $R/summary.txt; }
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > $R/configure.log 2>&1
cmake --build build -j 16 --target fp4moe_tests_gpu_gemm > $R/build.log 2>&1; t "build rc=$?"
timeout 60 build/tests/fp4moe_tests_gpu_gemm --gtest_filter='GroupedWgradSm90.*' > $R/wgrad_tests.log 2>&1; t "wgrad tests rc=$?"
sed -i "s#$PWD/##g; s#$OUT/r/##g" $R/*.log 2>/dev/null
t done
