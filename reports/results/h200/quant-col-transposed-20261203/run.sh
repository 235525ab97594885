#!/bin/bash
# run 1: the transposed column kernel (block_transposed) and the row kernel's block code moved to mx_block_device.cuh
# (tree) against HEAD's row kernel (exp_old/, made by: git show HEAD:kernels/quant/bf16_to_mxfp4_row.cu).
set -u
R=$OUT/r; mkdir -p $R
T0=$(date +%s); t(){ echo "$(( $(date +%s)-T0 ))s $*" >> $R/summary.txt; }
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm --format=csv > $R/gpu.txt 2>&1
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > $R/configure.log 2>&1
cmake --build build -j 16 --target fp4moe_tests_gpu_quant bench_quant > $R/build.log 2>&1; t "build rc=$?"
grep -E "warning|error" $R/build.log | head -40 > $R/build_warnings.txt
cp build/benchmarks/bench_quant /tmp/bq_new
FP4MOE_REQUIRE_GPU=1 timeout 200 build/tests/fp4moe_tests_gpu_quant > $R/gpu_quant_tests.log 2>&1; t "gpu quant tests rc=$?"
cp kernels/quant/bf16_to_mxfp4_row.cu /tmp/keep_row.cu && cp exp_old/bf16_to_mxfp4_row.cu kernels/quant/
cmake --build build -j 16 --target bench_quant > $R/build_old.log 2>&1; t "build old rc=$?"
cp build/benchmarks/bench_quant /tmp/bq_old && cp /tmp/keep_row.cu kernels/quant/bf16_to_mxfp4_row.cu
FN='^bf16_to_mxfp4_(row|col)[a-z_]*/[a-z_0-9]+/(16384|65536)x7168(/g32)?/|^copy/[0-9]{9,}B'
FO='^bf16_to_mxfp4_row[a-z_]*/[a-z_0-9]+/(16384|65536)x7168/|^copy/[0-9]{9,}B'
for i in 1 2; do
  timeout 100 /tmp/bq_new --h5 $R/bench_quant_new_$i.h5 --benchmark_filter="$FN" > $R/bench_quant_new_$i.log 2>&1; t "bench new $i rc=$?"
  timeout 60 /tmp/bq_old --h5 $R/bench_quant_old_$i.h5 --benchmark_filter="$FO" > $R/bench_quant_old_$i.log 2>&1; t "bench old $i rc=$?"
done
M=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__inst_executed.sum,sm__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,smsp__pcsamp_warps_issue_stalled_barrier
for o in floor_rne_h16 floor_sr; do
  timeout 40 /usr/local/cuda/bin/ncu -k regex:col_transposed_kernel -c 1 --metrics $M /tmp/bq_new --benchmark_filter="^bf16_to_mxfp4_col[a-z_]*/$o/65536x7168/min" > $R/ncu_tx_$o.txt 2>&1; t "ncu $o rc=$?"
done
sed -i "s#$PWD/##g; s#$OUT/r/##g" $R/*.log $R/*.txt 2>/dev/null
t done
cd $OUT && tar czf r.tgz r && rm -rf r
