#!/bin/bash
# run 1 (2026-12-03 afternoon): the RNE encoder with fewer integer/logic instructions. GPU quant tests; row and
# column quantizers against copy, new and old code interleaved (new, old, new, old); per-pipe counts; SASS opcodes
set -u
R=$OUT/r; mkdir -p $R
T0=$(date +%s); t(){ echo "$(( $(date +%s)-T0 ))s $*" >> $R/summary.txt; }
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm --format=csv > $R/gpu.txt 2>&1
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > $R/configure.log 2>&1
cmake --build build -j 16 --target bench_quant fp4moe_tests_gpu_quant > $R/build.log 2>&1; t "build new rc=$?"
cp build/benchmarks/bench_quant /tmp/bq_new
O=$(find build -name 'bf16_to_mxfp4_row.cu.o' | head -1); cp $O /tmp/row_new.o
timeout 300 build/tests/fp4moe_tests_gpu_quant > $R/gpu_quant_tests.log 2>&1; t "gpu quant tests rc=$?"
mkdir -p /tmp/keep && cp kernels/quant/mx_fast_codecs.h kernels/quant/mx_quant_device.cuh kernels/quant/bf16_to_mxfp4_row.cu /tmp/keep/
cp exp_old/mx_fast_codecs.h exp_old/mx_quant_device.cuh kernels/quant/; cp exp_old/bf16_to_mxfp4_row.cu kernels/quant/
cmake --build build -j 16 --target bench_quant > $R/build_old.log 2>&1; t "build old rc=$?"
cp build/benchmarks/bench_quant /tmp/bq_old; cp $O /tmp/row_old.o
cp /tmp/keep/* kernels/quant/
F='^bf16_to_mxfp4_(row|col)/[a-z_0-9]+/(16384x7168|65536x7168)/|^copy/[0-9]{9,}B'
for i in 1 2; do
  for v in new old; do
    timeout 100 /tmp/bq_$v --h5 $R/bench_quant_${v}_$i.h5 --benchmark_filter="$F" > $R/bench_quant_${v}_$i.log 2>&1; t "bench $v $i rc=$?"
  done
done
M=sm__inst_executed.sum,sm__inst_executed_pipe_alu.sum,sm__inst_executed_pipe_fma.sum,sm__inst_executed_pipe_fmaheavy.sum,sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fmaheavy.avg.pct_of_peak_sustained_active,sm__issue_active.avg.pct_of_peak_sustained_active,gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed
for v in new old; do
  for o in floor_rne floor_rne_h16 floor_rne_rht floor_sr; do
    timeout 40 /usr/local/cuda/bin/ncu -k regex:row_block_kernel -c 1 --metrics $M /tmp/bq_$v --benchmark_filter="^bf16_to_mxfp4_row/$o/65536x7168/" > $R/ncu_${v}_$o.txt 2>&1; t "ncu $v $o rc=$?"
  done
done
for v in new old; do
/usr/local/cuda/bin/cuobjdump -sass /tmp/row_$v.o > /tmp/row_$v.sass 2>&1
python3 - /tmp/row_$v.sass > $R/row_opcodes_$v.txt <<'PY'
import re, sys, collections
text = open(sys.argv[1]).read().split("Function : ")
for part in text[1:]:
    name = part.split("\n", 1)[0].strip()
    if "row_block_kernel" not in name: continue
    ops = collections.Counter()
    for line in part.split("\n"):
        m = re.match(r"\s+/\*[0-9a-f]{4}\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)", line)
        if m: ops[m.group(2).split(".")[0]] += 1
    m = re.search(r"RoundingE(\d)ELNS_17HadamardTransformE(\d)", name)
    print("rounding %s transform %s total %d" % (m.group(1), m.group(2), sum(ops.values())))
    print("  " + "  ".join("%s %d" % kv for kv in ops.most_common(40)))
PY
done
t "sass done"
sed -i "s#$PWD/##g; s#$OUT/r/##g" $R/*.log $R/*.txt 2>/dev/null
t done
cd $OUT && tar czf r.tgz r && rm -rf r
