#!/bin/bash
# run 1 (source at 7636b27): quant targets only; row tests (every row kernel); row/col bench; Nsight Compute on the row and column kernels
set -u
R=$OUT/r; mkdir -p $R
T0=$(date +%s); t(){ echo "$(( $(date +%s)-T0 ))s $*" >> $R/summary.txt; }
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm --format=csv > $R/gpu.txt 2>&1
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > $R/configure.log 2>&1
cmake --build build -j 16 --target bench_quant fp4moe_tests_gpu_quant > $R/build.log 2>&1; t "build rc=$?"
grep -E "warning|error" $R/build.log | head -40 > $R/build_warnings.txt
timeout 240 build/tests/fp4moe_tests_gpu_quant --gtest_filter='Bf16ToMxfp4RowGpu.*:MxFastCodecs.*:MxSrEncodersGpu.*' > $R/quant_row_tests.log 2>&1; t "quant row tests rc=$?"
F='^bf16_to_mxfp4_(row|col)[a-z_]*/[a-z_0-9]+/(16384x7168|65536x7168)/|^copy/[0-9]{9,}B'
timeout 150 build/benchmarks/bench_quant --h5 $R/bench_quant.h5 --benchmark_filter="$F" > $R/bench_quant.log 2>&1; t "bench quant rc=$?"
S="--section SpeedOfLight --section ComputeWorkloadAnalysis --section InstructionStats --section WarpStateStats --section SchedulerStats --section Occupancy --section MemoryWorkloadAnalysis --section LaunchStats"
for v in floor_rne floor_sr floor_rne_h16 floor_rne_rht; do
  timeout 40 /usr/local/cuda/bin/ncu -k regex:row_block_kernel -c 1 $S build/benchmarks/bench_quant --benchmark_filter="^bf16_to_mxfp4_row/$v/65536x7168/" > $R/ncu_row_$v.txt 2>&1; t "ncu row $v rc=$?"
done
for v in floor_rne_h16; do
  timeout 40 /usr/local/cuda/bin/ncu -k regex:row_mma_kernel -c 1 $S build/benchmarks/bench_quant --benchmark_filter="^bf16_to_mxfp4_row_mma/$v/65536x7168/" > $R/ncu_rowmma_$v.txt 2>&1; t "ncu rowmma $v rc=$?"
done
timeout 40 /usr/local/cuda/bin/ncu -k regex:row_prefetch_kernel -c 1 $S build/benchmarks/bench_quant --benchmark_filter="^bf16_to_mxfp4_row_prefetch/floor_rne_h16/65536x7168/" > $R/ncu_rowpf_floor_rne_h16.txt 2>&1; t "ncu rowpf rc=$?"
for v in floor_rne floor_rne_h16; do
  timeout 40 /usr/local/cuda/bin/ncu -k regex:col_block_kernel -c 1 $S build/benchmarks/bench_quant --benchmark_filter="^bf16_to_mxfp4_col/$v/65536x7168/" > $R/ncu_col_$v.txt 2>&1; t "ncu col $v rc=$?"
done
sed -i "s#$PWD/##g; s#$OUT/r/##g" $R/*.log $R/*.txt 2>/dev/null
t done
cd $OUT && tar czf r.tgz r && rm -rf r
