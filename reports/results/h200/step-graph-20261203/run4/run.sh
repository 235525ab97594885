#!/bin/bash
# run 4: a training step of tiny without host synchronisation captured in a CUDA graph (Model::set_host_sync_free,
# the router's device tally), every recipe, v3 and v2; the router GPU tests; the model and MoE layer tests; the
# loss fingerprint of the default path.
set -u
R=$OUT/r; mkdir -p $R
T0=$(date +%s); t(){ echo "$(( $(date +%s)-T0 ))s $*" >> $R/summary.txt; }
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm --format=csv > $R/gpu.txt 2>&1
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > $R/configure.log 2>&1
cmake --build build -j 16 > $R/build.log 2>&1; t "build rc=$?"
grep -E "warning|error" $R/build.log | grep -v stringop-overflow | grep -v alloc-size-larger | head -40 > $R/build_warnings.txt
FP4MOE_REQUIRE_GPU=1 timeout 200 build/tests/fp4moe_tests_gpu_trainer --gtest_filter='StepGraph*:*StepGraph*' > $R/step_graph_tests.log 2>&1; t "step graph tests rc=$?"
FP4MOE_REQUIRE_GPU=1 timeout 100 build/tests/fp4moe_tests_gpu_nn --gtest_filter='NnMoeRouter*' > $R/router_tests.log 2>&1; t "router tests rc=$?"
FP4MOE_REQUIRE_GPU=1 timeout 200 build/tests/fp4moe_tests_gpu_trainer --gtest_filter='*Moe*:*Model*:*Inflight*:*InFlight*' > $R/model_moe_tests.log 2>&1; t "model and moe tests rc=$?"
timeout 150 bash scripts/train_fingerprint.sh --out $R/fp > $R/fingerprint_run.log 2>&1; t "fingerprint rc=$?"
diff $R/fp/fingerprint.txt reports/results/h200/buffer-plans-20261202/fingerprint-bc90070.txt > $R/fingerprint.diff 2>&1; t "fingerprint diff rc=$?"
cp $R/fp/fingerprint.txt $R/fingerprint.txt 2>/dev/null; rm -rf $R/fp
sed -i "s#$PWD/##g; s#$OUT/r/##g" $R/*.log $R/*.txt 2>/dev/null
t done
cd $OUT && tar czf r.tgz r && rm -rf r
