"""Summary of an Nsight Compute source page (CSV) of grouped_gemm_sm90_kernel: samples and stall reasons of the
consumer and producer regions (split at the producer's setmaxnreg.dec), and the producer's instructions per K block
(executions over the count of a once-per-block instruction)."""
import csv, collections, sys
rows = list(csv.reader(open(sys.argv[1])))
hdr = rows[1]; data = rows[2:]
H = {h: i for i, h in enumerate(hdr)}
reasons = [h for h in hdr if h.startswith('stall_') and 'Not Issued' not in h]
dec = [k for k, r in enumerate(data) if 'DEALLOC' in r[1]][0]
def region(a, b):
    tot = collections.Counter(); s = 0; e = 0
    for r in data[a:b]:
        s += int(r[H['Warp Stall Sampling (All Samples)']]); e += int(r[H['Instructions Executed']])
        for x in reasons: tot[x] += int(r[H[x]] or 0)
    return s, e, tot.most_common(6)
for name, (a, b) in (('consumer warps', (0, dec)), ('producer warps', (dec, len(data)))):
    s, e, top = region(a, b)
    print(f"{name}: {s} stall samples, {e} warp instructions executed; top stall reasons: " +
          ", ".join(f"{k[6:]} {v / s:.0%}" for k, v in top))
fence = [int(r[H['Instructions Executed']]) for r in data[dec:] if 'FENCE.VIEW.ASYNC' in r[1]][0]
per = sum(int(r[H['Instructions Executed']]) for r in data[dec:]
          if 0.2 * fence < int(r[H["Instructions Executed"]]) < 5 * fence) / fence
ops = collections.Counter()
for r in data[dec:]:
    e = int(r[H['Instructions Executed']])
    if 0.2 * fence < e < 5 * fence:
        op = r[1].strip().split()
        op = op[1] if op[0].startswith('@') else op[0]
        ops[op.split('.')[0]] += e / fence
print(f"producer: {per:.0f} instructions per warp and K block in its main loop (the once-per-block proxy fence ran "
      f"{fence} times); by opcode: " + ", ".join(f"{k} {v:.0f}" for k, v in ops.most_common(12)))
