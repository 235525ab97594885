#!/bin/bash
# run 4 (source at 9622dab, main): opcode mix (SASS, static; the 5.8 MB listing itself not kept) and per-pipe issue (Nsight Compute) of the row quantizer's kernels
set -u
R=$OUT/r; mkdir -p $R
T0=$(date +%s); t(){ echo "$(( $(date +%s)-T0 ))s $*" >> $R/summary.txt; }
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > $R/configure.log 2>&1
cmake --build build -j 16 --target bench_quant > $R/build.log 2>&1; t "build rc=$?"
O=$(find build -name 'bf16_to_mxfp4_row.cu.o' | head -1)
/usr/local/cuda/bin/cuobjdump -sass $O > $R/row_sass.txt 2>&1; t "sass rc=$?"
python3 - "$R/row_sass.txt" > $R/row_opcodes.txt <<'PY'
import re, sys, collections
text = open(sys.argv[1]).read().split("Function : ")
for part in text[1:]:
    name = part.split("\n", 1)[0].strip()
    if "row_block_kernel" not in name: continue
    ops = collections.Counter()
    for line in part.split("\n"):
        m = re.match(r"\s+/\*[0-9a-f]{4}\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)", line)
        if m: ops[m.group(2).split(".")[0]] += 1
    tot = sum(ops.values())
    print(name[:160]); print("  total", tot)
    for op, n in ops.most_common(40): print("  %-10s %5d" % (op, n))
PY
t "opcodes rc=$?"
M=sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fmaheavy.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fp16.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_uniform.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_alu.sum,sm__inst_executed_pipe_fma.sum,sm__inst_executed_pipe_fmaheavy.sum,sm__inst_executed_pipe_fp16.sum,sm__inst_executed.sum,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_fmaheavy_cycles_active.avg.pct_of_peak_sustained_active
for v in floor_rne floor_rne_h16 floor_rne_rht floor_sr; do
  timeout 40 /usr/local/cuda/bin/ncu -k regex:row_block_kernel -c 1 --metrics $M build/benchmarks/bench_quant --benchmark_filter="^bf16_to_mxfp4_row/$v/65536x7168/" > $R/ncu_pipes_$v.txt 2>&1; t "ncu $v rc=$?"
done
sed -i "s#$PWD/##g; s#$OUT/r/##g" $R/*.log $R/*.txt 2>/dev/null
t done
cd $OUT && tar czf r.tgz r && rm -rf r
