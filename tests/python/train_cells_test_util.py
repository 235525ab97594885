"""Stand-ins for `fp4moe train` in the reproduction suite's tests: result files in the layout of
trainer/train/metrics.h written with h5py alone, the allocator's out-of-budget report as
trainer/memory/device_memory.cpp prints it, and a fake `fp4moe` program (env and train) that trains nothing but
answers like the real one.

The fake's behaviour is set by a JSON file named in FAKE_FP4MOE (see FAKE_DEFAULTS): a peak memory per cell from
the config, recipe and policy, "out of the memory budget" above --memory-budget, the dense-layer fp8 refusal of
today's trainer (refuse_dense_fp8), the token-shard check, and a line per call in the argv log.
"""

import json
import os
import sys
import textwrap

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import repro_test_util as util  # noqa: E402

CATEGORIES = ["weights", "grads", "optimizer", "activations", "comm", "workspace"]
H200_ENV = "GPU 0:        NVIDIA H200 (sm_90), 132 SMs, 139.8 GiB, L2 60.0 MiB\ndriver:       570.86.15 (CUDA 12.8)\n"


def budget_report(what, request_gib, category, held_gib, budget_gib):
    """The allocator's message (trainer/memory/device_memory.cpp DeviceMemory::allocate) as `fp4moe train` prints
    it on failure."""
    lines = [f"fp4moe train: failed: out of the memory budget: {what} needs {request_gib:.3f} GiB of {category} but "
             f"{held_gib:.3f} of {budget_gib:.3f} GiB are held"]
    for c in CATEGORIES:
        lines.append(f"  {c:<12} {1.0:9.3f} GiB now, {1.0:9.3f} GiB peak")
    lines.append(f"  {'total':<12} {held_gib:9.3f} GiB now, {held_gib:9.3f} GiB peak, budget {budget_gib:.3f} GiB")
    return "\n".join(lines)


def write_train_file(path, run, tokens_per_s, peaks_gib, losses=None, evals=(), tokens_per_step=4096,
                     dispatch=None, mfu_per_tps=1e-5, val_tokens=None, **root):
    """A result file of `fp4moe train`: /train/<run> (configuration attributes), its steps table (one row per
    tokens_per_s value), its eval table ([(step, val_loss)], with the column val_tokens when given: one value per
    evaluation), /memory/<run> (peaks_gib: {category or "total":
    GiB}) and, with dispatch = {"payload": x, "scales": y, "hidden": d}, the dispatch_* attributes."""
    n = len(tokens_per_s)
    losses = list(losses) if losses is not None else [10.0 - 0.1 * i for i in range(n)]
    with h5py.File(path, "w") as f:
        util.write_root(f, **root)
        g = f.create_group(f"/train/{run}")
        g.attrs.create("columns", [], dtype=util.STR)
        g.attrs.create("train.tokens_per_step", np.int64(tokens_per_step))
        g.attrs.create("model.name", "fake", dtype=util.STR)
        steps = list(range(1, n + 1))
        util.write_table(f, f"/train/{run}/steps", {
            "step": steps, "tokens": [s * tokens_per_step for s in steps], "loss": [float(x) for x in losses],
            "lr": [1e-3] * n, "grad_norm": [1.0] * n, "tokens_per_s": [float(t) for t in tokens_per_s],
            "mfu": [float(t) * mfu_per_tps for t in tokens_per_s],
            "peak_act_gib": [float(peaks_gib.get("activations", 0.0))] * n,
            "peak_total_gib": [float(peaks_gib.get("total", 0.0))] * n, "skipped": [0] * n})
        eval_table = {"step": [int(s) for s, _ in evals], "tokens": [int(s) * tokens_per_step for s, _ in evals],
                      "val_loss": [float(v) for _, v in evals]}
        if val_tokens is not None:
            eval_table["val_tokens"] = [int(v) for v in val_tokens]
        util.write_table(f, f"/train/{run}/eval", eval_table)
        cats = CATEGORIES + ["total"]
        attrs = {"budget_bytes": np.int64(0)}
        if dispatch:
            attrs.update({"dispatch_recipe": dispatch.get("recipe", "bf16"),
                          "dispatch_hidden": np.int64(dispatch["hidden"]), "dispatch_top_k": np.int64(8),
                          "dispatch_moe_layers": np.int64(1),
                          "dispatch_payload_bytes_per_token": float(dispatch["payload"]),
                          "dispatch_scale_bytes_per_token": float(dispatch["scales"]),
                          "dispatch_bytes_per_token": float(dispatch["payload"] + dispatch["scales"]),
                          "dispatch_bytes_per_step": 0.0})
        util.write_table(f, f"/memory/{run}", {
            "category": cats, "peak_bytes": [int(peaks_gib.get(c, 0.0) * 2**30) for c in cats],
            "peak_gib": [float(peaks_gib.get(c, 0.0)) for c in cats]}, attrs)


