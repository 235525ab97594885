"""The reproduction suite's training scenarios without a GPU (repro/scenario.py kind = "train", repro/train_cells.py):
the four scenario files parse, name their paper rows with sources and fit the suite's budget; the cells' command
lines (checked against the built `fp4moe train --dry-run` when it is built), steps per scale and shared runs;
out-of-memory and refusal messages read from the logs (the allocator's format taken from
trainer/memory/device_memory.cpp); the readers on result files made here; the rules on cells tables; repro/run.py
end to end with a fake `fp4moe` (OOM at the 80 GiB budget and the retry without it, runs shared between scenarios,
today's refusals, a crash); the merged run file and the report's tables and plots."""

import json
import math
import os
import re
import subprocess
import sys
import unittest

import h5py

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, ROOT)

import repro_test_util as util  # noqa: E402
import train_cells_test_util as fake  # noqa: E402
from reports import cells_report, report, result_file  # noqa: E402
from repro import ladder_metric, merge, ours, process, scenario, train_cells  # noqa: E402

SCENARIOS = os.path.join(ROOT, "repro", "scenarios")
RUN_PY = os.path.join(ROOT, "repro", "run.py")
BUILD = os.environ.get("FP4MOE_BUILD", os.path.join(ROOT, "build"))
TRAIN = ["loss_deviation", "memory_per_policy", "mxfp4_ladder", "step_breakdown", "throughput_per_policy"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def load(name):
    return scenario.load(os.path.join(SCENARIOS, f"{name}.toml"))


def row_named(rows, start):
    (r,) = [r for r in rows if r["row"].startswith(start)]
    return r


PRESET_FIELDS = {"bf16": ("bf16", "bf16", "bf16", "bf16"), "fp8": ("fp8", "fp8", "fp8", "bf16"),
                 "mxfp4": ("fp8", "fp8", "fp8", "mxfp4")}


def recipe_text(option):
    """How the trainer's dry run names a recipe option (trainer/model/recipe.h recipe_name): a preset by its name,
    "preset key=value ..." by its six fields."""
    preset, *overrides = option.split()
    if not overrides:
        return preset
    fields = dict(zip(("fprop", "dgrad", "wgrad", "input"), PRESET_FIELDS[preset]), rounding="rne", transform="none")
    fields.update(o.split("=", 1) for o in overrides)
    return " ".join(f"{k}={fields[k]}" for k in ("fprop", "dgrad", "wgrad", "input", "rounding", "transform"))


def fake_outcome(cell, status="ok", budget=80.0, **metrics):
    """An Outcome with plausible metrics (peaks from the recipe and policy, as the fake trainer makes them; the
    ladder's arms as fp8)."""
    recipe = cell.recipe if cell.recipe in PRESET_FIELDS else "fp8"
    act = {"bf16": 12.0, "fp8": 11.0, "mxfp4": 7.0}[recipe] * {"attn_ln_experts": 0.5}.get(cell.policy, 1.0)
    m = {"peak_total_gib": 60.0 + act, "peak_act_gib": act, "tokens_per_s": {"bf16": 1000.0, "fp8": 1200.0,
                                                                              "mxfp4": 1150.0}[recipe],
         "mfu": 0.2, "val_tokens": 65536.0, "val_loss": {"bf16": 4.8, "fp8": 4.81, "mxfp4": 4.83}[recipe],
         "train_loss": {"bf16": 4.9, "fp8": 4.92, "mxfp4": 4.95}[recipe],
         "dispatch_bytes": {"bf16": 2.0, "fp8": 1.03125, "mxfp4": 0.53125}[recipe] * 7168,
         "dispatch_scale_bytes": {"bf16": 0.0, "fp8": 224.0, "mxfp4": 224.0}[recipe],
         # evaluations at 1, 2 and 3 (T = 2): an arm 0.1 above the baseline reaches its loss at 2 after T
         "eval_curve": ladder_metric.format_curve([1000, 2000, 3000],
                                                  [5.0, 4.0 + (cell.recipe != "fp8") * 0.1, 3.0])}
    m.update(metrics)
    return train_cells.Outcome(status=status, exit_code=0 if status == "ok" else 1, elapsed_s=1.0,
                               run=train_cells.run_name(cell), out_path="x.h5", budget_gib=budget, metrics=m)


def cells_frame(s, scale, outcome=fake_outcome):
    spec = s.train
    rows = [train_cells.table_row(c, outcome(c), spec, spec.steps[scale]) for c in train_cells.expand(s, scale)]
    return train_cells.table_frame(rows), rows


Tmp = util.Tmp


# ---- the scenario files ---------------------------------------------------------------------------------------------

class TrainScenarioFiles(Tmp):
    def test_the_training_scenarios_parse_and_fit_the_suite_budget(self):
        scns = {s.name: s for s in scenario.load_all(SCENARIOS) if s.kind == "train"}
        self.assertEqual(sorted(scns), TRAIN)
        self.assertEqual(len({s.family for s in scns.values()}), len(scns))
        self.assertEqual({s.name: s.plot for s in scns.values()},
                         {"loss_deviation": "loss", "memory_per_policy": "memory",
                          "mxfp4_ladder": "loss", "step_breakdown": "", "throughput_per_policy": "throughput"})
        for s in scns.values():
            with self.subTest(s.name):
                b = s.budget_gpu_minutes
                self.assertLessEqual(b["smoke"], b["default"])
                self.assertLessEqual(b["default"], b["full"])
                for scale in scenario.SCALES:
                    self.assertTrue(train_cells.expand(s, scale), scale)
                for r in s.rows:
                    self.assertTrue(r.paper_source.strip())
                    if not r.paper:
                        self.assertTrue(r.paper_source.startswith("none:"), r.row)
        # With the kernel scenarios' measured 1.6 minutes on the H200 (reports/results/h200/README.md): default
        # <= 36 minutes (the two convergence studies, loss_deviation and mxfp4_ladder, 15 each), smoke <= 5.
        self.assertLessEqual(sum(s.budget_gpu_minutes["default"] for s in scns.values()), 34.0)
        self.assertLessEqual(sum(s.budget_gpu_minutes["smoke"] for s in scns.values()), 5.0)

    def test_paper_values_and_sources(self):
        expect = {
            "memory_per_policy": ["68.29%", "74.20%", "59.40%", "-14.8%", "11.0", "68.29%", "74.20%", "59.40%", "11.0",
                                  "OOM", "OOM", "70.11%", "7-11", "7-11", "6.9-7.2"],
            "throughput_per_policy": ["1.125", "1.125", "0.999", "0.970", "1.126", "1157", "1302", "OOM", "OOM"],
            "loss_deviation": ["+0.29%", "+0.61%"],
        }
        ladder = ["8-9", "10-11", "26-27", "diverged", "not converged", "8-9"]
        self.assertEqual([r.paper for r in load("mxfp4_ladder").rows if r.paper],
                         (ladder + ["1.20"]) * 2)
        for r in load("mxfp4_ladder").rows:
            self.assertTrue(r.paper_source.startswith("P2" if r.paper else "none:"), r.row)
        secondary = {"68.29%", "74.20%", "59.40%", "70.11%", "OOM", "6.9-7.2", "0.999", "0.970", "1.126"}
        for name, papers in expect.items():
            s = load(name)
            self.assertEqual([r.paper for r in s.rows if r.paper], papers, name)
            for r in s.rows:
                if not r.paper:
                    continue
                self.assertTrue(r.paper_source.startswith("P1"), r.row)
                self.assertEqual(r.paper_source.startswith("P1, secondary summary (not checked against the paper)"),
                                 r.paper in secondary, r.row)
        self.assertAlmostEqual(scenario.paper_value("-14.8%"), -14.8)
        self.assertAlmostEqual(scenario.paper_value("+0.61%"), 0.61)
        self.assertEqual(scenario.paper_value("<0.5"), 0.5)
        self.assertTrue(math.isnan(scenario.paper_value("OOM")))
        self.assertTrue(math.isnan(scenario.paper_value("-3")))

    def test_throughput_runs_the_memory_cells_at_stage_12(self):
        # The same emulated GPU, recipe and policy as a memory cell, at pipeline stage 12 (4 micro-batches in flight:
        # every cell fits the H200) over 8 micro-batches per step; the smoke cells are the same one-GPU runs.
        mem, thr = load("memory_per_policy"), load("throughput_per_policy")
        for scale in scenario.SCALES:
            by_id = {(c.config, c.recipe, c.policy): c for c in train_cells.expand(mem, scale)}
            for c in train_cells.expand(thr, scale):
                m = by_id[(c.config, c.recipe, c.policy)]
                self.assertEqual((c.config_path, c.modules), (m.config_path, m.modules), f"{scale} {c.id}")
                if scale == "smoke":
                    self.assertEqual(c.options, m.options)
                    continue
                self.assertEqual(c.options[c.options.index("--parallel.stage") + 1], "12")
                self.assertEqual(c.options[c.options.index("--parallel.micro_batches") + 1], "8")
                self.assertEqual(m.options[m.options.index("--parallel.micro_batches") + 1], "16")
                self.assertNotIn("--parallel.stage", m.options)  # the largest stage

    def test_every_row_computes_from_a_full_cells_table(self):
        # Every row at the full scale; at default every row but the ladder's MoE arms (`small` runs at full only).
        for name in TRAIN:
            s = load(name)
            for scale in ("default", "full"):
                df, _ = cells_frame(s, scale)
                for r in ours.repro_rows(s, df):
                    if name == "mxfp4_ladder" and scale == "default" and r["row"].startswith("small: "):
                        self.assertIn("not measured at this scale", r["note"])
                        continue
                    with self.subTest(name=name, scale=scale, row=r["row"]):
                        self.assertTrue(math.isfinite(r["ours"]), r["note"])
                        self.assertNotIn("not computed", r["note"])

    def test_memory_and_throughput_rows_compute_what_they_say(self):
        mem = load("memory_per_policy")
        df, cells = cells_frame(mem, "default")
        rows = ours.repro_rows(mem, df)

        def cell(shape, case, recipe):
            (c,) = [c for c in cells if (c["shape"], c["case"], c["recipe"]) == (shape, case, recipe)]
            return c
        heavy = {r: cell("v3", "attn_ln_experts", r) for r in ("bf16", "fp8", "mxfp4")}
        self.assertAlmostEqual(row_named(rows, "V3, recompute attention+layernorm+experts: bf16 peak")["ours"],
                               heavy["bf16"]["peak_total_gib"] / 80 * 100)
        points = row_named(rows, "V3, recompute attention+layernorm+experts: peak memory, mxfp4 minus fp8")
        self.assertAlmostEqual(points["ours"], (heavy["mxfp4"]["peak_total_gib"] - heavy["fp8"]["peak_total_gib"])
                               / 80 * 100)
        self.assertAlmostEqual(points["ratio"], points["ours"] / -14.8)
        saved = row_named(rows, "V2, recompute attention+layernorm+experts: peak memory saved by mxfp4 against fp8")
        v2 = {r: cell("v2", "attn_ln_experts", r)["peak_total_gib"] for r in ("fp8", "mxfp4")}
        self.assertAlmostEqual(saved["ours"], (1 - v2["mxfp4"] / v2["fp8"]) * 100)
        self.assertAlmostEqual(saved["ratio"], saved["ours"] / 9.0)
        absolute = row_named(rows, "V3, recompute attention+layernorm+experts: fp8 peak memory")
        self.assertTrue(math.isnan(absolute["ratio"]))  # comparable = false
        self.assertIn("no ratio", absolute["note"])

        thr = load("throughput_per_policy")
        rows = ours.repro_rows(thr, cells_frame(thr, "default")[0])
        headline = row_named(rows, "V3: mxfp4 recomputing MLA up-projection only over fp8 recomputing attention+")
        self.assertAlmostEqual(headline["ours"], 1150.0 / 1200.0)
        self.assertAlmostEqual(headline["ratio"], headline["ours"] / 1.125)
        mla = row_named(rows, "V3: mxfp4 recomputing MLA up-projection only over fp8 recomputing attention (whole MLA)")
        self.assertAlmostEqual(mla["ours"], 1150.0 / 1200.0)

    def test_loss_rows_are_relative_deviations(self):
        s = load("loss_deviation")
        rows = ours.repro_rows(s, cells_frame(s, "default")[0])
        fp8 = row_named(rows, "fp8 against bf16: final validation loss")
        self.assertAlmostEqual(fp8["ours"], (4.81 / 4.8 - 1) * 100)
        self.assertAlmostEqual(fp8["ratio"], fp8["ours"] / 0.29)
        self.assertAlmostEqual(row_named(rows, "mxfp4 against bf16: final training")["ours"], (4.95 / 4.9 - 1) * 100)

    def test_cells_that_did_not_run_explain_the_rows(self):
        s = load("memory_per_policy")

        def pick(cell):
            if cell.recipe != "bf16":
                return train_cells.Outcome(status="not run", exit_code=1, elapsed_s=0.1, run="r",
                                           note="not run: Linear q_down: recipe fp8 is not built yet")
            o = fake_outcome(cell, status="oom" if cell.policy == "mla_up_proj" else "ok")
            if o.status == "oom":
                o.note = ("OOM at 80 GiB: activations did not fit; peaks, throughput and losses measured without the "
                          "budget")
                o.oom = {"category": "activations", "request_gib": 0.25, "held_gib": 79.9}
            return o
        df, cells = cells_frame(s, "default", pick)
        rows = ours.repro_rows(s, df)
        oom = row_named(rows, "V3, recompute MLA up-projection only: bf16 peak memory")
        self.assertTrue(math.isnan(oom["ours"]))
        self.assertIn("bf16 mla_up_proj v3: OOM at 80 GiB: activations did not fit", oom["note"])
        self.assertNotIn("not measured at this scale", oom["note"])
        refused = row_named(rows, "V3, recompute attention+layernorm+experts: peak memory, mxfp4 minus fp8")
        # Cells with the same note share one entry.
        self.assertIn("mxfp4 attn_ln_experts v3, fp8 attn_ln_experts v3: not run: Linear q_down", refused["note"])
        (bf16_oom,) = [c for c in cells if c["recipe"] == "bf16" and c["case"] == "mla_up_proj" and c["shape"] == "v3"]
        self.assertEqual(bf16_oom["oom_category"], "activations")
        self.assertTrue(math.isnan(bf16_oom["pct_of_80_gib"]))
        self.assertAlmostEqual(bf16_oom["pct_of_141_gib"], bf16_oom["peak_total_gib"] / 141 * 100)

    GOOD = """
        title = "t"
        kind = "train"
        family = "train_x"
        [budget_gpu_minutes]
        smoke = 1
        default = 2
        full = 2
        [steps]
        smoke = 1
        default = 2
        full = 2
        [train]
        data = "synthetic"
        [configs]
        tiny = "configs/tiny.toml"
        [recipes]
        bf16 = ["--recipe.routed_experts", "bf16"]
        [policies]
        none = []
        [[cells]]
        configs = ["tiny"]
        recipes = ["bf16"]
        policies = ["none"]
        scales = ["smoke", "default", "full"]
        [[rows]]
        row = "r"
        paper = ""
        paper_source = "none: x"
        unit = "x"
        [rows.ours]
        aggregate = "single"
        column = "tokens_per_s"
        where = { recipe = "bf16" }
        """

    def test_bad_training_scenarios_are_rejected_with_the_reason(self):
        s = scenario.load(self.write_toml(self.GOOD))
        self.assertEqual(s.kind, "train")
        self.assertEqual(s.train.policies, {"none": []})
        cases = [
            (self.GOOD.replace('kind = "train"', 'kind = "bake"'), "'kind' must be one of"),
            (self.GOOD.replace("smoke = 1\n        default = 2\n        full = 2\n        [train]",
                               "smoke = 0\n        default = 2\n        full = 2\n        [train]"), "[steps]"),
            (self.GOOD.replace('"configs/tiny.toml"', '"configs/nothing.toml"'), "does not exist"),
            (self.GOOD.replace('"configs/tiny.toml"', '"/etc/passwd"'), "configs/<name>.toml"),
            (self.GOOD.replace('recipes = ["bf16"]', 'recipes = ["fp4"]'), "unknown fp4"),
            (self.GOOD.replace('["--recipe.routed_experts", "bf16"]', '["--memory-budget", "10"]'),
             "sets --memory-budget"),
            (self.GOOD.replace('scales = ["smoke", "default", "full"]', 'scales = ["default", "full"]'),
             "no [[cells]] entry runs at scale smoke"),
            (self.GOOD.replace('data = "synthetic"', 'data = "web"'), "data must be one of"),
            (self.GOOD.replace('kind = "train"', 'kind = "train"\nbenchmark = "bench_x"'), "'benchmark' belongs"),
            (self.GOOD.replace('aggregate = "single"', 'aggregate = "single"\ncombine = "sum"'), "combine"),
            (self.GOOD.replace('none = []', 'config = []'), "not 'config'"),
        ]
        for text, message in cases:
            with self.subTest(message):
                with self.assertRaises(scenario.ScenarioError) as cm:
                    scenario.load(self.write_toml(text))
                self.assertIn("bad.toml", str(cm.exception))
                self.assertIn(message, str(cm.exception))


# ---- the cells' command lines ---------------------------------------------------------------------------------------

class CellCommandLines(unittest.TestCase):
    def cell(self, name, scale, config, recipe, policy):
        s = load(name)
        (c,) = [c for c in train_cells.expand(s, scale)
                if (c.config, c.recipe, c.policy, c.seed) == (config, recipe, policy, s.train.seeds[scale][0])]
        return s, c

    def test_a_memory_cell(self):
        s, c = self.cell("memory_per_policy", "default", "v3", "mxfp4", "mla_up_proj")
        self.assertEqual(train_cells.cell_args(c, s.train, 5), [
            "--config", "configs/v3_671b.toml", "--train.steps", "5", "--log-interval", "1", "--synthetic-data",
            "--memory-budget", "80", "--train.warmup_steps", "0", "--train.eval_interval", "0",
            "--train.checkpoint_interval", "0", "--recipe.attention", "fp8", "--recipe.dense_mlp", "fp8",
            "--recipe.shared_experts", "fp8", "--recipe.routed_experts", "mxfp4", "--parallel.micro_batches", "16",
            "--train.grad_accum", "16", "--recompute.modules", "mla_up_proj"])
        self.assertEqual(train_cells.run_name(c), "memory_per_policy-v3-mxfp4-mla_up_proj")
        heavy = self.cell("memory_per_policy", "default", "v3", "bf16", "attn_ln_experts")[1]
        args = train_cells.cell_args(heavy, s.train, 5)
        self.assertEqual(args[-4:], ["--recompute.modules", "core_attn", "layernorm", "moe"])  # last: CLI11 vector
        no_budget = train_cells.cell_args(heavy, s.train, 5, budget_gib=0)
        self.assertNotIn("--memory-budget", no_budget)
        self.assertEqual(len(no_budget), len(args) - 2)

    def test_empty_and_config_policies(self):
        s = scenario.load(os.path.join(SCENARIOS, "loss_deviation.toml"))
        c = train_cells.expand(s, "smoke")[0]
        self.assertEqual(c.policy, "config")
        self.assertNotIn("--recompute.modules", train_cells.cell_args(c, s.train, 1))
        empty = train_cells.Cell("x", "v3", "configs/v3.toml", "v3", "bf16", "none", [], modules=[])
        self.assertEqual(train_cells.cell_args(empty, s.train, 1)[-2:], ["--recompute.modules", "none"])

    def test_loss_cells_read_the_shards(self):
        s, c = self.cell("loss_deviation", "default", "small", "fp8", "config")
        args = train_cells.cell_args(c, s.train, 1000, data_dir="/data/shards")
        self.assertNotIn("--synthetic-data", args)
        self.assertNotIn("--memory-budget", args)
        self.assertEqual(args[args.index("--data") + 1], "/data/shards")
        self.assertEqual(args[args.index("--log-interval") + 1], "100")
        self.assertNotIn("--data", train_cells.cell_args(c, s.train, 1000))

    def test_steps_per_scale(self):
        self.assertEqual(load("loss_deviation").train.steps, {"smoke": 60, "default": 1000, "full": 1000})
        self.assertEqual(load("memory_per_policy").train.steps["default"], 2)
        for name in TRAIN:
            s = load(name)
            for scale in scenario.SCALES:
                n = s.train.steps[scale]
                for c in train_cells.expand(s, scale):
                    args = train_cells.cell_args(c, s.train, n)
                    self.assertEqual(args[args.index("--train.steps") + 1], str(n))
                    self.assertEqual(args[args.index("--log-interval") + 1], str(max(1, n // 10)))
        mem = load("memory_per_policy")
        self.assertEqual(len(train_cells.expand(mem, "smoke")), 2)
        self.assertEqual(len(train_cells.expand(mem, "default")), 15)
        self.assertEqual(len(train_cells.expand(mem, "full")), 21)
        smoke = train_cells.expand(mem, "smoke")[0]
        self.assertIn("smoke: one V3-shaped MoE layer", smoke.note)

    def test_cache_key_is_the_command_line(self):
        s, c = self.cell("memory_per_policy", "default", "v3", "bf16", "mla_up_proj")
        other = train_cells.Cell("throughput_per_policy", c.config, c.config_path, c.label, c.recipe, c.policy,
                                 list(c.options), list(c.modules))
        self.assertEqual(train_cells.cache_key(c, s.train, 5), train_cells.cache_key(other, s.train, 5))
        self.assertNotEqual(train_cells.cache_key(c, s.train, 5), train_cells.cache_key(c, s.train, 6))

    def test_every_cell_parses_with_the_trainer(self):
        fp4moe = os.path.join(BUILD, "fp4moe")
        if not os.access(fp4moe, os.X_OK):
            self.skipTest(f"{fp4moe} is not built (set FP4MOE_BUILD to the build folder)")
        seen = set()
        for name in TRAIN:
            s = load(name)
            for scale in scenario.SCALES:
                for c in train_cells.expand(s, scale):
                    args = train_cells.cell_args(c, s.train, s.train.steps[scale])
                    if tuple(args) in seen:
                        continue
                    seen.add(tuple(args))
                    extra = ["--no-data-check"] if s.train.data == "shards" else []
                    r = subprocess.run([fp4moe, "train"] + args + ["--dry-run"] + extra, capture_output=True,
                                       text=True, timeout=60, cwd=ROOT)
                    with self.subTest(name=name, scale=scale, cell=c.id):
                        self.assertEqual(r.returncode, 0, r.stderr)
                        modules = " ".join(c.modules) if c.modules else "none"
                        if c.modules is not None:
                            self.assertIn(f"recompute: {modules}\n", r.stdout)
                        routed = recipe_text(args[args.index("--recipe.routed_experts") + 1])
                        self.assertIn(f"routed_experts {routed}\n", r.stdout)
                        self.assertIn(f"schedule: {s.train.steps[scale]} steps", r.stdout)
        self.assertGreater(len(seen), 20)


# ---- failures read from the logs ------------------------------------------------------------------------------------

class FailureParsing(unittest.TestCase):
    def memory_cpp_format(self, start):
        with open(os.path.join(ROOT, "trainer", "memory", "device_memory.cpp"), encoding="utf-8") as f:
            text = f.read()
        m = re.search(r'"(' + re.escape(start) + r'[^"]*)\\n\{\}"', text)
        self.assertIsNotNone(m, f"trainer/memory/device_memory.cpp no longer says '{start}...'")
        return m.group(1)

    def test_the_allocators_budget_report_is_an_oom_with_its_category(self):
        fmt = self.memory_cpp_format("out of the memory budget:")
        line = (fmt.replace("{:.3f}", "%.3f").replace("{}", "%s")
                % ("layers.2.moe experts fc1 output", 0.25, "activations", 79.75, 80.0))
        for log in (f"$ fp4moe train ...\nstep 1/5\nfp4moe train: failed: {line}\n  weights 1 GiB\n",
                    fake.budget_report("layers.2.moe experts fc1 output", 0.25, "activations", 79.75, 80.0)):
            status, reason, oom = train_cells.classify_failure(1, log)
            self.assertEqual(status, "oom")
            self.assertEqual(oom["category"], "activations")
            self.assertEqual(oom["what"], "layers.2.moe experts fc1 output")
            self.assertAlmostEqual(oom["request_gib"], 0.25)
            self.assertAlmostEqual(oom["held_gib"], 79.75)
            self.assertAlmostEqual(oom["budget_gib"], 80.0)
            self.assertTrue(reason.startswith("out of the memory budget"))

    def test_a_failing_cudamalloc_is_an_oom_too(self):
        fmt = self.memory_cpp_format("cudaMalloc failed")
        line = (fmt.replace("{:.3f}", "%.3f").replace("{}", "%s")
                % ("out of memory", "parameters (BF16)", 7.5, "weights", 131.0))
        status, _, oom = train_cells.classify_failure(1, f"fp4moe train: failed: {line}\n")
        self.assertEqual(status, "oom")
        self.assertEqual(oom["category"], "weights")
        self.assertTrue(math.isnan(oom["budget_gib"]))
        status, _, oom = train_cells.classify_failure(
            1, "fp4moe train: failed: CUDA error cudaErrorMemoryAllocation (out of memory) in cudaMalloc(&p, n)\n")
        self.assertEqual((status, oom["category"]), ("oom", "untracked"))

    def test_refusals_are_not_run(self):
        for rc, line in [
            (2, "fp4moe train: error: token shards: 'data/cache/shards' is not a folder (run `make data` to make the "
                "shards)"),
            (1, "fp4moe train: failed: Linear layers.0.attn.q_down: recipe fp8 is not built for dense linear layers "
                "yet (only bf16); the routed experts take fp8 and mxfp4 through Group Linear"),
            (2, "fp4moe train: error: recompute.modules: 'moe_act' is not implemented yet"),
            (2, "fp4moe train: error: no CUDA device (cudaErrorNoDevice): training needs one (--dry-run works "
                "without)"),
        ]:
            status, reason, oom = train_cells.classify_failure(rc, f"$ fp4moe train\n{line}\n")
            self.assertEqual(status, "not run", line)
            self.assertEqual(reason, line.split(": ", 2)[2])
            self.assertEqual(oom, {})

    def test_anything_else_failed(self):
        status, reason, _ = train_cells.classify_failure(1, "fp4moe train: failed: CUDA error cudaErrorIllegalAddress"
                                                            " (an illegal memory access) in cudaStreamSynchronize\n")
        self.assertEqual(status, "failed")
        self.assertIn("cudaErrorIllegalAddress", reason)
        self.assertEqual(train_cells.classify_failure(-11, ""), ("failed", "exit code -11", {}))
        long = "fp4moe train: failed: " + "x" * 1000
        self.assertLessEqual(len(train_cells.classify_failure(1, long)[1]), train_cells.MAX_REASON)


    def test_progress_from_the_trainers_plain_lines(self):
        p = process.TrainSteps()
        self.assertEqual(p.text(), "starting")
        for line in ["training v3: steps 1..1000 of 4096 tokens", "step   10/1000 | loss 9.1 | lr 1e-4 | 60K tok/s",
                     "eval at step 50: val_loss 6.5", "step  100/1000 | loss 7.0"]:
            p.feed(line)
        self.assertEqual(p.text(), "step 100/1000")
        c = process.CountLines(r"^[^-].*/manual_time", "cases")
        for line in ["copy/1000000B/min_time:0.050/manual_time   1.0 us", "----", "-x/manual_time"]:
            c.feed(line)
        self.assertEqual(c.text(), "1 cases done")


# ---- reading results back -------------------------------------------------------------------------------------------

class Readers(Tmp):
    def test_read_run(self):
        p = self.path("r.h5")
        fake.write_train_file(p, "v3-mxfp4", [100.0, 900.0, 1000.0, 1100.0, 1050.0],
                              {"total": 75.5, "activations": 9.25, "weights": 21.6, "grads": 14.4, "optimizer": 28.8,
                               "comm": 0.0, "workspace": 1.5},
                              losses=[6.0, 5.5, 5.0, 4.5, 4.25], evals=[(2, 5.2), (5, 4.4)],
                              dispatch={"payload": 3584.0, "scales": 224.0, "hidden": 7168}, mfu_per_tps=2e-4)
        m = train_cells.read_run(p, "v3-mxfp4")
        self.assertEqual(m["tokens_per_s"], 1025.0)  # the first step dropped, then the median
        self.assertAlmostEqual(m["mfu"], 1025.0 * 2e-4)
        self.assertAlmostEqual(m["step_time_s"], 4096 / 1025.0)
        self.assertEqual((m["peak_total_gib"], m["peak_act_gib"]), (75.5, 9.25))
        self.assertEqual((m["weights_gib"], m["optimizer_gib"], m["workspace_gib"]), (21.6, 28.8, 1.5))
        self.assertEqual(m["train_loss"], 4.25)  # mean of the last 5% (at least one step)
        self.assertEqual(m["val_loss"], 4.4)
        self.assertEqual(m["tokens"], 5 * 4096)
        self.assertEqual((m["dispatch_hidden"], m["dispatch_payload_bytes"], m["dispatch_scale_bytes"],
                          m["dispatch_bytes"]), (7168, 3584.0, 224.0, 3808.0))

    def test_read_run_without_memory_table_or_dispatch(self):
        p = self.path("r.h5")
        fake.write_train_file(p, "tiny", [50.0], {"total": 2.0, "activations": 0.5})
        with h5py.File(p, "a") as f:
            del f["memory"]
        m = train_cells.read_run(p, "tiny")
        self.assertEqual(m["tokens_per_s"], 50.0)  # one step: nothing dropped
        self.assertEqual((m["peak_total_gib"], m["peak_act_gib"]), (2.0, 0.5))  # from the steps table
        self.assertTrue(math.isnan(m["weights_gib"]))
        self.assertEqual(m["dispatch_hidden"], -1)
        self.assertTrue(math.isnan(m["dispatch_bytes"]))
        self.assertTrue(math.isnan(m["val_loss"]))

    def test_read_run_refusals(self):
        p = self.path("r.h5")
        fake.write_train_file(p, "a", [1.0], {"total": 1.0})
        with self.assertRaises(KeyError):
            train_cells.read_run(p, "b")
        other = self.path("v2.h5")
        fake.write_train_file(other, "a", [1.0], {"total": 1.0}, schema_version=2)
        with self.assertRaises(result_file.SchemaError):
            train_cells.read_run(other, "a")
        with self.assertRaises(OSError):
            train_cells.read_run(self.path("missing.h5"), "a")

    def test_table_rows_and_the_80_gib_fit(self):
        s = load("memory_per_policy")
        c = train_cells.expand(s, "default")[0]
        ok = train_cells.table_row(c, fake_outcome(c, peak_total_gib=72.0), s.train, 5)
        self.assertEqual((ok["status"], ok["pct_of_80_gib"], ok["steps"]), ("ok", 90.0, 5))
        self.assertAlmostEqual(ok["pct_of_141_gib"], 72.0 / 141 * 100)
        self.assertIn("--memory-budget 80", ok["args"])
        unbudgeted = train_cells.table_row(c, fake_outcome(c, budget=math.nan, peak_total_gib=90.0), s.train, 5)
        self.assertTrue(math.isnan(unbudgeted["pct_of_80_gib"]))  # measured above 80 GiB without a budget
        small = train_cells.table_row(c, fake_outcome(c, budget=math.nan, peak_total_gib=40.0), s.train, 5)
        self.assertEqual(small["pct_of_80_gib"], 50.0)
        refused = train_cells.table_row(c, train_cells.Outcome("not run", 1, 0.1, "r", note="not run: x"), s.train, 5)
        self.assertEqual((refused["run"], refused["dispatch_hidden"]), ("", -1))
        self.assertTrue(math.isnan(refused["peak_total_gib"]))
        self.assertEqual(refused["note"], "not run: x")
        self.assertEqual([c for c, _ in scenario.TRAIN_COLUMNS], list(ok))

    def test_same_activation_peak_under_every_policy_is_flagged(self):
        rows = [{"shape": "v3", "recipe": "bf16", "case": p, "status": "ok", "peak_act_gib": 9.0, "note": ""}
                for p in ("attn_ln_experts", "mla_up_proj")]
        rows.append({"shape": "v3", "recipe": "mxfp4", "case": "attn_ln_experts", "status": "ok", "peak_act_gib": 5.0,
                     "note": ""})
        rows.append({"shape": "v3", "recipe": "mxfp4", "case": "mla_up_proj", "status": "ok", "peak_act_gib": 7.0,
                     "note": "n"})
        train_cells.flag_same_policy_peaks(rows)
        self.assertIn("may not implement them yet", rows[0]["note"])
        self.assertIn("may not implement them yet", rows[1]["note"])
        self.assertEqual((rows[2]["note"], rows[3]["note"]), ("", "n"))


# ---- repro/run.py with a fake fp4moe --------------------------------------------------------------------------------

class RunWithFakeTrainer(Tmp):
    def fake_build(self, **behaviour):
        build = self.path("build")
        os.makedirs(build)
        self.argv_log = self.path("argv.jsonl")
        cfg = self.path("fake.json")
        with open(cfg, "w") as f:
            json.dump({"argv_log": self.argv_log, **behaviour}, f)
        fake.write_fake_fp4moe(os.path.join(build, "fp4moe"), cfg)
        return build

    def shards(self, present=True):
        d = self.path("shards")
        os.makedirs(d, exist_ok=True)
        if present:
            open(os.path.join(d, "train_000.bin"), "wb").close()
        return d

    def run_py(self, build, *args):
        return subprocess.run([sys.executable, RUN_PY, "--build", build, "--out", self.path("runs"), *args],
                              capture_output=True, text=True, timeout=600)

    def train_calls(self):
        with open(self.argv_log) as f:
            return [json.loads(line) for line in f if json.loads(line)[:1] == ["train"]]

    def run_file(self):
        (h5,) = [n for n in os.listdir(self.path("runs")) if n.endswith(".h5")]
        return self.path("runs", h5)

    def repro(self, f, name):
        return result_file.read_table(f[f"repro/{name}"])

    def test_default_scale_oom_retry_and_shared_runs(self):
        build = self.fake_build()
        r = self.run_py(build, "--scale", "default", "--only", *TRAIN, "--data", self.shards())
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("[2/5] memory_per_policy: cell 3/15 v3 bf16 mla_up_proj: oom", r.stdout)
        self.assertIn("[5/5] throughput_per_policy: cell 3/15 v3 bf16 mla_up_proj: oom", r.stdout)
        calls = self.train_calls()
        # loss 3 x 4 seeds + memory 15 + ladder 8 arms x 3 seeds + step breakdown 6 + throughput 15 (the same cells
        # at stage 12: runs of their own), each with the retries of the two cells over 80 GiB.
        self.assertEqual(len(calls), 3 * 4 + 15 + 2 + 8 * 3 + 6 + 15 + 2)
        retries = [c for c in calls if "--memory-budget" not in c and "configs/v3_671b.toml" in c
                   and "--recompute.modules" in c]
        self.assertEqual(len(retries), 4)
        for c in calls:
            self.assertTrue(os.path.isabs(c[c.index("--out") + 1]))
            self.assertEqual(c[c.index("--config") + 1][:8], "configs/")  # run from the repository root
        with h5py.File(self.run_file(), "r") as f:
            self.assertEqual(sorted(f["bench"]),
                             ["train_ladder", "train_loss", "train_memory", "train_profile", "train_throughput"])
            self.assertEqual(sorted(f["repro"]), sorted(TRAIN))
            self.assertEqual(len(f["train"]), 3 * 4 + 15 + 8 * 3 + 6 + 15)
            self.assertEqual(len(f["memory"]), 3 * 4 + 15 + 8 * 3 + 6 + 15)
            run = f["train/memory_per_policy-v3-mxfp4-mla_up_proj"]
            self.assertEqual(result_file.text(run.attrs["repro_scenarios"]), "memory_per_policy")
            self.assertIn("--run memory_per_policy-v3-mxfp4-mla_up_proj", result_file.text(run.attrs["command"]))
            self.assertEqual(result_file.text(f.attrs["gpu"]), "NVIDIA H200")
            cells = result_file.read_table(f["bench/train_memory"])
            self.assertEqual(result_file.text(f["bench/train_memory"].attrs["kind"]), "train cells")
            mem = self.repro(f, "memory_per_policy")
            thr = self.repro(f, "throughput_per_policy")
            loss = self.repro(f, "loss_deviation")
            attrs = result_file.table_attributes(f, "repro/memory_per_policy")
        self.assertEqual((attrs["kind"], attrs["cells"], attrs["cells_ok"], attrs["cells_oom"]), ("train", 15, 13, 2))
        oom = cells[(cells["case"] == "mla_up_proj") & (cells["recipe"] == "bf16") & (cells["shape"] == "v3")].iloc[0]
        self.assertEqual((oom["status"], oom["oom_category"]), ("oom", "activations"))
        self.assertAlmostEqual(oom["peak_total_gib"], 70.0 + 12.0)  # measured again without the budget
        self.assertIn("peaks, throughput and losses measured without the budget", oom["note"])
        heavy_bf16 = row_named(mem.to_dict("records"), "V3, recompute attention+layernorm+experts: bf16 peak")
        self.assertAlmostEqual(heavy_bf16["ours"], (70.0 + 6.0) / 80 * 100)
        light_bf16 = row_named(mem.to_dict("records"), "V3, recompute MLA up-projection only: bf16 peak")
        self.assertTrue(math.isnan(light_bf16["ours"]))
        self.assertIn("OOM at 80 GiB: activations did not fit", light_bf16["note"])
        headline = row_named(thr.to_dict("records"), "V3: mxfp4 recomputing MLA up-projection only over fp8 "
                                                     "recomputing attention+")
        self.assertAlmostEqual(headline["ours"], 1150.0 * 1.15 / 1200.0)
        self.assertAlmostEqual(row_named(loss.to_dict("records"), "mxfp4 against bf16: final validation")["ours"],
                               (4.85 / 4.80 - 1) * 100)
        run_dir = self.run_file()[:-3]
        for png in ("memory_per_policy_memory.png", "throughput_per_policy_throughput.png",
                    "loss_deviation_loss.png"):
            with open(os.path.join(run_dir, png), "rb") as f:
                self.assertEqual(f.read(8), PNG_MAGIC)
        self.assertFalse(os.path.exists(os.path.join(run_dir, "train_loss.png")))  # runs are plotted per scenario
        with open(os.path.join(run_dir, "TABLES.md"), encoding="utf-8") as f:
            md = f.read()
        self.assertIn("Training cells of `fp4moe train`: 15 (13 ok, 2 OOM), 2 steps each, memory budget 80 GiB", md)
        self.assertIn("![memory_per_policy](memory_per_policy_memory.png)", md)
        self.assertIn("### /bench/train_memory", md)
        self.assertIn("| -14.8% |", md)
        self.assertTrue(os.path.exists(os.path.join(run_dir, "logs",
                                                    "train-memory_per_policy-v3-bf16-mla_up_proj-no-budget.log")))

    def test_todays_trainer_refuses_dense_fp8_and_the_corpus_is_missing(self):
        build = self.fake_build(refuse_dense_fp8=True)
        r = self.run_py(build, "--scale", "smoke", "--only", *TRAIN, "--data", self.shards(present=False))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("not run: Linear layers.0.attn.q_down: recipe fp8 is not built", r.stdout)
        with h5py.File(self.run_file(), "r") as f:
            loss = self.repro(f, "loss_deviation").to_dict("records")
            mem = result_file.read_table(f["bench/train_memory"])
            self.assertNotIn("train/loss_deviation-small-bf16-config", f)
        for r in loss:
            self.assertTrue(math.isnan(r["ours"]))
        fp8 = row_named(loss, "fp8 against bf16: final validation loss")
        self.assertIn("fp8 small, bf16 small: not run: token shards:", fp8["note"])  # before the recipe's refusal
        self.assertIn("make data", fp8["note"])
        self.assertEqual(sorted(mem["status"]), ["not run", "ok"])

    def test_a_crashing_cell_fails_the_suite_but_not_the_run_file(self):
        build = self.fake_build(crash_recipes=["mxfp4"])
        r = self.run_py(build, "--scale", "smoke", "--only", "memory_per_policy")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("failed: memory_per_policy", r.stderr)
        self.assertNotIn("Traceback", r.stderr)
        with h5py.File(self.run_file(), "r") as f:
            cells = result_file.read_table(f["bench/train_memory"])
            self.assertEqual(result_file.text(f["repro/memory_per_policy"].attrs["exit_code"]), 1)
        crashed = cells[cells["recipe"] == "mxfp4"].iloc[0]
        self.assertEqual((crashed["status"], crashed["exit_code"]), ("failed", 139))
        self.assertIn("Segmentation fault", crashed["note"])

    def test_only_refused_cells_still_make_a_run_file(self):
        build = self.fake_build()
        r = self.run_py(build, "--scale", "smoke", "--only", "loss_deviation", "--data", self.shards(present=False))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with h5py.File(self.run_file(), "r") as f:
            self.assertEqual(result_file.text(f.attrs["schema_version"]), result_file.SCHEMA_VERSION)
            self.assertEqual(result_file.text(f.attrs["gpu"]), "NVIDIA H200")
            self.assertNotIn("train", f)
            self.assertEqual(list(result_file.read_table(f["bench/train_loss"])["status"]), ["not run"] * 6)  # 3 recipes x 2 seeds
        md, _, _ = report.write_report(self.run_file(), self.path("report"))
        with open(md, encoding="utf-8") as f:
            self.assertIn("Training cells of `fp4moe train`: 6 (6 not run), 60 steps each", f.read())


# ---- merging and reporting ------------------------------------------------------------------------------------------

class MergeAndReport(Tmp):
    def test_training_runs_alone_give_the_root_attributes(self):
        a, b = self.path("a.h5"), self.path("b.h5")
        fake.write_train_file(a, "ra", [1.0, 2.0], {"total": 3.0}, git_sha="from-a")
        fake.write_train_file(b, "rb", [1.0], {"total": 1.0}, git_sha="from-b")
        out = self.path("run.h5")
        copied = merge.merge_run(out, [], [], {"command": "repro/run.py"}, train_runs=[(a, "ra", "s1 s2"),
                                                                                         (b, "rb", "s1")])
        self.assertEqual(copied, ["/train/ra", "/memory/ra", "/train/rb", "/memory/rb"])
        with h5py.File(out, "r") as f:
            self.assertEqual(result_file.text(f.attrs["git_sha"]), "from-a")
            self.assertEqual(result_file.text(f.attrs["command"]), "repro/run.py")
            self.assertEqual(result_file.text(f["train/ra"].attrs["repro_scenarios"]), "s1 s2")
            self.assertEqual(len(f["train/ra/steps/step"]), 2)
        with self.assertRaises(merge.MergeError):
            merge.merge_run(out, [], [], train_runs=[(a, "ra", "s"), (a, "ra", "t")])
        with self.assertRaises(merge.MergeError):
            merge.merge_run(out, [], [], train_runs=[(a, "nothing", "s")])
        self.assertFalse([n for n in os.listdir(self.tmp) if ".tmp-" in n])

    def test_cells_markdown_and_plots(self):
        s = load("memory_per_policy")
        df, _ = cells_frame(s, "default")
        md = cells_report.markdown(df)
        header = md.splitlines()[0]
        self.assertTrue(header.startswith("| case | shape | recipe | status | peak_total_gib | peak_act_gib |"))
        self.assertNotIn("oom_category", header)  # no cell ran out of memory: the column is left out
        self.assertNotIn("args", header)
        for fn in (cells_report.plot_memory, cells_report.plot_throughput):
            p = self.path(fn.__name__ + ".png")
            self.assertTrue(fn(df, p, "t"))
            with open(p, "rb") as f:
                self.assertEqual(f.read(8), PNG_MAGIC)
            empty = df.assign(peak_total_gib=math.nan, tokens_per_s=math.nan)
            self.assertFalse(fn(empty, self.path("none.png"), "t"))

    def test_bar_labels_say_where_a_cell_ran_out(self):
        oom = {"status": "oom", "budget_gib": 80.0, "oom_category": "grads"}
        self.assertEqual(cells_report.bar_label(oom, 118.9, "x"), "OOM at 80 GiB\n(grads)\nx")
        # measured again without the budget and out of the device as well: no height
        self.assertEqual(cells_report.bar_label(oom, math.nan), "OOM at 80 GiB\n(grads)\nand on this GPU")
        self.assertEqual(cells_report.bar_label({"status": "ok"}, 50.0, "1.2K"), "1.2K")
        self.assertEqual(cells_report.bar_label({"status": "not run"}, math.nan, "1.2K"), "not run")
        self.assertFalse(os.path.exists(self.path("none.png")))


if __name__ == "__main__":
    unittest.main()
