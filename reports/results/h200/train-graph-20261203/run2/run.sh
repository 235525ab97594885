#!/bin/bash
# run 2: train.cuda_graph: the graph GPU tests after the non-finite test's fix; tokens/s at DeepSeek-V3's layer shape
# (configs/v3_layer.toml) with and without the graph.
set -u
R=$OUT/r; mkdir -p $R
T0=$(date +%s); t(){ echo "$(( $(date +%s)-T0 ))s $*" >> $R/summary.txt; }
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > $R/configure.log 2>&1
cmake --build build -j 16 --target fp4moe fp4moe_tests_gpu_trainer > $R/build.log 2>&1; t "build rc=$?"
FP4MOE_REQUIRE_GPU=1 timeout 150 build/tests/fp4moe_tests_gpu_trainer --gtest_filter='*TrainGraph*' > $R/graph_tests.log 2>&1; t "graph tests rc=$?"
timeout 300 bash scripts/graph_step_time.sh --out $R/step_time_v3 --configs v3_layer --recipes "fp8 mxfp4 bf16" --steps 12 --repeats 1 > $R/step_time_v3.log 2>&1; t "step time v3_layer rc=$?"
rm -f $R/*/*.h5
sed -i "s#$PWD/##g; s#$OUT/r/##g" $R/*.log $R/*.txt $R/*/*.log 2>/dev/null
t done
cd $OUT && tar czf r.tgz r && rm -rf r
