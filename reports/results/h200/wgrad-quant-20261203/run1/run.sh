#!/bin/bash
# integration run: build all, GPU + CPU tests, new-kernel benches
set -u
R=$OUT/r; mkdir -p $R
T0=$(date +%s); t(){ echo "$(( $(date +%s)-T0 ))s $*" >> $R/summary.txt; }
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm --format=csv > $R/gpu.txt 2>&1
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > $R/configure.log 2>&1
cmake --build build -j 16 > $R/build.log 2>&1; t "build rc=$?"
grep -E "error|warning" $R/build.log | head -50 > $R/build_warnings.txt
timeout 120 build/tests/fp4moe_tests_gpu_gemm --gtest_filter='GroupedWgradSm90.*:SetmaxnregCheckGpu.*' > $R/wgrad_tests.log 2>&1; t "wgrad tests rc=$?"
(cd build && timeout 300 ctest -L gpu -j 4 --timeout 200 --output-on-failure > $R/ctest_gpu.log 2>&1); t "gpu ctest rc=$?"
(cd build && timeout 200 ctest -LE gpu -j 12 --timeout 180 > $R/ctest_cpu.log 2>&1); t "cpu ctest rc=$?"
timeout 90 build/benchmarks/bench_grouped_gemm --h5 $R/bench_gg.h5 --benchmark_filter='^(wgrad|fprop)/(fp8|fp8_sm90)/' > $R/bench_gg.log 2>&1; t "bench gg rc=$?"
F='^bf16_to_mxfp4_(row|col|col_blocks)/[a-z_0-9]+/(16384x7168|65536x7168)(/g32)?/|^copy/[0-9]{9,}B'
timeout 120 build/benchmarks/bench_quant --h5 $R/bench_quant.h5 --benchmark_filter="$F" > $R/bench_quant.log 2>&1; t "bench quant rc=$?"
timeout 60 build/benchmarks/bench_attention --benchmark_filter=mla > $R/bench_attention.log 2>&1; t "bench attn rc=$?"
sed -i "s#$PWD/##g; s#$OUT/r/##g" $R/*.log $R/*.txt 2>/dev/null
t done
cd $OUT && tar czf r.tgz r && rm -rf r