FAKE_DEFAULTS = {
    # weights, grads, optimizer (probe shapes: 2 GiB); v3_671b and v2_236b: one emulated GPU of the production runs
    "base_gib": {"v3": 70.0, "v2": 50.0, "v3_671b": 70.0, "v2_236b": 50.0, "small": 8.0},
    "act_gib": {"bf16": 12.0, "fp8": 11.0, "mxfp4": 7.0},  # by the routed experts' recipe
    "policy_factor": {"core_attn layernorm moe": 0.5, "mla_up_proj core_attn layernorm moe": 0.4,
                      "moe_act mla_up_proj": 0.8, "mla_up_proj": 1.0},
    "tokens_per_s": {"bf16": 1000.0, "fp8": 1200.0, "mxfp4": 1150.0},
    "light_speedup": 1.15,          # mla_up_proj over the heavier policies
    "val_loss": {"bf16": 4.80, "fp8": 4.82, "mxfp4": 4.85},
    "refuse_dense_fp8": False,      # today's trainer: Linear takes bf16 only
    "crash_recipes": [],            # routed recipes whose runs die without a message (exit 139)
    "seed_val_shift": {},           # --train.seed -> added to every recipe's validation loss
    "recipe_seed_shift": {},        # "<routed recipe> <seed>" -> added to that run's validation loss only
    "val_tokens": 65536,            # validation tokens of the final evaluation
    "argv_log": "",
}


def write_fake_fp4moe(path, config_path):
    """An executable `fp4moe` at `path` (env and train), configured by the JSON file config_path."""
    here = os.path.dirname(os.path.abspath(__file__))
    with open(path, "w") as f:
        f.write(f"#!{sys.executable}\n" + textwrap.dedent(f"""\
            import json, os, sys
            sys.path.insert(0, {here!r})
            import train_cells_test_util as t
            sys.exit(t.fake_main(sys.argv[1:], {config_path!r}))
            """))
    os.chmod(path, 0o755)


def _option(args, name, default=None):
    return args[args.index(name) + 1] if name in args else default


def _modules(args):
    if "--recompute.modules" not in args:
        return None
    out = []
    for a in args[args.index("--recompute.modules") + 1:]:
        if a.startswith("-"):
            break
        out.append(a)
    return " ".join(x for x in out if x != "none")


def fake_main(argv, config_path):
    cfg = dict(FAKE_DEFAULTS)
    with open(config_path) as f:
        cfg.update(json.load(f))
    if cfg["argv_log"]:
        with open(cfg["argv_log"], "a") as log:
            log.write(json.dumps(argv) + "\n")
    if argv[:1] == ["env"]:
        print(H200_ENV, end="")
        return 0
    if argv[:1] != ["train"]:
        return 2
    args = argv[1:]
    config = os.path.splitext(os.path.basename(_option(args, "--config")))[0]
    routed = _option(args, "--recipe.routed_experts", "bf16").split()[0]  # the preset of a "preset key=value" recipe
    dense = _option(args, "--recipe.attention", "bf16")
    if "--synthetic-data" not in args:
        data = _option(args, "--data", "data/cache/shards")
        if not os.path.exists(os.path.join(data, "train_000.bin")):
            print(f"fp4moe train: error: token shards: '{data}' is not a folder (run `make data` to make the "
                  f"shards)", file=sys.stderr)
            return 2
    if cfg["refuse_dense_fp8"] and dense != "bf16":
        print(f"fp4moe train: failed: Linear layers.0.attn.q_down: recipe {dense} is not built for dense linear "
              f"layers yet (only bf16); the routed experts take fp8 and mxfp4 through Group Linear", file=sys.stderr)
        return 1
    if routed in cfg["crash_recipes"]:
        print("Segmentation fault (core dumped)", file=sys.stderr)
        return 139
    probe = "--model.layers" in args and _option(args, "--model.layers") == "1"
    modules = _modules(args)
    factor = cfg["policy_factor"].get(modules, 1.2) if modules is not None else 1.2
    act = cfg["act_gib"][routed] * factor
    total = (2.0 if probe else cfg["base_gib"].get(config, 4.0)) + act
    budget = _option(args, "--memory-budget")
    if budget is not None and total > float(budget):
        print(budget_report("layers.3.moe experts fc1 output", 0.25, "activations", float(budget) - 0.1,
                            float(budget)), file=sys.stderr)
        return 1
    steps = int(_option(args, "--train.steps"))
    tps = cfg["tokens_per_s"][routed] * (cfg["light_speedup"] if modules == "mla_up_proj" else 1.0)
    for s in range(1, steps + 1):
        print(f"step {s}/{steps} | loss 5.0 | lr 1.00e-03 | {tps:.0f} tok/s", file=sys.stderr)
    hidden = {"v3": 7168, "v3_671b": 7168, "v2": 5120, "v2_236b": 5120}.get(config, 768)
    per = {"bf16": (2.0 * hidden, 0.0), "fp8": (float(hidden), 4.0 * hidden / 128),
           "mxfp4": (hidden / 2.0, hidden / 32.0)}[routed]
    seed = _option(args, "--train.seed", "config")
    val = (cfg["val_loss"][routed] + cfg["seed_val_shift"].get(seed, 0.0)
           + cfg["recipe_seed_shift"].get(f"{routed} {seed}", 0.0))
    write_train_file(_option(args, "--out"), _option(args, "--run"), [tps / 4] + [tps] * (steps - 1),
                     {"total": total, "activations": act, "weights": total - act, "grads": 0.0, "optimizer": 0.0},
                     losses=[val + 0.01] * steps, evals=[(steps, val)], val_tokens=[cfg["val_tokens"]],
                     dispatch={"recipe": routed, "payload": per[0], "scales": per[1], "hidden": hidden},
                     command="fp4moe train " + " ".join(args))
    return 0
