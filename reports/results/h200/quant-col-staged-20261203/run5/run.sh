#!/bin/bash
# run 5: the column SR encoder with BF16x2 scaling (tree) against HEAD's (exp_old/): column GPU tests;
# bench_quant SR rows new/old interleaved
# the tree: ed874a8 with sr_bf16x2.patch applied; exp_old/mx_col_block.cuh: git show ed874a8:kernels/quant/mx_col_block.cuh
set -u
R=$OUT/r; mkdir -p $R
T0=$(date +%s); t(){ echo "$(( $(date +%s)-T0 ))s $*" >> $R/summary.txt; }
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm --format=csv > $R/gpu.txt 2>&1
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > $R/configure.log 2>&1
cmake --build build -j 16 --target bench_quant fp4moe_tests_gpu_quant > $R/build.log 2>&1; t "build rc=$?"
cp build/benchmarks/bench_quant /tmp/bq_new
timeout 100 build/tests/fp4moe_tests_gpu_quant --gtest_filter='*Col*' > $R/gpu_quant_col_tests.log 2>&1; t "gpu quant col tests rc=$?"
cp kernels/quant/mx_col_block.cuh /tmp/keep_mcb.cuh && cp exp_old/mx_col_block.cuh kernels/quant/
cmake --build build -j 16 --target bench_quant > $R/build_old.log 2>&1; t "build old rc=$?"
cp build/benchmarks/bench_quant /tmp/bq_old && cp /tmp/keep_mcb.cuh kernels/quant/mx_col_block.cuh
F='^bf16_to_mxfp4_col(_staged)?/floor_sr[a-z_0-9]*/(16384|65536)x7168(/g32)?/|^copy/[0-9]{9,}B'
for i in 1 2; do
  for v in new old; do
    timeout 40 /tmp/bq_$v --h5 $R/bench_quant_${v}_$i.h5 --benchmark_filter="$F" > $R/bench_quant_${v}_$i.log 2>&1; t "bench $v $i rc=$?"
  done
done
sed -i "s#$PWD/##g; s#$OUT/r/##g" $R/*.log $R/*.txt 2>/dev/null
t done
