#!/bin/bash
# run 1: the grouped Wgrad kernel with its promotion overlapped with the next block's WGMMAs (Sm90WgradConfig): its
# GPU tests (the serial variant bit for bit), the Wgrad rows of bench_grouped_gemm (cuBLASLt, overlapped, serial),
# Nsight Compute on the overlapped kernel; then the BF16 v3_layer loss per step with and without train.cuda_graph
# and with the cuDNN attention backend (how far two summation orders drift in 12 steps).
set -u
R=$OUT/r; mkdir -p $R
T0=$(date +%s); t(){ echo "$(( $(date +%s)-T0 ))s $*" >> $R/summary.txt; }
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > $R/configure.log 2>&1
cmake --build build -j 16 --target bench_grouped_gemm fp4moe_tests_gpu_gemm fp4moe > $R/build.log 2>&1; t "build rc=$?"
FP4MOE_REQUIRE_GPU=1 timeout 120 build/tests/fp4moe_tests_gpu_gemm --gtest_filter='GroupedWgradSm90.*:SetmaxnregCheckGpu.*' > $R/wgrad_tests.log 2>&1; t "wgrad tests rc=$?"
timeout 120 build/benchmarks/bench_grouped_gemm --h5 $R/bench_gg.h5 --benchmark_filter='^wgrad/(fp8|fp8_sm90)/' > $R/bench_gg.log 2>&1; t "bench gg rc=$?"
timeout 60 /usr/local/cuda/bin/ncu -k regex:grouped_wgrad_sm90_kernel -c 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats build/benchmarks/bench_grouped_gemm --benchmark_filter='^wgrad/fp8_sm90/up 8x2048/' > $R/ncu_wgrad_8.txt 2>&1; t "ncu rc=$?"
mkdir -p $R/drift
for v in "eager false own" "graph true own" "cudnn false cudnn"; do set -- $v
  timeout 60 build/fp4moe train --config configs/v3_layer.toml --synthetic-data --run $1 --out $R/drift/$1.h5 --train.steps 12 --train.warmup_steps 2 --train.eval_interval 0 --train.checkpoint_interval 0 --train.checkpoint_dir "" --train.cuda_graph $2 --model.attention_backend $3 > $R/drift/$1.log 2>&1; t "drift $1 rc=$?"
done
python3 - $R/drift > $R/drift/losses.txt 2>&1 <<'PY'
import sys, h5py
d = sys.argv[1]
runs = {n: h5py.File(f"{d}/{n}.h5", "r")[f"train/{n}/steps/loss"][()] for n in ("eager", "graph", "cudnn")}
print("step eager graph cudnn graph-eager cudnn-eager")
for i in range(len(runs["eager"])):
    e, g, c = runs["eager"][i], runs["graph"][i], runs["cudnn"][i]
    print(i + 1, f"{e:.6f} {g:.6f} {c:.6f} {g - e:+.6f} {c - e:+.6f}")
PY
rm -f $R/drift/*.h5
sed -i "s#$PWD/##g; s#$OUT/r/##g" $R/*.log $R/*.txt $R/*/*.log $R/*/*.txt 2>/dev/null
t done
cd $OUT && tar czf r.tgz r && rm -rf r
