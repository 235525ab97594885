#!/bin/bash
# MXFP4-direct Fprop with the producer's conversion rewritten (tables in shared memory, 9 instructions per 8 codes,
# unrolled passes): tests, speed, profile; the conversion kernel's tests and speed with the new code conversion.
set -u
R=$OUT/r; mkdir -p $R
T0=$(date +%s); t(){ echo "$(( $(date +%s)-T0 ))s $*" >> $R/summary.txt; }
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > $R/configure.log 2>&1
cmake --build build -j 16 --target bench_grouped_gemm bench_quant fp4moe_tests_gpu_gemm fp4moe_tests_gpu_quant > $R/build.log 2>&1; t "build rc=$?"
FP4MOE_REQUIRE_GPU=1 timeout 200 build/tests/fp4moe_tests_gpu_gemm --gtest_filter='GroupedGemmSm90*' > $R/gemm_tests.log 2>&1; t "gemm sm90 tests rc=$?"
FP4MOE_REQUIRE_GPU=1 timeout 100 build/tests/fp4moe_tests_gpu_quant --gtest_filter='Mxfp4RowToFp8Row*' > $R/quant_tests.log 2>&1; t "quant tests rc=$?"
build/benchmarks/bench_grouped_gemm --benchmark_filter='^fprop/(mxfp4_sm90|mxfp4_cvt_sm90)/' > $R/bench_mx.log 2>&1; t "bench mx rc=$?"
build/benchmarks/bench_quant --benchmark_filter='^mxfp4_row_to_fp8_row(_naive)?/(65536x|16384x7168)|^copy/[0-9]{9,}B' > $R/bench_quant.log 2>&1; t "bench quant rc=$?"
/usr/local/cuda/bin/cuobjdump -sass build/kernels/CMakeFiles/fp4moe_kernels.dir/gemm/grouped_gemm_sm90.cu.o > $R/new.sass 2>&1
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
timeout 200 $NCU --kernel-name regex:grouped_gemm_sm90_kernel --launch-skip 3 --launch-count 1 --set full --import-source no -f -o $R/mx_up \
  build/benchmarks/bench_grouped_gemm --benchmark_filter='^fprop/mxfp4_sm90/up 8x2048/' > $R/ncu.log 2>&1; t "ncu rc=$?"
$NCU -i $R/mx_up.ncu-rep --page details > $R/ncu_details.txt 2>&1
$NCU -i $R/mx_up.ncu-rep --page source --csv --print-source sass > $R/ncu_source.csv 2>&1; t "ncu export rc=$?"
sed -i "s#$PWD/##g; s#$OUT/r/##g" $R/*.log $R/*.txt 2>/dev/null
t done
cd $OUT && tar czf r.tgz r && rm -rf r
