#!/bin/bash
# run 2: L2 bulk prefetch of the next wave's tile (row block_l2_prefetch, column block_l2_prefetch) beside
# block_per_thread / block_staged; instruction counts per option
set -u
R=$OUT/r; mkdir -p $R
T0=$(date +%s); t(){ echo "$(( $(date +%s)-T0 ))s $*" >> $R/summary.txt; }
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm --format=csv > $R/gpu.txt 2>&1
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > $R/configure.log 2>&1
cmake --build build -j 16 --target bench_quant fp4moe_tests_gpu_quant > $R/build.log 2>&1; t "build rc=$?"
timeout 200 build/tests/fp4moe_tests_gpu_quant > $R/gpu_quant_tests.log 2>&1; t "gpu quant tests rc=$?"
F='^bf16_to_mxfp4_(row|row_l2pf|col|col_staged|col_l2pf)/[a-z_0-9]+/(16384|65536)x7168(/g32)?/|^copy/[0-9]{9,}B'
for i in 1 2; do
  timeout 150 build/benchmarks/bench_quant --h5 $R/bench_quant_$i.h5 --benchmark_filter="$F" > $R/bench_quant_$i.log 2>&1; t "bench $i rc=$?"
done
M=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__inst_executed.sum,sm__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active,lts__t_sectors_srcunit_tex_lookup_hit.sum,lts__t_sectors_srcunit_tex_lookup_miss.sum,smsp__pcsamp_warps_issue_stalled_long_scoreboard.sum,smsp__pcsamp_warps_issue_stalled_wait.sum,smsp__pcsamp_sample_count.sum
n(){ timeout 60 /usr/local/cuda/bin/ncu -k regex:$1 -c 1 --metrics $M build/benchmarks/bench_quant --benchmark_filter="$2" > $R/ncu_$3.txt 2>&1; t "ncu $3 rc=$?"; }
for o in floor_rne floor_sr floor_rne_h16 floor_rne_h32 floor_rne_rht; do
  n col_block_kernel "^bf16_to_mxfp4_col_staged/$o/65536x7168/min" col_staged_$o
  n col_block_kernel "^bf16_to_mxfp4_col_l2pf/$o/65536x7168/min" col_l2pf_$o
done
n row_block_kernel '^bf16_to_mxfp4_row/floor_rne_rht/16384x7168/min' row_rht_16384
n row_block_kernel '^bf16_to_mxfp4_row_l2pf/floor_rne_rht/16384x7168/min' row_l2pf_rht_16384
sed -i "s#$PWD/##g; s#$OUT/r/##g" $R/*.log $R/*.txt 2>/dev/null
t done
cd $OUT && tar czf r.tgz r && rm -rf r
