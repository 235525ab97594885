#!/bin/bash
# The Group Linear scenarios at the default scale (group_linear_gemm: the Hopper kernels' rows; group_linear: the
# compiled PyTorch peer), the default trainer path's loss fingerprint.
set -u
R=$OUT/r; mkdir -p $R
T0=$(date +%s); t(){ echo "$(( $(date +%s)-T0 ))s $*" >> $R/summary.txt; }
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > $R/configure.log 2>&1
cmake --build build -j 16 --target fp4moe bench_grouped_gemm bench_group_linear > $R/build.log 2>&1; t "build rc=$?"
timeout 420 python3 repro/run.py --build build --scale default --only group_linear_gemm group_linear --out $R/runs > $R/repro.log 2>&1; t "repro rc=$?"
timeout 100 bash scripts/train_fingerprint.sh --out $R/fp > $R/fp.log 2>&1; t "fingerprint rc=$?"; rm -f $R/fp/*.h5 $R/fp/*.log
sed -i "s#$PWD/##g; s#$OUT/r/##g" $R/*.log $R/*.txt 2>/dev/null
t done
cd $OUT && tar czf r.tgz r && rm -rf r
