#!/usr/bin/env bash
# The trainer's losses bit for bit, to show that a change of structure changed no arithmetic: trains `tiny` and
# `small` on seeded synthetic tokens for every recipe (bf16, fp8, mxfp4 on every layer class) under several
# recompute policies and writes, per run, every step's loss and gradient norm as exact hexadecimal floats.
# Run it before and after a change on the same GPU and compare the two files with `diff`: any difference in
# any digit is a change in the arithmetic.
#
#   scripts/train_fingerprint.sh --out DIR [--steps N]
#
#   --out DIR    where the runs go (created): fingerprint.txt (one line per step: config recipe policy step
#                loss grad_norm, as float.hex()), train_<config>_<recipe>_<policy>.log, the HDF5 files
#   --steps N    optimizer steps per run (default 12)
# Environment: BUILD (build folder with fp4moe, default build), PYTHON (an interpreter with h5py; default the
# first of python3, /usr/bin/python3 that imports it). Needs a CUDA GPU.
set -uo pipefail

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }

out="" steps=12
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) [[ $# -ge 2 ]] || { echo "train_fingerprint.sh: --out needs a folder" >&2; exit 2; }; out="$2"; shift 2 ;;
    --steps) [[ $# -ge 2 && "$2" =~ ^[1-9][0-9]*$ ]] || { echo "train_fingerprint.sh: --steps needs a positive integer" >&2; exit 2; }
             steps="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "train_fingerprint.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
[[ -n "$out" ]] || { echo "train_fingerprint.sh: --out DIR is required" >&2; usage >&2; exit 2; }

script_name=train_fingerprint.sh
source "$(dirname "$0")/run_env.sh"  # root, build, python
mkdir -p "$out" || exit 2
: >"$out/fingerprint.txt"

# policy name -> recompute modules (the words of --recompute.modules)
declare -A policies=([none]=none [light]=mla_up_proj [heavy]="core_attn layernorm moe" [full]=full)
failed=0
for config in tiny small; do
  for recipe in bf16 fp8 mxfp4; do
    for policy in none light heavy full; do
      name="${config}_${recipe}_${policy}"
      h5="$out/train_${name}.h5"
      rm -f "$h5"
      "$build/fp4moe" train --config "$root/configs/$config.toml" --synthetic-data --run "$name" --out "$h5" \
        --train.steps "$steps" --train.warmup_steps 2 --train.eval_interval 0 --train.checkpoint_interval 0 --train.checkpoint_dir "" \
        --recipe.attention "$recipe" --recipe.dense_mlp "$recipe" --recipe.shared_experts "$recipe" \
        --recipe.routed_experts "$recipe" --recompute.modules ${policies[$policy]} \
        >"$out/train_${name}.log" 2>&1
      rc=$?
      if [[ $rc -ne 0 ]]; then
        echo "$config $recipe $policy FAILED (exit $rc; see train_${name}.log)" | tee -a "$out/fingerprint.txt"
        failed=1
        continue
      fi
      "$python" - "$h5" "$name" "$config $recipe $policy" >>"$out/fingerprint.txt" <<'EOF'
import sys
import h5py
path, run, label = sys.argv[1:4]
with h5py.File(path, "r") as f:
    t = f[f"train/{run}/steps"]
    for step, loss, gn in zip(t["step"][()], t["loss"][()], t["grad_norm"][()]):
        print(label, int(step), float(loss).hex(), float(gn).hex())
EOF
    done
  done
done
echo "train_fingerprint.sh: $(grep -vc FAILED "$out/fingerprint.txt") step lines in $out/fingerprint.txt"
exit $failed
