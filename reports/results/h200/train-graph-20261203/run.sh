#!/bin/bash
# run 1: train.cuda_graph: the trainer's GPU tests of the graph and of the loop, the memory-estimate tests, then the
# tokens/s with and without the graph (scripts/graph_step_time.sh), then the default path's loss fingerprint.
set -u
R=$OUT/r; mkdir -p $R
T0=$(date +%s); t(){ echo "$(( $(date +%s)-T0 ))s $*" >> $R/summary.txt; }
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > $R/configure.log 2>&1
cmake --build build -j 16 --target fp4moe fp4moe_tests_gpu_trainer > $R/build.log 2>&1; t "build rc=$?"
FP4MOE_REQUIRE_GPU=1 timeout 150 build/tests/fp4moe_tests_gpu_trainer --gtest_filter='*TrainGraph*:StepGraph*:*StepGraph*' > $R/graph_tests.log 2>&1; t "graph tests rc=$?"
FP4MOE_REQUIRE_GPU=1 timeout 120 build/tests/fp4moe_tests_gpu_trainer --gtest_filter='TrainLoop*:MemoryEstimate*' > $R/loop_tests.log 2>&1; t "loop and memory tests rc=$?"
timeout 200 bash scripts/graph_step_time.sh --out $R/step_time --steps 40 --repeats 2 > $R/step_time.log 2>&1; t "step time rc=$?"
rm -f $R/step_time/*.h5
left=$(( 560 - ($(date +%s)-T0) ))
if [ $left -gt 60 ]; then timeout $left bash scripts/train_fingerprint.sh --out $R/fp > $R/fp.log 2>&1; t "fingerprint rc=$?"; rm -f $R/fp/*.h5; fi
sed -i "s#$PWD/##g; s#$OUT/r/##g" $R/*.log $R/*.txt $R/*/*.log 2>/dev/null
t done
cd $OUT && tar czf r.tgz r && rm -rf r
