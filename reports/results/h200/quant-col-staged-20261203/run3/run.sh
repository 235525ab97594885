#!/bin/bash
# run 3: the pipelined column kernel (cp.async tile loads overlapped with the previous tile's
# quantization; 4 or 3 blocks per SM) beside block_per_thread and block_staged
set -u
R=$OUT/r; mkdir -p $R
T0=$(date +%s); t(){ echo "$(( $(date +%s)-T0 ))s $*" >> $R/summary.txt; }
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm --format=csv > $R/gpu.txt 2>&1
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > $R/configure.log 2>&1
cmake --build build -j 16 --target bench_quant fp4moe_tests_gpu_quant > $R/build.log 2>&1; t "build rc=$?"
timeout 200 build/tests/fp4moe_tests_gpu_quant --gtest_filter='*Col*' > $R/gpu_quant_col_tests.log 2>&1; t "gpu quant col tests rc=$?"
F='^bf16_to_mxfp4_col(_staged|_pipe4|_pipe3)?/[a-z_0-9]+/(16384|65536)x7168(/g32)?/|^copy/[0-9]{9,}B'
for i in 1 2; do
  timeout 200 build/benchmarks/bench_quant --h5 $R/bench_quant_$i.h5 --benchmark_filter="$F" > $R/bench_quant_$i.log 2>&1; t "bench $i rc=$?"
done
M=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__inst_executed.sum,sm__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,lts__t_sectors_op_read.sum,lts__t_sectors_op_write.sum
n(){ timeout 60 /usr/local/cuda/bin/ncu -k regex:$1 -c 1 --metrics $M build/benchmarks/bench_quant --benchmark_filter="$2" > $R/ncu_$3.txt 2>&1; t "ncu $3 rc=$?"; }
for o in floor_rne floor_rne_h16 floor_rne_h32; do
  n col_pipelined_kernel "^bf16_to_mxfp4_col_pipe4/$o/65536x7168/min" col_pipe4_$o
  n col_pipelined_kernel "^bf16_to_mxfp4_col_pipe3/$o/65536x7168/min" col_pipe3_$o
done
sed -i "s#$PWD/##g; s#$OUT/r/##g" $R/*.log $R/*.txt 2>/dev/null
t done
cd $OUT && tar czf r.tgz r && rm -rf r
