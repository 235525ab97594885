#!/bin/bash
# run 6: review fixes of the step without host synchronisation (the v3 device tally keyed on the mode, allocated by
# the mode's first eager backward, evaluation forwards synchronised): the step-graph and router GPU tests.
set -u
R=$OUT/r; mkdir -p $R
T0=$(date +%s); t(){ echo "$(( $(date +%s)-T0 ))s $*" >> $R/summary.txt; }
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > $R/configure.log 2>&1
cmake --build build -j 16 --target fp4moe_tests_gpu_trainer fp4moe_tests_gpu_nn > $R/build.log 2>&1; t "build rc=$?"
FP4MOE_REQUIRE_GPU=1 timeout 60 build/tests/fp4moe_tests_gpu_trainer --gtest_filter='StepGraph*:*StepGraph*:MemoryEstimateModel.TinyBf16:RecomputeMoe.*' > $R/step_graph_tests.log 2>&1; t "step graph tests rc=$?"
FP4MOE_REQUIRE_GPU=1 timeout 30 build/tests/fp4moe_tests_gpu_nn --gtest_filter='NnMoeRouter*' > $R/router_tests.log 2>&1; t "router tests rc=$?"
sed -i "s#$PWD/##g; s#$OUT/r/##g" $R/*.log $R/*.txt 2>/dev/null
t done
cd $OUT && tar czf r.tgz r && rm -rf r
