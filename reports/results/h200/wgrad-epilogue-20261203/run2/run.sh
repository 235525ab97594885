#!/bin/bash
# run 2: the grouped Wgrad kernel's accumulation by reductions in global memory (Sm90WgradConfig::reduce_accumulate)
# and its promotion overlapped: GPU tests (the variants bit for bit), the Wgrad rows (cuBLASLt, default, @serial,
# @rmw); the train.cuda_graph tests after the review (an evaluation of fewer rows drops the graph; recompute
# policies); v3_layer tokens/s with and without the graph.
set -u
R=$OUT/r; mkdir -p $R
T0=$(date +%s); t(){ echo "$(( $(date +%s)-T0 ))s $*" >> $R/summary.txt; }
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > $R/configure.log 2>&1
cmake --build build -j 16 --target bench_grouped_gemm fp4moe_tests_gpu_gemm fp4moe_tests_gpu_trainer fp4moe > $R/build.log 2>&1; t "build rc=$?"
FP4MOE_REQUIRE_GPU=1 timeout 120 build/tests/fp4moe_tests_gpu_gemm --gtest_filter='GroupedWgradSm90.*:SetmaxnregCheckGpu.*' > $R/wgrad_tests.log 2>&1; t "wgrad tests rc=$?"
timeout 150 build/benchmarks/bench_grouped_gemm --h5 $R/bench_gg.h5 --benchmark_filter='^wgrad/(fp8|fp8_sm90)/' > $R/bench_gg.log 2>&1; t "bench gg rc=$?"
FP4MOE_REQUIRE_GPU=1 timeout 150 build/tests/fp4moe_tests_gpu_trainer --gtest_filter='*TrainGraph*:StepGraph*:*StepGraph*' > $R/graph_tests.log 2>&1; t "graph tests rc=$?"
timeout 150 bash scripts/graph_step_time.sh --out $R/step_time_v3 --configs v3_layer --recipes "fp8 mxfp4" --steps 12 --repeats 2 > $R/step_time_v3.log 2>&1; t "step time v3_layer rc=$?"
rm -f $R/*/*.h5
sed -i "s#$PWD/##g; s#$OUT/r/##g" $R/*.log $R/*.txt $R/*/*.log 2>/dev/null
t done
cd $OUT && tar czf r.tgz r && rm -rf r
