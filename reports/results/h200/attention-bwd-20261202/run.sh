#!/usr/bin/env bash
set -uo pipefail
R=results; mkdir -p $R
t0=$(date +%s); DEADLINE=${DEADLINE:-330}
el(){ echo $(( $(date +%s) - t0 )); }
left(){ echo $(( DEADLINE - ($(date +%s) - t0) )); }
log(){ echo "$* @$(el)s" | tee -a $R/summary.txt; }
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > $R/configure.log 2>&1; log "configure rc=$?"
cmake --build build -j 16 > $R/build.log 2>&1; log "build rc=$?"
T(){ local name=$1 lim=$2; shift 2; ( FP4MOE_REQUIRE_GPU=1 timeout -k 5 $lim "$@" > $R/$name.log 2>&1; echo "$name rc=$?" > $R/$name.rc ) & }
T attention_tests 150 build/tests/fp4moe_tests_gpu_attention
T gemm_tests 170 build/tests/fp4moe_tests_gpu_gemm --gtest_filter='GroupedGemm*:GroupLinear*'
T quant_tests 150 build/tests/fp4moe_tests_gpu_quant --gtest_filter='Bf16ToMxfp4RowGpu.*:Bf16ToMxfp4ColGpu.*:MxFastCodecs.*:MxRandom.*:*Mxfp4RowToFp8Row*'
( cd build && FP4MOE_REQUIRE_GPU=1 timeout -k 5 150 ctest -L gpu -E 'gpu_(attention|gemm|quant)' -j 2 --output-on-failure > $R/ctest_other.log 2>&1; echo "ctest nn+trainer rc=$?" > $R/ctest_other.rc ) &
( timeout -k 5 160 bash scripts/train_fingerprint.sh --out $R/fp > $R/fingerprint.log 2>&1; echo "fingerprint rc=$?" > $R/fp.rc;
  diff $R/fp/fingerprint.txt reports/results/h200/buffer-plans-20261202/fingerprint-bc90070.txt > $R/fingerprint.diff 2>&1; echo "fingerprint diff rc=$?" >> $R/fp.rc ) &
wait
for f in $R/*.rc; do log "$(cat $f | tr '\n' ' ')"; done
grep -hE "^\[  (FAILED|PASSED) " $R/*_tests.log >> $R/summary.txt; tail -8 $R/ctest_other.log >> $R/summary.txt
run_bench(){ local name=$1 need=$2; shift 2; local l=$(left); if [ $l -lt $need ]; then log "$name skipped (${l}s left)"; return; fi
  timeout -k 5 $(( l < 120 ? l : 120 )) "$@" > $R/$name.log 2>&1; log "$name rc=$?"; }
run_bench bench_attention 15 build/benchmarks/bench_attention --h5 $R/bench_attention.h5 --benchmark_filter='mla'
run_bench bench_grouped_gemm 20 build/benchmarks/bench_grouped_gemm --h5 $R/bench_grouped_gemm.h5 --benchmark_filter='^fprop/(fp8|fp8_sm90|mxfp4_sm90|mxfp4_cvt_sm90)/(up|down) (8x2048|16x1024|32x512)/'
run_bench bench_quant 30 build/benchmarks/bench_quant --h5 $R/bench_quant.h5 --benchmark_filter='^bf16_to_mxfp4_(row|col)/[a-z_0-9]+/(16384x7168|65536x7168)(/g32)?/|^copy/[0-9]{9,}B'
cd $OUT && tar czf r.tgz r && rm -rf r
tar xzOf r.tgz r/summary.txt | tail -40
