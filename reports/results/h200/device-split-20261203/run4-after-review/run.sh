#!/bin/bash
# run 4: after the review's clean-up of GroupedGemm's fp8 entry points (one device check per call): build all,
# the device-only split tests, every GPU test program
set -u
R=$OUT/r; mkdir -p $R
T0=$(date +%s); t(){ echo "$(( $(date +%s)-T0 ))s $*" >> $R/summary.txt; }
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > $R/configure.log 2>&1
cmake --build build -j 16 > $R/build.log 2>&1; t "build rc=$?"
timeout 60 build/tests/fp4moe_tests_gpu_gemm --gtest_filter='*DeviceOnlySplit*' > $R/device_only_split_tests.log 2>&1; t "device-only split tests rc=$?"
(cd build && timeout 300 ctest -L gpu -j 4 --timeout 290 --output-on-failure > $R/ctest_gpu.log 2>&1); t "gpu ctest rc=$?"
sed -i "s#$PWD/##g; s#$OUT/r/##g" $R/*.log $R/*.txt 2>/dev/null
t done
cd $OUT && tar czf r.tgz r && rm -rf r
