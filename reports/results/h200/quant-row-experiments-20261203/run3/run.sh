#!/bin/bash
# run 3 (source at 61d48df): the column quantizer's narrow kernel (2 columns per thread, RNE): column GPU tests, SR encoder test, bench, Nsight Compute
set -u
R=$OUT/r; mkdir -p $R
T0=$(date +%s); t(){ echo "$(( $(date +%s)-T0 ))s $*" >> $R/summary.txt; }
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm --format=csv > $R/gpu.txt 2>&1
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > $R/configure.log 2>&1
cmake --build build -j 16 --target bench_quant fp4moe_tests_gpu_quant > $R/build.log 2>&1; t "build rc=$?"
timeout 200 build/tests/fp4moe_tests_gpu_quant --gtest_filter='Bf16ToMxfp4ColGpu.*:MxSrEncodersGpu.*' > $R/quant_col_tests.log 2>&1; t "quant col tests rc=$?"
F='^bf16_to_mxfp4_col(_narrow)?/[a-z_0-9]+/(16384x7168|65536x7168)(/g32)?/|^copy/[0-9]{9,}B'
timeout 100 build/benchmarks/bench_quant --h5 $R/bench_quant.h5 --benchmark_filter="$F" > $R/bench_quant.log 2>&1; t "bench quant rc=$?"
S="--section SpeedOfLight --section ComputeWorkloadAnalysis --section InstructionStats --section WarpStateStats --section SchedulerStats --section Occupancy --section MemoryWorkloadAnalysis"
timeout 40 /usr/local/cuda/bin/ncu -k regex:col_narrow_kernel -c 1 $S build/benchmarks/bench_quant --benchmark_filter="^bf16_to_mxfp4_col_narrow/floor_rne/65536x7168/" > $R/ncu_colnarrow_floor_rne.txt 2>&1; t "ncu narrow rc=$?"
sed -i "s#$PWD/##g; s#$OUT/r/##g" $R/*.log $R/*.txt 2>/dev/null
t done
cd $OUT && tar czf r.tgz r && rm -rf r
