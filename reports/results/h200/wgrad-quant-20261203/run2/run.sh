#!/bin/bash
# integration run 2: build all, GPU + CPU tests, fingerprint, benches, Nsight Compute on the Wgrad kernel
set -u
R=$OUT/r; mkdir -p $R
T0=$(date +%s); t(){ echo "$(( $(date +%s)-T0 ))s $*" >> $R/summary.txt; }
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm --format=csv > $R/gpu.txt 2>&1
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > $R/configure.log 2>&1
cmake --build build -j 16 > $R/build.log 2>&1; t "build rc=$?"
grep -E "warning|error" $R/build.log | head -40 > $R/build_warnings.txt
timeout 120 build/tests/fp4moe_tests_gpu_gemm --gtest_filter='GroupedWgradSm90.*:SetmaxnregCheckGpu.*' > $R/wgrad_tests.log 2>&1; t "wgrad tests rc=$?"
timeout 120 build/tests/fp4moe_tests_gpu_quant --gtest_filter='Bf16ToMxfp4RowGpu.*:MxFastCodecs.*' > $R/quant_row_tests.log 2>&1; t "quant row tests rc=$?"
(cd build && timeout 280 ctest -L gpu -j 4 --timeout 250 --output-on-failure > $R/ctest_gpu.log 2>&1); t "gpu ctest rc=$?"
(cd build && timeout 150 ctest -LE gpu -j 12 --timeout 140 --output-on-failure > $R/ctest_cpu.log 2>&1); t "cpu ctest rc=$?"
timeout 150 bash scripts/train_fingerprint.sh --out $R/fp > $R/fingerprint_run.log 2>&1; t "fingerprint rc=$?"
diff $R/fp/fingerprint.txt reports/results/h200/buffer-plans-20261202/fingerprint-bc90070.txt > $R/fingerprint.diff 2>&1; t "fingerprint diff rc=$?"
cp $R/fp/fingerprint.txt $R/fingerprint.txt 2>/dev/null; rm -rf $R/fp
F='^bf16_to_mxfp4_(row|col)[a-z_]*/[a-z_0-9]+/(16384x7168|65536x7168)(/g32)?/|^copy/[0-9]{9,}B'
timeout 100 build/benchmarks/bench_quant --h5 $R/bench_quant.h5 --benchmark_filter="$F" > $R/bench_quant.log 2>&1; t "bench quant rc=$?"
timeout 60 build/benchmarks/bench_grouped_gemm --h5 $R/bench_gg.h5 --benchmark_filter='^wgrad/(fp8|fp8_sm90)/' > $R/bench_gg.log 2>&1; t "bench gg rc=$?"
timeout 90 /usr/local/cuda/bin/ncu -k regex:grouped_wgrad_sm90_kernel -c 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats build/benchmarks/bench_grouped_gemm --benchmark_filter='^wgrad/fp8_sm90/up 1x16384' > $R/ncu_wgrad_dense.txt 2>&1; t "ncu dense rc=$?"
timeout 90 /usr/local/cuda/bin/ncu -k regex:grouped_wgrad_sm90_kernel -c 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats build/benchmarks/bench_grouped_gemm --benchmark_filter='^wgrad/fp8_sm90/up 8x2048/' > $R/ncu_wgrad_8.txt 2>&1; t "ncu 8 rc=$?"
timeout 40 build/benchmarks/bench_attention --benchmark_filter=mla > $R/bench_attention.log 2>&1; t "bench attn rc=$?"
sed -i "s#$PWD/##g; s#$OUT/r/##g" $R/*.log $R/*.txt 2>/dev/null
t done
cd $OUT && tar czf r.tgz r && rm -rf r
