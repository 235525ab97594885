#!/bin/bash
# run 3: after the second review: every GEMM GPU test (the Wgrad kernel's subnormal flush among them), the trainer's
# graph, loop, memory-estimate, recompute and model tests, the default path's loss fingerprint.
set -u
R=$OUT/r; mkdir -p $R
T0=$(date +%s); t(){ echo "$(( $(date +%s)-T0 ))s $*" >> $R/summary.txt; }
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > $R/configure.log 2>&1
cmake --build build -j 16 --target fp4moe_tests_gpu_gemm fp4moe_tests_gpu_trainer fp4moe > $R/build.log 2>&1; t "build rc=$?"
FP4MOE_REQUIRE_GPU=1 timeout 240 build/tests/fp4moe_tests_gpu_gemm > $R/gemm_tests.log 2>&1; t "gemm tests rc=$?"
FP4MOE_REQUIRE_GPU=1 timeout 150 build/tests/fp4moe_tests_gpu_trainer --gtest_filter='*TrainGraph*:StepGraph*:*StepGraph*:TrainLoop*:*Memory*:*Recompute*:*Model*' > $R/trainer_tests.log 2>&1; t "trainer tests rc=$?"
timeout 120 bash scripts/train_fingerprint.sh --out $R/fp > $R/fp.log 2>&1; t "fingerprint rc=$?"; rm -f $R/fp/*.h5 $R/fp/*.log
sed -i "s#$PWD/##g; s#$OUT/r/##g" $R/*.log $R/*.txt 2>/dev/null
t done
cd $OUT && tar czf r.tgz r && rm -rf r
