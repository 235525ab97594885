#!/bin/bash
# run 4: the column RNE encoder with codes below their sign bits (tree) against HEAD's (exp_old/):
# build all, every GPU test program, loss fingerprint; bench_quant column rows new/old interleaved; instructions
# exp_old/mx_col_block.cuh was made with: git show 6457916:kernels/quant/mx_col_block.cuh > exp_old/mx_col_block.cuh
set -u
R=$OUT/r; mkdir -p $R
T0=$(date +%s); t(){ echo "$(( $(date +%s)-T0 ))s $*" >> $R/summary.txt; }
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm --format=csv > $R/gpu.txt 2>&1
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > $R/configure.log 2>&1
cmake --build build -j 16 > $R/build.log 2>&1; t "build rc=$?"
grep -E "warning|error" $R/build.log | head -40 > $R/build_warnings.txt
cp build/benchmarks/bench_quant /tmp/bq_new
(cd build && timeout 330 ctest -L gpu -j 4 --timeout 320 --output-on-failure > $R/ctest_gpu.log 2>&1); t "gpu ctest rc=$?"
timeout 150 bash scripts/train_fingerprint.sh --out $R/fp > $R/fingerprint_run.log 2>&1; t "fingerprint rc=$?"
diff $R/fp/fingerprint.txt reports/results/h200/buffer-plans-20261202/fingerprint-bc90070.txt > $R/fingerprint.diff 2>&1; t "fingerprint diff rc=$?"
cp $R/fp/fingerprint.txt $R/fingerprint.txt 2>/dev/null; rm -rf $R/fp
cp kernels/quant/mx_col_block.cuh /tmp/keep_mcb.cuh && cp exp_old/mx_col_block.cuh kernels/quant/
cmake --build build -j 16 --target bench_quant > $R/build_old.log 2>&1; t "build old rc=$?"
cp build/benchmarks/bench_quant /tmp/bq_old && cp /tmp/keep_mcb.cuh kernels/quant/mx_col_block.cuh
F='^bf16_to_mxfp4_col(_blocks|_staged)?/[a-z_0-9]+/(16384|65536)x7168(/g32)?/|^copy/[0-9]{9,}B'
for i in 1 2; do
  for v in new old; do
    timeout 100 /tmp/bq_$v --h5 $R/bench_quant_${v}_$i.h5 --benchmark_filter="$F" > $R/bench_quant_${v}_$i.log 2>&1; t "bench $v $i rc=$?"
  done
done
M=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__inst_executed.sum,sm__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active
for v in new old; do
  for o in floor_rne floor_rne_h16 floor_rne_h32 floor_rne_rht; do
    timeout 40 /usr/local/cuda/bin/ncu -k regex:col_block_kernel -c 1 --metrics $M /tmp/bq_$v --benchmark_filter="^bf16_to_mxfp4_col/$o/65536x7168/min" > $R/ncu_${v}_$o.txt 2>&1; t "ncu $v $o rc=$?"
  done
done
sed -i "s#$PWD/##g; s#$OUT/r/##g" $R/*.log $R/*.txt 2>/dev/null
t done
cd $OUT && tar czf r.tgz r && rm -rf r
