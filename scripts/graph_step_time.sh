#!/usr/bin/env bash
# Training tokens/s with and without train.cuda_graph (trainer/train/step_graph.h), in the same run: for each
# configuration and recipe (every layer class in it), runs of seeded synthetic tokens alternate eager, graph, eager,
# graph, ... (--repeats pairs), and each run's tokens/s is the median over its steps after the first five (the graph
# is captured at step 2). Prints and writes one line per configuration and recipe: the eager and graph medians of
# the runs' tokens/s, their ratio, each mode's lowest and highest run, and the first step's loss of both (the same
# weights and batch: equal within the expert GEMMs' summation order).
#
#   scripts/graph_step_time.sh --out DIR [--steps N] [--repeats R] [--configs "tiny small"] [--recipes "bf16 fp8"]
#
#   --out DIR       where the runs go (created): step_time.csv, train_<config>_<recipe>_<mode>_<r>.{h5,log}
#   --steps N       optimizer steps per run (default 40, at least 10)
#   --repeats R     eager/graph pairs per configuration and recipe (default 2)
#   --configs LIST  presets of configs/ (default "tiny small dense_small")
#   --recipes LIST  recipes on every layer class (default "bf16 fp8 mxfp4")
# Environment: BUILD (build folder with fp4moe, default build), PYTHON (an interpreter with h5py; default the first
# of python3, /usr/bin/python3 that imports it). Needs a CUDA GPU.
set -uo pipefail

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
die() { echo "graph_step_time.sh: $*" >&2; exit 2; }

out="" steps=40 repeats=2 configs="tiny small dense_small" recipes="bf16 fp8 mxfp4"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) [[ $# -ge 2 ]] || die "--out needs a folder"; out="$2"; shift 2 ;;
    --steps) [[ $# -ge 2 && "$2" =~ ^[1-9][0-9]*$ && "$2" -ge 10 ]] || die "--steps needs an integer >= 10"
             steps="$2"; shift 2 ;;
    --repeats) [[ $# -ge 2 && "$2" =~ ^[1-9][0-9]*$ ]] || die "--repeats needs a positive integer"
               repeats="$2"; shift 2 ;;
    --configs) [[ $# -ge 2 && -n "$2" ]] || die "--configs needs preset names"; configs="$2"; shift 2 ;;
    --recipes) [[ $# -ge 2 && -n "$2" ]] || die "--recipes needs recipe names"; recipes="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "graph_step_time.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
[[ -n "$out" ]] || { echo "graph_step_time.sh: --out DIR is required" >&2; usage >&2; exit 2; }

script_name=graph_step_time.sh
source "$(dirname "$0")/run_env.sh"  # root, build, python
for config in $configs; do
  [[ -f "$root/configs/$config.toml" ]] || die "no preset configs/$config.toml"
done
mkdir -p "$out" || exit 2

failed=0
runs=()  # "config recipe mode h5 run" per finished run
for config in $configs; do
  for recipe in $recipes; do
    for ((r = 1; r <= repeats; ++r)); do
      for mode in eager graph; do
        name="${config}_${recipe// /_}_${mode}_${r}"
        h5="$out/train_${name}.h5"
        rm -f "$h5"
        "$build/fp4moe" train --config "$root/configs/$config.toml" --synthetic-data --run "$name" --out "$h5" \
          --train.steps "$steps" --train.warmup_steps 2 --train.eval_interval 0 --train.checkpoint_interval 0 \
          --train.checkpoint_dir "" --train.cuda_graph "$([[ $mode == graph ]] && echo true || echo false)" \
          --recipe.attention "$recipe" --recipe.dense_mlp "$recipe" --recipe.shared_experts "$recipe" \
          --recipe.routed_experts "$recipe" >"$out/train_${name}.log" 2>&1
        rc=$?
        if [[ $rc -ne 0 ]]; then
          echo "$config $recipe $mode $r FAILED (exit $rc; see train_${name}.log)" >&2
          failed=1
          continue
        fi
        runs+=("$config|$recipe|$mode|$h5|$name")
      done
    done
  done
done

"$python" - "$out/step_time.csv" "${runs[@]}" <<'EOF'
import statistics
import sys

import h5py

csv_path, runs = sys.argv[1], sys.argv[2:]
by_cell = {}
for entry in runs:
    config, recipe, mode, path, run = entry.split("|")
    with h5py.File(path, "r") as f:
        t = f[f"train/{run}/steps"]
        tps = [float(x) for x in t["tokens_per_s"][()]][5:]  # after the first five steps (capture at step 2)
        loss1 = float(t["loss"][0])
    cell = by_cell.setdefault((config, recipe), {"eager": [], "graph": [], "loss1": {}})
    cell[mode].append(statistics.median(tps))
    cell["loss1"][mode] = loss1
lines = ["config,recipe,eager_tokens_per_s,graph_tokens_per_s,graph_over_eager,runs_per_mode,"
         "eager_min,eager_max,graph_min,graph_max,eager_step1_loss,graph_step1_loss"]
for (config, recipe), c in by_cell.items():
    if not c["eager"] or not c["graph"]:
        continue
    e, g = statistics.median(c["eager"]), statistics.median(c["graph"])
    lines.append(f"{config},{recipe},{e:.0f},{g:.0f},{g / e:.3f},{min(len(c['eager']), len(c['graph']))},"
                 f"{min(c['eager']):.0f},{max(c['eager']):.0f},{min(c['graph']):.0f},{max(c['graph']):.0f},"
                 f"{c['loss1'].get('eager', float('nan')):.6f},{c['loss1'].get('graph', float('nan')):.6f}")
with open(csv_path, "w") as f:
    f.write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
exit $failed
