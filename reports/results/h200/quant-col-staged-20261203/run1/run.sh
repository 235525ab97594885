#!/bin/bash
# run 1: column quantizer with staged outputs (block_staged) beside block_per_thread; L2 breakdown
set -u
R=$OUT/r; mkdir -p $R
T0=$(date +%s); t(){ echo "$(( $(date +%s)-T0 ))s $*" >> $R/summary.txt; }
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm --format=csv > $R/gpu.txt 2>&1
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > $R/configure.log 2>&1
cmake --build build -j 16 --target bench_quant fp4moe_tests_gpu_quant > $R/build.log 2>&1; t "build rc=$?"
timeout 200 build/tests/fp4moe_tests_gpu_quant --gtest_filter='*Col*' > $R/gpu_quant_col_tests.log 2>&1; t "gpu quant col tests rc=$?"
F='^bf16_to_mxfp4_col(_staged)?/[a-z_0-9]+/(16384|65536)x7168(/g32)?/|^copy/[0-9]{9,}B'
for i in 1 2; do
  timeout 150 build/benchmarks/bench_quant --h5 $R/bench_quant_$i.h5 --benchmark_filter="$F" > $R/bench_quant_$i.log 2>&1; t "bench $i rc=$?"
done
M=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sectors_op_read.sum,lts__t_sectors_op_write.sum,lts__t_requests_srcunit_tex_op_read.sum,lts__t_requests_srcunit_tex_op_write.sum,l1tex__t_requests_pipe_lsu_mem_global_op_st.sum,l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,sm__warps_active.avg.pct_of_peak_sustained_active,sm__issue_active.avg.pct_of_peak_sustained_active,breakdown:lts__throughput.avg.pct_of_peak_sustained_elapsed
n(){ timeout 60 /usr/local/cuda/bin/ncu -k regex:$1 -c 1 --metrics $M build/benchmarks/bench_quant --benchmark_filter="$2" > $R/ncu_$3.txt 2>&1; t "ncu $3 rc=$?"; }
n col_block_kernel '^bf16_to_mxfp4_col/floor_rne/65536x7168/min' col_blocks_rne
n col_block_kernel '^bf16_to_mxfp4_col_staged/floor_rne/65536x7168/min' col_staged_rne
n col_block_kernel '^bf16_to_mxfp4_col_staged/floor_rne_h16/65536x7168/min' col_staged_h16
n col_block_kernel '^bf16_to_mxfp4_col_staged/floor_rne_h32/65536x7168/min' col_staged_h32
n row_block_kernel '^bf16_to_mxfp4_row/floor_rne/65536x7168/min' row_rne
n row_block_kernel '^bf16_to_mxfp4_row/floor_rne_rht/16384x7168/min' row_rht_16384
sed -i "s#$PWD/##g; s#$OUT/r/##g" $R/*.log $R/*.txt 2>/dev/null
t done
cd $OUT && tar czf r.tgz r && rm -rf r
