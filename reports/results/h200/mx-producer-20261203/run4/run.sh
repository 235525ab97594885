#!/bin/bash
# MXFP4-direct Fprop, the conversion before the next stage's wait: tests and speed; the peer's chunked column amax.
set -u
R=$OUT/r; mkdir -p $R
T0=$(date +%s); t(){ echo "$(( $(date +%s)-T0 ))s $*" >> $R/summary.txt; }
( timeout 300 python3 benchmarks/peers/group_linear_torch.py --h5 $R/peer.h5 --filter '/torch_fp8(_compiled)?/v3_fc1/e8/t16384/' > $R/peer.log 2>&1; echo "peer rc=$?" >> $R/peer.log ) &
PEER=$!
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > $R/configure.log 2>&1
cmake --build build -j 16 --target bench_grouped_gemm fp4moe_tests_gpu_gemm > $R/build.log 2>&1; t "build rc=$?"
wait $PEER; t "peer done"
FP4MOE_REQUIRE_GPU=1 timeout 200 build/tests/fp4moe_tests_gpu_gemm --gtest_filter='GroupedGemmSm90*' > $R/gemm_tests.log 2>&1; t "gemm sm90 tests rc=$?"
build/benchmarks/bench_grouped_gemm --benchmark_filter='^fprop/(mxfp4_sm90|mxfp4_cvt_sm90)/|^fprop/fp8(_sm90)?/(up|down) (8x2048|16x1024|32x512)/' > $R/bench_mx.log 2>&1; t "bench mx rc=$?"
sed -i "s#$PWD/##g; s#$OUT/r/##g" $R/*.log $R/*.txt 2>/dev/null
t done
cd $OUT && tar czf r.tgz r && rm -rf r
