#!/bin/bash
# MXFP4-direct Fprop: where the producer's time goes (ncu source counters) and two variants of its loop.
set -u
R=$OUT/r; mkdir -p $R
T0=$(date +%s); t(){ echo "$(( $(date +%s)-T0 ))s $*" >> $R/summary.txt; }
( timeout 300 python3 benchmarks/peers/group_linear_torch.py --h5 $R/peer.h5 --filter '/torch_fp8(_compiled)?/v3_fc1/e8/t16384/' > $R/peer.log 2>&1; echo "peer rc=$?" >> $R/peer.log ) &
PEER=$!
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > $R/configure.log 2>&1
cmake --build build -j 16 --target bench_grouped_gemm > $R/build.log 2>&1; t "build rc=$?"
wait $PEER; t "peer done"
F='^fprop/(mxfp4_sm90|mxfp4_cvt_sm90)/(up|down) (8x2048|32x512)/'
build/benchmarks/bench_grouped_gemm --benchmark_filter="$F" > $R/bench_v0.log 2>&1; t "bench v0 rc=$?"
/usr/local/cuda/bin/cuobjdump -sass build/kernels/CMakeFiles/fp4moe_kernels.dir/gemm/grouped_gemm_sm90.cu.o > $R/v0.sass 2>&1; t "sass rc=$?"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
timeout 200 $NCU --kernel-name regex:grouped_gemm_sm90_kernel --launch-skip 3 --launch-count 1 --set full --import-source no -f -o $R/mx_up \
  build/benchmarks/bench_grouped_gemm --benchmark_filter='^fprop/mxfp4_sm90/up 8x2048/' > $R/ncu.log 2>&1; t "ncu rc=$?"
$NCU -i $R/mx_up.ncu-rep --page details > $R/ncu_details.txt 2>&1
$NCU -i $R/mx_up.ncu-rep --page source --csv --print-source sass > $R/ncu_source.csv 2>&1; t "ncu export rc=$?"
cp kernels/gemm/grouped_gemm_sm90.cu /tmp/orig.cu
for v in v1 v2; do
  cp /tmp/orig.cu kernels/gemm/grouped_gemm_sm90.cu
  patch -p1 < "$(dirname "$0")/variant_$v.diff"
  cmake --build build -j 16 --target bench_grouped_gemm > $R/build_$v.log 2>&1; t "build $v rc=$?"
  build/benchmarks/bench_grouped_gemm --benchmark_filter="$F" > $R/bench_$v.log 2>&1; t "bench $v rc=$?"
done
cp /tmp/orig.cu kernels/gemm/grouped_gemm_sm90.cu
sed -i "s#$PWD/##g; s#$OUT/r/##g" $R/*.log $R/*.txt 2>/dev/null
t done
cd $OUT && tar czf r.tgz r && rm -rf r
