#!/usr/bin/env bash
# Loss deviation of the FP8 and MXFP4 recipes from BF16 (paper 1: +0.29% and +0.61% at equal tokens, DeepSeek-V3
# 671B after 160B tokens) on configs/small.toml: three `fp4moe train` runs with the same seed, so the same initial
# weights and the same data order, differing only in the recipe of the four layer classes:
#   bf16   attention, dense_mlp, shared_experts, routed_experts = bf16
#   fp8    all four fp8
#   mxfp4  paper 1's recipe, as configs/v3.toml's header describes: routed_experts mxfp4, the other three fp8
# Each run writes its own result file (`fp4moe train --out F` replaces F), merged into one (loss_deviation.py merge)
# with the runs under /train/bf16, /train/fp8, /train/mxfp4; then the deviation table (loss_deviation.py summary,
# reports/train_report.py deviation(): last validation loss against bf16's) and `reports/report.py` on the file.
#
# GPU budget: one H200 for about 5 minutes. The bf16 run takes 50 s for its 1000 steps (8.2M tokens at 275K
# tokens/s); the fp8 and mxfp4 runs are not timed on this shape yet (their quantization launches weigh more at
# hidden 768: allow up to twice that each); about 10 s of start-up per run. No checkpoints are written
# (train.checkpoint_interval 0); the result files take well under 1 MB.
#
#   scripts/runs/loss_deviation.sh [--out DIR] [--config FILE] [--steps N] [--seed S] [-- fp4moe train options]
#
#   --out DIR      where everything goes (created; default runs/loss-deviation-<UTC date-time>):
#                    <run>.h5, <run>.log      each run's result file and output
#                    loss_deviation.h5        the three runs in one file
#                    deviation.md             the deviation table (also printed)
#                    report/                  reports/report.py's TABLES.md and train_loss.png
#   --config FILE  default configs/small.toml (relative paths are taken from the repository root)
#   --steps N      train.steps of every run (default the config's; a shorter run gives a smoke test, not the number)
#   --seed S       train.seed of every run (default the config's)
#   -- ...         passed to every `fp4moe train` (e.g. --synthetic-data, --data DIR)
# Environment: BUILD (build folder, default build), PYTHON (an interpreter with h5py, numpy, pandas, matplotlib).
# A failed bf16 run stops the script (no baseline); a failed fp8 or mxfp4 run is reported, the others are merged,
# and the script exits non-zero.
set -uo pipefail

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }

root="$(cd "$(dirname "$0")/../.." && pwd)"
out="" config="configs/small.toml" steps="" seed=""
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out|--config|--steps|--seed)
      [[ $# -ge 2 && -n "$2" ]] || { echo "loss_deviation.sh: $1 needs a value" >&2; exit 2; }
      case "$1" in --out) out="$2" ;; --config) config="$2" ;; --steps) steps="$2" ;; --seed) seed="$2" ;; esac
      shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) usage; exit 0 ;;
    *) echo "loss_deviation.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done

cd "$root" || exit 2
build="${BUILD:-build}"
exe="$build/fp4moe"
[[ -x "$exe" ]] || { echo "loss_deviation.sh: $exe is not built (make build, or set BUILD)" >&2; exit 2; }
[[ -f "$config" ]] || { echo "loss_deviation.sh: no config file '$config'" >&2; exit 2; }
python="${PYTHON:-}"
if [[ -z "$python" ]]; then
  for p in python3 /usr/bin/python3; do
    if "$p" -c 'import h5py, numpy, pandas, matplotlib' 2>/dev/null; then python="$p"; break; fi
  done
fi
if [[ -z "$python" ]]; then
  echo "loss_deviation.sh: no python3 imports h5py, numpy, pandas and matplotlib (make setup)" >&2
  exit 2
fi
[[ -n "$out" ]] || out="runs/loss-deviation-$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$out" || { echo "loss_deviation.sh: cannot create $out" >&2; exit 2; }

# run name -> recipes of attention, dense_mlp, shared_experts, routed_experts
declare -A recipes=(
  [bf16]="bf16 bf16 bf16 bf16"
  [fp8]="fp8 fp8 fp8 fp8"
  [mxfp4]="fp8 fp8 fp8 mxfp4"
)
common=(--config "$config" --train.checkpoint_interval 0 --log-interval 50)
[[ -n "$steps" ]] && common+=(--train.steps "$steps")
[[ -n "$seed" ]] && common+=(--train.seed "$seed")

done_files=() failed=()
for run in bf16 fp8 mxfp4; do
  read -r attention dense shared routed <<<"${recipes[$run]}"
  echo "== $run: attention=$attention dense_mlp=$dense shared_experts=$shared routed_experts=$routed"
  start=$(date +%s)
  "$exe" train "${common[@]}" --out "$out/$run.h5" --run "$run" \
    --recipe.attention "$attention" --recipe.dense_mlp "$dense" \
    --recipe.shared_experts "$shared" --recipe.routed_experts "$routed" ${extra[@]+"${extra[@]}"} 2>&1 |
    tee "$out/$run.log"
  rc=${PIPESTATUS[0]}
  echo "== $run: exit $rc after $(( $(date +%s) - start )) s"
  if [[ $rc -eq 0 && -f "$out/$run.h5" ]]; then
    done_files+=("$out/$run.h5")
  else
    failed+=("$run")
    [[ $run == bf16 ]] && { echo "loss_deviation.sh: the bf16 baseline failed (see $out/bf16.log)" >&2; exit 1; }
  fi
done

merged="$out/loss_deviation.h5"
"$python" scripts/runs/loss_deviation.py merge "$merged" "${done_files[@]}" || exit 1
"$python" scripts/runs/loss_deviation.py summary "$merged" | tee "$out/deviation.md"
summary_rc=${PIPESTATUS[0]}
"$python" reports/report.py "$merged" --out "$out/report"
report_rc=$?

if [[ ${#failed[@]} -gt 0 ]]; then
  echo "loss_deviation.sh: failed runs: ${failed[*]} (see their logs in $out)" >&2
  exit 1
fi
[[ $summary_rc -eq 0 && $report_rc -eq 0 ]] || exit 1
echo "loss_deviation.sh: $merged, $out/deviation.md, $out/report/"
