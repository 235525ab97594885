#!/bin/bash
# run 3: the tree with the device-only split (GroupSplit.rows, GroupLinear without a host copy, the CUDA-graph test)
# and the quantizer encoder change: build all, every GPU test program, loss fingerprint, quantizer rows, Group Linear
set -u
R=$OUT/r; mkdir -p $R
T0=$(date +%s); t(){ echo "$(( $(date +%s)-T0 ))s $*" >> $R/summary.txt; }
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm --format=csv > $R/gpu.txt 2>&1
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > $R/configure.log 2>&1
cmake --build build -j 16 > $R/build.log 2>&1; t "build rc=$?"
grep -E "warning|error" $R/build.log | head -40 > $R/build_warnings.txt
timeout 120 build/tests/fp4moe_tests_gpu_gemm --gtest_filter='*DeviceOnlySplit*' > $R/device_only_split_tests.log 2>&1; t "device-only split tests rc=$?"
(cd build && timeout 330 ctest -L gpu -j 4 --timeout 320 --output-on-failure > $R/ctest_gpu.log 2>&1); t "gpu ctest rc=$?"
timeout 150 bash scripts/train_fingerprint.sh --out $R/fp > $R/fingerprint_run.log 2>&1; t "fingerprint rc=$?"
diff $R/fp/fingerprint.txt reports/results/h200/buffer-plans-20261202/fingerprint-bc90070.txt > $R/fingerprint.diff 2>&1; t "fingerprint diff rc=$?"
cp $R/fp/fingerprint.txt $R/fingerprint.txt 2>/dev/null; rm -rf $R/fp
F='^bf16_to_mxfp4_(row|col)/[a-z_0-9]+/(16384x7168|65536x7168)/|^copy/[0-9]{9,}B'
timeout 60 build/benchmarks/bench_quant --h5 $R/bench_quant.h5 --benchmark_filter="$F" > $R/bench_quant.log 2>&1; t "bench quant rc=$?"
timeout 60 build/benchmarks/bench_group_linear --h5 $R/bench_gl.h5 --benchmark_filter='^fwd[+]bwd' > $R/bench_gl.log 2>&1; t "bench gl rc=$?"
sed -i "s#$PWD/##g; s#$OUT/r/##g" $R/*.log $R/*.txt 2>/dev/null
t done
cd $OUT && tar czf r.tgz r && rm -rf r
