"""The reproduction suite without a GPU: scenario files (repro/scenarios/*.toml) parse and name their budget,
benchmark, filters and paper rows with sources; our values are computed from benchmark tables as the rules say
(checked against numpy on seeded random tables); benchmark files made here with h5py merge into one run file with
/repro tables; repro/run.py stops with one clear line and exit 1 without a (Hopper) GPU, and runs end to end with
fake `fp4moe env` and benchmark programs; reports/report.py and reports/compare.py on small files, other schema
versions refused."""

import json
import math
import os
import re
import subprocess
import sys
import textwrap
import unittest

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, ROOT)

import repro_test_util as util  # noqa: E402
from reports import compare, report, result_file  # noqa: E402
from repro import merge, ours, scenario  # noqa: E402

SCENARIOS = os.path.join(ROOT, "repro", "scenarios")
RUN_PY = os.path.join(ROOT, "repro", "run.py")
REPORT_PY = os.path.join(ROOT, "reports", "report.py")
COMPARE_PY = os.path.join(ROOT, "reports", "compare.py")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def read_table(f, path):
    g = f[path]
    cols = [c.decode() if isinstance(c, bytes) else c for c in g.attrs["columns"]]
    return {c: (g[c].asstr()[()].tolist() if g[c].dtype.kind == "O" else g[c][()].tolist()) for c in cols}


def nan_as_text(cols):
    """A table's columns with NaN cells replaced by "nan", so that equal tables compare equal."""
    return {k: ["nan" if isinstance(x, float) and math.isnan(x) else x for x in v] for k, v in cols.items()}


def by_row(scn, rows):
    """{row text: computed row} for a scenario's computed rows (row texts are unique per scenario)."""
    out = {r["row"]: r for r in rows}
    assert len(out) == len(scn.rows)
    return out


Tmp = util.Tmp


def benchmark_cells(family, name):
    """{column: [candidate cell values]} of the table row a Google Benchmark case name becomes. bench_grouped_gemm:
    "op/recipe/shape[/dense][@tuning]" -> case op[_dense], recipe, shape, tuning ("none" without '@'). bench_quant:
    "case/shape" where both may hold a '/', so every split is a candidate. bench_ep_comm: "kind/shape/recipe", a row
    per direction."""
    parts = name.split("/")
    if family in ("group_linear", "group_linear_torch"):  # "case/recipe/layer/e<G>/t<tokens>/<split>"
        return {"case": [parts[0]], "recipe": [parts[1]], "shape": [" ".join(parts[2:6])]}
    if family == "grouped_gemm":  # "op/recipe/shape[/dense][@tuning]"
        base, _, tuning = name.partition("@")
        parts = base.split("/")
        dense = parts[-1] == "dense"
        return {"case": [parts[0] + ("_dense" if dense else "")], "recipe": [parts[1]], "shape": [parts[2]],
                "tuning": [tuning or "none"]}
    if family == "ep_comm":  # "kind/shape/recipe": a row per exchange; sim_ranks also gives trainer_buffers rows
        return {"case": [parts[0]] + (["trainer_buffers"] if parts[0] == "sim_ranks" else []), "shape": [parts[1]],
                "recipe": [parts[2]],
                "direction": ["counts", "dispatch", "combine", "dispatch_gradient", "combine_gradient", "all"]}
    return {"case": ["/".join(parts[:i]) for i in range(1, len(parts))],
            "shape": ["/".join(parts[i:]) for i in range(1, len(parts))]}


class ScenarioFiles(Tmp):
    def test_every_scenario_parses_and_names_its_parts(self):
        scns = scenario.load_all(SCENARIOS)
        self.assertEqual([s.name for s in scns if s.kind == "bench"],
                         ["comm_volume", "conversion_kernels", "group_linear", "group_linear_gemm"])
        for s in (s for s in scns if s.kind == "bench"):
            with self.subTest(s.name):
                self.assertTrue(s.title)
                self.assertEqual(set(s.budget_gpu_minutes), set(scenario.SCALES))
                self.assertTrue(all(v > 0 for v in s.budget_gpu_minutes.values()))
                self.assertLessEqual(s.budget_gpu_minutes["smoke"], s.budget_gpu_minutes["default"])
                self.assertTrue(s.filter["smoke"], "smoke must select a subset")
                self.assertEqual(s.filter["full"], s.filter["default"])
                # The benchmark program exists and writes the table the scenario reads.
                src = os.path.join(ROOT, "benchmarks", s.benchmark + ".cu")
                self.assertTrue(os.path.exists(src), src)
                with open(src, encoding="utf-8") as f:
                    text = f.read()
                self.assertIn("write_bench_result(", text)
                self.assertIn(f'"{s.family}"', text)
                self.assertGreaterEqual(len(s.rows), 2)
                for r in s.rows:
                    self.assertTrue(r.paper_source.strip(), r.row)
                    if r.paper:
                        self.assertTrue(math.isfinite(scenario.paper_value(r.paper)), r.paper)
                    else:
                        self.assertTrue(r.paper_source.startswith("none:"), r.row)

    def test_paper_rows_and_their_sources(self):
        conv = scenario.load(os.path.join(SCENARIOS, "conversion_kernels.toml"))
        fused = [r for r in conv.rows if r.paper == "1.6-1.9"]
        self.assertEqual(len(fused), 2)
        for r in fused:  # from the secondary summary: marked as such
            self.assertIn("secondary summary", r.paper_source)
        bytes_rows = [r for r in conv.rows if r.paper == "~3"]
        self.assertEqual(len(bytes_rows), 2)
        for r in bytes_rows:
            self.assertTrue(r.paper_source.startswith("P1:"))
            self.assertNotIn("secondary", r.paper_source)
            self.assertEqual(r.ours.numerator.column, "bytes")
        gemm = scenario.load(os.path.join(SCENARIOS, "group_linear_gemm.toml"))
        (gl,) = [r for r in gemm.rows if r.paper == "1.43-1.53"]
        self.assertTrue(gl.paper_source.startswith("P1:"))
        self.assertIn("GEMM part only", gl.row)
        self.assertFalse(gl.comparable)
        for r in gemm.rows:  # numbers not from P1 say so
            if r.paper and r.paper != "1.43-1.53":
                self.assertRegex(r.paper_source, r"^(peer|ceiling), not P1")

    def test_paper_value(self):
        self.assertEqual(scenario.paper_value("1.5"), 1.5)
        self.assertEqual(scenario.paper_value("~3"), 3.0)
        self.assertAlmostEqual(scenario.paper_value("1.43-1.53"), 1.48)
        self.assertEqual(scenario.paper_value("1210-1340"), 1275.0)
        for t in ["", "n/a", "1.5x", "-3"]:
            self.assertTrue(math.isnan(scenario.paper_value(t)), t)

    GOOD = """
        title = "t"
        benchmark = "bench_quant"
        family = "quant"
        [budget_gpu_minutes]
        smoke = 1
        default = 2
        full = 2
        [filter]
        smoke = "^copy/"
        default = ""
        full = ""
        [[rows]]
        row = "r"
        paper = "2"
        paper_source = "P1: x"
        unit = "x"
        [rows.ours]
        aggregate = "geomean"
        column = "speedup"
        where = { case = "copy" }
        """

    def test_bad_scenarios_are_rejected_with_the_reason(self):
        scenario.load(self.write_toml(self.GOOD))  # the base case is valid
        cases = [
            (self.GOOD.replace("smoke = 1\n", ""), "budget_gpu_minutes] smoke"),
            (self.GOOD.replace('smoke = "^copy/"', 'smoke = "(copy"'), "not a regular expression"),
            (self.GOOD.replace('"geomean"', '"average"'), "aggregate must be one of"),
            (self.GOOD.replace('paper_source = "P1: x"', 'paper_source = ""'), "'paper_source'"),
            (self.GOOD.replace('benchmark = "bench_quant"', 'benchmark = "quant"'), "'benchmark'"),
            (self.GOOD.replace('column = "speedup"', ""), "needs 'column'"),
            (self.GOOD + "[rows.x\n", "not valid TOML"),
        ]
        for text, message in cases:
            with self.subTest(message):
                with self.assertRaises(scenario.ScenarioError) as cm:
                    scenario.load(self.write_toml(text))
                self.assertIn("bad.toml", str(cm.exception))
                self.assertIn(message, str(cm.exception))

    def test_schema_version_matches_the_cpp_writer(self):
        with open(os.path.join(ROOT, "results", "run_info.h"), encoding="utf-8") as f:
            m = re.search(r"kResultSchemaVersion\s*=\s*(\d+)", f.read())
        self.assertIsNotNone(m)
        self.assertEqual(result_file.SCHEMA_VERSION, int(m.group(1)))

    def test_smoke_filters_select_every_case_a_row_needs(self):
        build = os.environ.get("FP4MOE_BUILD", os.path.join(ROOT, "build"))
        for s in scenario.load_all(SCENARIOS):
            if s.kind != "bench":  # training scenarios: test_repro_train.py
                continue
            prog = os.path.join(build, "benchmarks", s.benchmark)
            if not os.access(prog, os.X_OK):
                self.skipTest(f"{prog} is not built (set FP4MOE_BUILD to the build folder)")
            with self.subTest(s.name):
                r = subprocess.run([prog, "--benchmark_list_tests", f"--benchmark_filter={s.filter['smoke']}"],
                                   capture_output=True, text=True, timeout=60)
                self.assertEqual(r.returncode, 0, r.stderr)
                listed = r.stdout.splitlines()
                full = subprocess.run([prog, "--benchmark_list_tests"], capture_output=True, text=True, timeout=60)
                self.assertLess(len(listed), len(full.stdout.splitlines()))
                cells = [benchmark_cells(s.family, line.split("/min_time")[0]) for line in listed]
                if s.peer:  # the peer's cases under the same filter (listing needs no PyTorch)
                    peer = subprocess.run([sys.executable, os.path.join(ROOT, s.peer), "--list", "--filter",
                                           s.filter["smoke"]], capture_output=True, text=True, timeout=60)
                    self.assertEqual(peer.returncode, 0, peer.stderr)
                    cells += [benchmark_cells(s.peer_family, line) for line in peer.stdout.splitlines()]
                for row in s.rows:
                    rule = row.ours
                    for sel in [rule.value, rule.numerator, rule.denominator]:
                        if sel is None:
                            continue
                        hit = [c for c in cells if all(any(re.fullmatch(rx, v) for v in c.get(col, []))
                                                       for col, rx in sel.where.items())]
                        self.assertTrue(hit, f"{row.row}: no smoke case matches {sel.where}")
                if s.family == "quant":
                    self.assertTrue(any("copy" in c["case"] for c in cells))


class OursValues(unittest.TestCase):
    def setUp(self):
        import pandas as pd
        self.conv_cols = util.quant_table(11)
        self.gemm_cols = util.gemm_table(12)
        self.conv = pd.DataFrame(self.conv_cols)
        self.gemm = pd.DataFrame(self.gemm_cols)
        self.conv_scn = scenario.load(os.path.join(SCENARIOS, "conversion_kernels.toml"))
        self.gemm_scn = scenario.load(os.path.join(SCENARIOS, "group_linear_gemm.toml"))

    def col(self, cols, name, **conds):
        return [cols[name][i] for i in util.rows_where(cols, **conds)]

    def test_conversion_rows(self):
        rows = by_row(self.conv_scn, ours.repro_rows(self.conv_scn, self.conv))
        c = self.conv_cols
        fprop = next(r for r in rows.values() if r["row"].startswith("Fprop: direct"))
        expect = util.geomean(self.col(c, "speedup", case="mxfp4_row_to_fp8_row"))
        self.assertAlmostEqual(fprop["ours"], expect, places=12)
        self.assertAlmostEqual(fprop["ratio"], expect / 1.75, places=12)
        self.assertEqual(fprop["paper"], "1.6-1.9")
        self.assertEqual(fprop["count"], 2)
        self.assertIn("geomean of 2 rows", fprop["note"])

        def nbytes(case):
            return {c["shape"][i]: c["gbps"][i] * c["time_us"][i] * 1e3 for i in util.rows_where(c, case=case)}

        fused, naive, fp8 = nbytes("mxfp4_row_to_fp8_col"), nbytes("mxfp4_row_to_fp8_col_naive"), \
            nbytes("bf16_to_fp8_col")
        round_trip = next(r for r in rows.values() if r["row"].startswith("Wgrad: bytes of the BF16 round trip"))
        self.assertAlmostEqual(round_trip["ours"], util.geomean([naive[s] / fused[s] for s in fused]), places=9)
        self.assertAlmostEqual(round_trip["ratio"], round_trip["ours"] / 3.0, places=9)
        cached = next(r for r in rows.values() if r["row"].startswith("Wgrad: bytes of BF16 -> FP8 columns"))
        self.assertAlmostEqual(cached["ours"], util.geomean([fp8[s] / fused[s] for s in fused]), places=9)
        bw = next(r for r in rows.values() if r["row"].startswith("FP4RowToFP8Col: bandwidth"))
        self.assertAlmostEqual(bw["ours"], util.geomean(self.col(c, "fraction_of_copy_bw",
                                                                 case="mxfp4_row_to_fp8_col")), places=12)
        self.assertTrue(math.isnan(bw["ratio"]))  # no published value
        self.assertEqual(bw["paper"], "")

    def test_gemm_rows(self):
        rows = by_row(self.gemm_scn, ours.repro_rows(self.gemm_scn, self.gemm))
        g = self.gemm_cols
        gl = next(r for r in rows.values() if r["paper"] == "1.43-1.53")
        # The ragged 8- and 32-expert shapes on one stream only (not the even split, not other tunings).
        speedups = [g["speedup"][i] for i in range(len(g["case"]))
                    if g["recipe"][i] == "fp8" and g["case"][i] in ("fprop", "dgrad", "wgrad")
                    and g["tuning"][i] == "none" and not g["shape"][i].endswith("even")]
        self.assertEqual(len(speedups), 12)
        self.assertAlmostEqual(gl["ours"], util.geomean(speedups), places=12)
        self.assertTrue(math.isnan(gl["ratio"]))  # not the same measurement: no ratio
        self.assertIn("no ratio", gl["note"])
        peer = next(r for r in rows.values() if r["paper"] == "1279")
        (t,) = self.col(g, "tflops", case="fprop", recipe="fp8", shape="up 8x2048", tuning="none")
        self.assertEqual(peer["ours"], t)
        self.assertAlmostEqual(peer["ratio"], t / 1279, places=12)
        wgrad = next(r for r in rows.values() if r["row"].startswith("Wgrad: grouped FP8"))
        self.assertAlmostEqual(wgrad["ours"], util.geomean(
            [g["speedup"][i] for i in util.rows_where(g, case="wgrad", recipe="fp8", tuning="none")
             if not g["shape"][i].endswith("even")]), places=12)
        # The Hopper kernel over cuBLASLt: per op, the ratio of matched (case, shape) times over the grouped shapes.
        for op in ("fprop", "dgrad", "wgrad"):
            r = next(r for r in rows.values() if r["row"].startswith(f"{op.capitalize()} FP8")
                     and "over the per-expert cuBLASLt path" in r["row"])
            lt = {g["shape"][i]: g["time_us"][i] for i in util.rows_where(g, case=op, recipe="fp8", tuning="none")
                  if not g["shape"][i].endswith(("even", "16384"))}
            ours_t = {g["shape"][i]: g["time_us"][i]
                      for i in util.rows_where(g, case=op, recipe="fp8_sm90", tuning="none")
                      if not g["shape"][i].endswith("even")}
            self.assertEqual(sorted(lt), sorted(ours_t))
            self.assertEqual(r["count"], 4)
            self.assertAlmostEqual(r["ours"], util.geomean([lt[k] / ours_t[k] for k in lt]), places=12)
        for paper, shape in (("1346", "up 8x2048"), ("1214", "down 8x2048")):
            deepgemm = next(r for r in rows.values() if r["paper"] == paper)
            (t,) = self.col(g, "tflops", case="fprop", recipe="fp8_sm90", shape=shape, tuning="none")
            self.assertEqual(deepgemm["ours"], t)
        k_grouped = [r for r in rows.values() if r["paper"] == "813-873"]
        self.assertEqual(len(k_grouped), 2)
        for r, shape in zip(k_grouped, ("up 8x2048", "down 8x2048")):
            (t,) = self.col(g, "tflops", case="wgrad", recipe="fp8_sm90", shape=shape, tuning="none")
            self.assertEqual(r["ours"], t)
            self.assertAlmostEqual(r["ratio"], t / 843, places=12)
        direct = next(r for r in rows.values() if r["row"].startswith("Fprop, MXFP4 row operand read directly"))
        cvt = {g["shape"][i]: g["time_us"][i] for i in util.rows_where(g, recipe="mxfp4_cvt_sm90")}
        mx = {g["shape"][i]: g["time_us"][i] for i in util.rows_where(g, recipe="mxfp4_sm90")}
        self.assertEqual(direct["count"], 4)
        self.assertAlmostEqual(direct["ours"], util.geomean([cvt[k] / mx[k] for k in mx]), places=12)
        streams = next(r for r in rows.values() if r["row"].startswith("Grouped GEMMs, 32 experts"))
        pairs = [(i, j) for i in util.rows_where(g, tuning="none") for j in util.rows_where(g, tuning="s2")
                 if g["shape"][i].endswith("32x512") and all(g[c][i] == g[c][j] for c in ("case", "recipe", "shape"))]
        self.assertEqual(len(pairs), 12)
        self.assertAlmostEqual(streams["ours"], util.geomean([g["time_us"][i] / g["time_us"][j] for i, j in pairs]),
                               places=12)

    def test_comm_volume_rows(self):
        """The comm_volume rows from a table laid out as bench_ep_comm writes it: the bytes by the formats (as the
        benchmark measures them when they agree), 8 simulated ranks of 512 tokens and top-k 8, 7/8 of every exchange
        between distinct ranks; world-size-1 times with mxfp4 the fastest."""
        import pandas as pd
        scn = scenario.load(os.path.join(SCENARIOS, "comm_volume.toml"))
        kinds = ["counts", "dispatch", "combine", "dispatch_gradient", "combine_gradient"]
        cols = {k: [] for k in ("case", "shape", "recipe", "direction", "time_us", "fraction_of_copy_bw",
                                "measured_bytes", "arithmetic_bytes", "bytes_per_routed_token", "wire_share",
                                "dispatch_bytes")}

        def add(**cells):
            for k in cols:
                cols[k].append(cells.get(k, float("nan")))

        def row_bytes(fmt, d):
            return {"bf16": 2 * d, "fp8": d + 4 * -(-d // 128), "mxfp4": d // 2 + d // 32}[fmt]

        for shape, d in (("v3", 7168), ("v2", 5120)):
            for recipe in ("bf16", "fp8", "mxfp4"):
                fmt = {"dispatch": recipe, "dispatch_gradient": "bf16" if recipe == "bf16" else "fp8"}
                for case, routed in (("sim_ranks", 8 * 512 * 8), ("nccl_ws1", 4096 * 8)):
                    per = {k: (512 if case == "sim_ranks" else 64) if k == "counts"
                           else routed * row_bytes(fmt.get(k, "bf16"), d) for k in kinds}
                    per["all"] = sum(per.values())
                    for k, b in per.items():
                        t = b / 1e6 * {"bf16": 1.0, "fp8": 0.8, "mxfp4": 0.7}[recipe] + 20.0
                        add(case=case, shape=shape, recipe=recipe, direction=k, arithmetic_bytes=b,
                            bytes_per_routed_token=b / routed, measured_bytes=b if case == "sim_ranks" else math.nan,
                            wire_share=7 / 8 if case == "sim_ranks" else 0.0,
                            time_us=t if case == "nccl_ws1" else math.nan,
                            fraction_of_copy_bw=0.5 if case == "nccl_ws1" else math.nan)
                add(case="trainer_buffers", shape=shape, recipe=recipe, direction="dispatch",
                    dispatch_bytes=row_bytes(recipe, d))
        rows = by_row(scn, ours.repro_rows(scn, pd.DataFrame(cols)))
        for r in rows.values():
            self.assertTrue(math.isfinite(r["ours"]), r["row"])
        self.assertAlmostEqual(rows["V3 (hidden 7168): mxfp4 dispatch payload over bf16's"]["ours"], 3808 / 14336)
        self.assertAlmostEqual(rows["V3 (hidden 7168): mxfp4 dispatch bytes through the transport over fp8's "
                                    "(8 simulated ranks)"]["ours"], 3808 / 7392)
        whole = rows["V3 (hidden 7168): a layer's whole forward + backward all-to-all traffic, mxfp4 over bf16's "
                     "(8 simulated ranks)"]
        self.assertAlmostEqual(whole["ours"], (3808 + 14336 + 7392 + 14336 + 512 / 32768) / (4 * 14336 + 512 / 32768))
        self.assertGreater(whole["ratio"], 1.0)  # above the paper's bound of 0.5
        self.assertEqual(rows["V2 mxfp4: dispatch_gradient bytes per routed token through the transport "
                              "(8 simulated ranks)"]["ours"], 5120 + 4 * 40)
        self.assertIn("the formats give 5280", rows["V2 mxfp4: dispatch_gradient bytes per routed token through the "
                                                     "transport (8 simulated ranks)"]["paper_source"])
        for agg in ("min", "max"):
            r = rows["Bytes through the transport over the formats' arithmetic, every shape, recipe and exchange: "
                     + agg]
            self.assertEqual((r["ours"], r["count"]), (1.0, 36))
        self.assertEqual(rows["Counts exchange of one layer step (8 simulated ranks, 16 experts)"]["ours"], 512)
        self.assertLess(rows["V3: mxfp4 all-to-all time per MoE layer over bf16's, over NCCL at world size 1 (4096 "
                             "tokens; a local copy, no interconnect: a floor)"]["ours"], 1.0)
        self.assertEqual(rows["V3: the payload exchanges over NCCL at world size 1 (4096 tokens; a local copy, no "
                              "interconnect: a floor) over a device copy of the same bytes"]["count"], 12)

    def test_missing_cases_and_tables_give_nan_with_a_note(self):
        small = self.gemm[self.gemm["case"] == "fprop"]
        rows = by_row(self.gemm_scn, ours.repro_rows(self.gemm_scn, small))
        wgrad = next(r for r in rows.values() if r["row"].startswith("Wgrad: grouped FP8"))
        self.assertTrue(math.isnan(wgrad["ours"]))
        self.assertIn("not measured at this scale", wgrad["note"])
        for r in ours.repro_rows(self.conv_scn, None):
            self.assertTrue(math.isnan(r["ours"]) and math.isnan(r["ratio"]))
            self.assertIn("the benchmark wrote no table", r["note"])


class MergeRun(Tmp):
    def make_inputs(self):
        a, b = self.path("quant.h5"), self.path("gemm.h5")
        self.conv, self.gemm = util.quant_table(3), util.gemm_table(4)
        util.write_bench_file(a, "quant", self.conv, git_sha="first", command="bench_quant --h5 a.h5")
        util.write_bench_file(b, "grouped_gemm", self.gemm, git_sha="second", command="bench_grouped_gemm --h5 b.h5")
        return a, b

    def test_two_benchmark_files_and_repro_tables_make_one_run_file(self):
        a, b = self.make_inputs()
        import pandas as pd
        scn = scenario.load(os.path.join(SCENARIOS, "conversion_kernels.toml"))
        rows = ours.repro_rows(scn, pd.DataFrame(self.conv))
        out = self.path("run.h5")
        copied = merge.merge_run(out, [a, b], [("conversion_kernels", rows, {"title": scn.title, "elapsed_s": 1.5})],
                                 {"command": "repro/run.py --scale smoke", "scale": "smoke"})
        self.assertEqual(copied, ["/bench/quant", "/bench/grouped_gemm"])
        self.assertEqual(os.listdir(self.tmp).count("run.h5"), 1)
        self.assertFalse([n for n in os.listdir(self.tmp) if ".tmp-" in n])
        with h5py.File(out, "r") as f:
            attrs = result_file.root_attributes(f)
            self.assertEqual(attrs["schema_version"], 1)
            self.assertEqual(attrs["git_sha"], "first")  # from the first benchmark file
            self.assertEqual(attrs["gpu"], "NVIDIA H200")
            self.assertEqual(attrs["command"], "repro/run.py --scale smoke")
            self.assertEqual(attrs["scale"], "smoke")
            self.assertEqual(nan_as_text(read_table(f, "/bench/quant")), nan_as_text(self.conv))
            self.assertEqual(nan_as_text(read_table(f, "/bench/grouped_gemm")), nan_as_text(self.gemm))
            self.assertEqual(result_file.text(f["/bench/grouped_gemm"].attrs["command"]),
                             "bench_grouped_gemm --h5 b.h5")
            self.assertEqual(result_file.text(f["/bench/quant"].attrs["note"]), "quant test table")
            t = read_table(f, "/repro/conversion_kernels")
            self.assertEqual(list(t), [c for c, _ in ours.REPRO_COLUMNS])
            self.assertEqual(t["row"], [r["row"] for r in rows])
            self.assertEqual(t["paper"], [r["paper"] for r in rows])
            np.testing.assert_array_equal(t["ours"], [r["ours"] for r in rows])
            self.assertEqual(f["/repro/conversion_kernels/count"].dtype, np.int64)
            self.assertEqual(result_file.text(f["/repro/conversion_kernels"].attrs["elapsed_s"]), 1.5)

    def test_refusals_leave_no_file(self):
        a, b = self.make_inputs()
        other = self.path("v2.h5")
        util.write_bench_file(other, "other", util.quant_table(5), schema_version=2)
        out = self.path("run.h5")
        for files, message in [([a, other], "schema_version 2"), ([a, a], "more than one benchmark file"),
                               ([a, self.path("missing.h5")], "cannot read"), ([], "no benchmark result file")]:
            with self.subTest(message):
                with self.assertRaises(merge.MergeError) as cm:
                    merge.merge_run(out, files, [])
                self.assertIn(message, str(cm.exception))
                self.assertFalse(os.path.exists(out))
                self.assertFalse([n for n in os.listdir(self.tmp) if ".tmp-" in n])


class FakeMachine(Tmp):
    """A build folder with a fake `fp4moe env` and fake benchmark programs (Python scripts writing result files)."""

    def fake_build(self, env_output, benches):
        build = self.path("build")
        os.makedirs(os.path.join(build, "benchmarks"))
        with open(os.path.join(build, "fp4moe"), "w") as f:
            f.write(f"#!/bin/sh\n[ \"$1\" = env ] || exit 2\ncat <<'EOF'\n{env_output}EOF\n")
        os.chmod(os.path.join(build, "fp4moe"), 0o755)
        self.argv_log = self.path("argv.jsonl")
        for name, (family, cols, rc) in benches.items():
            prog = os.path.join(build, "benchmarks", name)
            with open(prog, "w") as f:
                f.write(f"#!{sys.executable}\n" + textwrap.dedent(f"""\
                    import json, sys
                    sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
                    import h5py, repro_test_util as util
                    args = sys.argv[1:]
                    with open({self.argv_log!r}, "a") as log:
                        log.write(json.dumps([{name!r}] + args) + "\\n")
                    print("case/1/min_time:0.050/manual_time   1.0 us")
                    if {rc} == 0:
                        cols = json.loads({json.dumps(json.dumps(cols))})
                        cols = {{k: [float("nan") if v is None else v for v in vs] for k, vs in cols.items()}}
                        util.write_bench_file(args[args.index("--h5") + 1], {family!r}, cols)
                    sys.exit({rc})
                    """))
            os.chmod(prog, 0o755)
        return build

    @staticmethod
    def jsonable(cols):
        return {k: [None if isinstance(x, float) and math.isnan(x) else x for x in v] for k, v in cols.items()}

    def run_py(self, build, *args):
        return subprocess.run([sys.executable, RUN_PY, "--build", build, "--out", self.path("runs"), *args],
                              capture_output=True, text=True, timeout=300)

    H200 = ("GPU 0:        NVIDIA H200 (sm_90), 132 SMs, 139.8 GiB, L2 60.0 MiB\ndriver:       570.86.15 (CUDA 12.8)\n"
            "CUDA runtime: 13.0\n")

    def test_without_a_gpu_one_line_and_exit_1(self):
        build = self.fake_build("GPU:          no CUDA device (cudaErrorNoDevice: no CUDA-capable device is "
                                "detected)\ndriver:       none\n", {})
        r = self.run_py(build, "--scale", "smoke")
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertEqual(r.stdout, "")
        lines = r.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertIn("no CUDA device (cudaErrorNoDevice", lines[0])
        self.assertIn("needs a Hopper GPU", lines[0])
        self.assertIn("make test", lines[0])
        self.assertNotIn("Traceback", r.stderr)
        self.assertFalse(os.path.exists(self.path("runs")))

    def test_a_gpu_that_is_not_hopper_is_refused(self):
        build = self.fake_build("GPU 0:        NVIDIA A100-SXM4-80GB (sm_80), 108 SMs, 79.2 GiB, L2 40.0 MiB\n", {})
        r = self.run_py(build)
        self.assertEqual(r.returncode, 1)
        self.assertIn("NVIDIA A100-SXM4-80GB (sm_80)", r.stderr)
        self.assertIn("needs a Hopper GPU", r.stderr)
        self.assertNotIn("Traceback", r.stderr)

    def test_missing_binary_exit_2(self):
        r = self.run_py(self.path("nowhere"))
        self.assertEqual(r.returncode, 2)
        self.assertIn("not found: build first", r.stderr)
        self.assertNotIn("Traceback", r.stderr)

    def test_end_to_end_with_fake_benchmarks(self):
        conv, gemm = util.quant_table(21), util.gemm_table(22)
        build = self.fake_build(self.H200, {"bench_quant": ("quant", self.jsonable(conv), 0),
                                            "bench_grouped_gemm": ("grouped_gemm", self.jsonable(gemm), 0)})
        r = self.run_py(build, "--scale", "smoke", "--only", "conversion_kernels", "group_linear_gemm")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("[1/2] conversion_kernels: bench_quant (filter ", r.stdout)
        self.assertIn("[2/2] group_linear_gemm: bench_grouped_gemm (filter ", r.stdout)
        self.assertRegex(r.stdout, r"\[2/2\] group_linear_gemm: done in \d+s, /bench/grouped_gemm 128 rows")
        runs = os.listdir(self.path("runs"))
        (h5,) = [n for n in runs if n.endswith(".h5")]
        self.assertRegex(h5, r"^\d{8}-\d{6}-nvidia-h200\.h5$")
        run_dir = self.path("runs", h5[:-3])
        # Each program got --h5 and its scenario's smoke filter.
        with open(self.argv_log) as f:
            calls = [json.loads(line) for line in f]
        scns = {s.benchmark: s for s in scenario.load_all(SCENARIOS)}
        self.assertEqual([c[0] for c in calls], ["bench_quant", "bench_grouped_gemm"])
        for c in calls:
            self.assertIn(f"--benchmark_filter={scns[c[0]].filter['smoke']}", c)
            self.assertEqual(c[c.index("--h5") + 1], os.path.join(run_dir, "bench", f"{c[0]}.h5"))
        with h5py.File(self.path("runs", h5), "r") as f:
            self.assertEqual(sorted(f["bench"]), ["grouped_gemm", "quant"])
            self.assertEqual(sorted(f["repro"]), ["conversion_kernels", "group_linear_gemm"])
            self.assertEqual(result_file.text(f.attrs["scale"]), "smoke")
            t = read_table(f, "/repro/conversion_kernels")
            i = t["row"].index(scns["bench_quant"].rows[0].row)
            self.assertAlmostEqual(t["ours"][i], util.geomean(
                [conv["speedup"][j] for j in util.rows_where(conv, case="mxfp4_row_to_fp8_row")]), places=12)
            g = f["/repro/group_linear_gemm"]
            self.assertEqual(result_file.text(g.attrs["exit_code"]), 0)
            self.assertEqual(result_file.text(g.attrs["filter"]), scns["bench_grouped_gemm"].filter["smoke"])
        with open(os.path.join(run_dir, "TABLES.md"), encoding="utf-8") as f:
            md = f.read()
        self.assertIn("## conversion_kernels: ", md)
        self.assertIn("| 1.6-1.9 |", md)
        for png in ["quant_fraction_of_copy.png", "grouped_gemm_tflops.png"]:
            with open(os.path.join(run_dir, png), "rb") as f:
                self.assertEqual(f.read(8), PNG_MAGIC)
        with open(os.path.join(run_dir, "logs", "bench_quant.log")) as f:
            self.assertIn("manual_time", f.read())

    def test_a_failing_benchmark_still_leaves_the_others_and_exits_1(self):
        gemm = util.gemm_table(23)
        build = self.fake_build(self.H200, {"bench_quant": ("quant", {}, 3),
                                            "bench_grouped_gemm": ("grouped_gemm", self.jsonable(gemm), 0)})
        r = self.run_py(build, "--scale", "default", "--only", "conversion_kernels", "group_linear_gemm")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("bench_quant exited with 3", r.stdout)
        self.assertIn("failed: conversion_kernels", r.stderr)
        self.assertNotIn("Traceback", r.stderr)
        with open(self.argv_log) as f:
            calls = [json.loads(line) for line in f]
        self.assertFalse([a for c in calls for a in c if a.startswith("--benchmark_filter")])  # default: all
        (h5,) = [n for n in os.listdir(self.path("runs")) if n.endswith(".h5")]
        with h5py.File(self.path("runs", h5), "r") as f:
            self.assertEqual(sorted(f["bench"]), ["grouped_gemm"])
            t = read_table(f, "/repro/conversion_kernels")
            self.assertTrue(all(math.isnan(x) for x in t["ours"]))
            self.assertEqual(result_file.text(f["/repro/conversion_kernels"].attrs["exit_code"]), 3)


class Reports(Tmp):
    def test_report_writes_tables_and_plots(self):
        run = self.path("20261129-120000-nvidia-h200.h5")
        conv, _ = util.write_run(run, [1.812345, 3.5])
        r = subprocess.run([sys.executable, REPORT_PY, run, "--runs", self.path("runs")], capture_output=True,
                           text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        out = self.path("runs", "20261129-120000-nvidia-h200")
        self.assertEqual(sorted(os.listdir(out)), ["TABLES.md", "grouped_gemm_tflops.png",
                                                   "quant_fraction_of_copy.png"])
        with open(os.path.join(out, "TABLES.md"), encoding="utf-8") as f:
            lines = f.read().splitlines()
        self.assertEqual(lines[0], "# Reproduction tables: NVIDIA H200")
        self.assertIn("| git_sha | 0123abcd |", lines)
        self.assertIn("## conversion_kernels: Conversion kernels", lines)
        self.assertIn("| row | paper | ours | ours / paper | unit | source | note |", lines)
        self.assertIn(f"| fused over unfused | 1.6-1.9 | 1.812 | {1.812345 / 1.75:.3g} | x | P1, secondary summary "
                      "| n |", lines)
        self.assertIn("Benchmark `bench_quant` (every case); budget 15 GPU-minutes, took 2 min; exit code 0.", lines)
        self.assertIn("### /bench/quant", lines)
        self.assertIn("### /bench/grouped_gemm", lines)
        self.assertIn("![/bench/quant](quant_fraction_of_copy.png)", lines)
        row = next(l for l in lines if l.startswith("| mxfp4_row_to_fp8_row | 4096x7168 |"))
        i = util.rows_where(conv, case="mxfp4_row_to_fp8_row", shape="4096x7168")[0]
        self.assertIn(f"| {conv['time_us'][i]:.4g} |", row)
        for png in ["quant_fraction_of_copy.png", "grouped_gemm_tflops.png"]:
            with open(os.path.join(out, png), "rb") as f:
                self.assertEqual(f.read(8), PNG_MAGIC)

    def test_report_refuses_other_schema_and_empty_files(self):
        run = self.path("v2.h5")
        util.write_run(run, [1.0, 2.0], schema_version=2)
        r = subprocess.run([sys.executable, REPORT_PY, run], capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)
        self.assertIn("schema_version 2", r.stderr)
        self.assertNotIn("Traceback", r.stderr)
        empty = self.path("empty.h5")
        with h5py.File(empty, "w") as f:
            util.write_root(f)
        r = subprocess.run([sys.executable, REPORT_PY, empty, "--out", self.path("e")], capture_output=True,
                           text=True)
        self.assertEqual(r.returncode, 1)
        self.assertIn("holds no /repro, /bench or /train table", r.stderr)
        self.assertFalse(os.path.exists(self.path("e")))

    def test_compare_side_by_side(self):
        a, b = self.path("a.h5"), self.path("b.h5")
        conv, gemm = util.write_run(a, [1.5, 3.0], quant_family="convert")  # a run of bench_quant's former name
        util.write_run(b, [1.8, 2.4, 7.0], time_scale=0.5, extra_row=True)
        r = subprocess.run([sys.executable, COMPARE_PY, a, b], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        self.assertIn("| attribute | A | B |", lines)
        self.assertIn("## /repro/conversion_kernels", lines)
        self.assertIn("| row | paper | ours A | ours B | B - A | B / A |", lines)
        self.assertIn(f"| fused over unfused | 1.6-1.9 | 1.5 | 1.8 | {1.8 - 1.5:.4g} | {1.8 / 1.5:.4g} |", lines)
        self.assertIn(f"| bytes | ~3 | 3 | 2.4 | {2.4 - 3.0:.4g} | {2.4 / 3.0:.4g} |", lines)
        self.assertIn("| only in B | - | - | 7 | - | - |", lines)
        self.assertIn("## /bench/quant", lines)  # the former /bench/convert of A matched with B's table
        self.assertFalse([l for l in lines if l.startswith("## ") and "(only in" in l], lines)
        self.assertIn("| case | shape | recipe | time_us A | time_us B | time B / A | gbps A | gbps B | gbps B / A |",
                      lines)
        i = util.rows_where(conv, case="bf16_to_fp8_col", shape="4096x7168/g8")[0]
        t = conv["time_us"][i]
        row = next(l for l in lines if l.startswith("| bf16_to_fp8_col | 4096x7168/g8 | fp8 |"))
        self.assertEqual(row, f"| bf16_to_fp8_col | 4096x7168/g8 | fp8 | {t:.4g} | {t * 0.5:.4g} | 0.5 | "
                              f"{conv['gbps'][i]:.4g} | {conv['gbps'][i]:.4g} | 1 |")
        self.assertIn("## /bench/grouped_gemm", lines)
        # grouped_gemm measures each (case, shape, recipe) once per tuning: its rows are matched by all four
        self.assertTrue(any(l.startswith("| case | shape | recipe | tuning | time_us A") and "tflops A" in l
                            for l in lines))
        self.assertEqual(sum(l.startswith("| fprop |") for l in lines), len(util.rows_where(gemm, case="fprop")))

        out = self.path("cmp.md")
        r = subprocess.run([sys.executable, COMPARE_PY, a, b, "--out", out], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(out, encoding="utf-8") as f:
            self.assertEqual(f.read(), compare.render(a, b))

    def test_compare_refuses_another_schema_version(self):
        a, b, c = self.path("a.h5"), self.path("b.h5"), self.path("c.h5")
        util.write_run(a, [1.5, 3.0])
        util.write_run(b, [1.5, 3.0], schema_version=2)
        util.write_run(c, [1.5, 3.0], schema_version=None)
        for other, message in [(b, "has schema_version 2; this code reads version 1"),
                               (c, "has no schema_version root attribute")]:
            for args in [(a, other), (other, a)]:
                r = subprocess.run([sys.executable, COMPARE_PY, *args], capture_output=True, text=True)
                self.assertEqual(r.returncode, 1, r.stdout)
                self.assertIn("compare: refused:", r.stderr)
                self.assertIn(message, r.stderr)
                self.assertNotIn("Traceback", r.stderr)
                self.assertEqual(r.stdout, "")
        r = subprocess.run([sys.executable, COMPARE_PY, a, self.path("missing.h5")], capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)
        self.assertNotIn("Traceback", r.stderr)

    def test_missing_files_and_folders_are_named_on_one_line(self):
        run = self.path("r.h5")
        util.write_run(run, [1.5, 3.0])
        missing, folder = self.path("missing.h5"), self.path("folder.h5")
        os.mkdir(folder)
        for tool, script in (("report", [REPORT_PY]), ("compare", [COMPARE_PY, run])):
            for path, expected in ((missing, f"'{missing}' does not exist"), (folder, f"'{folder}' is not a file")):
                with self.subTest(tool=tool, path=path):
                    r = subprocess.run([sys.executable, *script, path], capture_output=True, text=True)
                    self.assert_one_line(r, 2, tool, expected)

    def test_compare_refuses_a_file_without_tables(self):
        run, quantized = self.path("r.h5"), self.path("quantized.h5")
        util.write_run(run, [1.5, 3.0])
        with h5py.File(quantized, "w") as f:  # a result file of another kind: root attributes and arrays only
            util.write_root(f)
            f["codes"] = np.zeros((4, 16), dtype=np.uint8)
        for args in ((run, quantized), (quantized, run)):
            r = subprocess.run([sys.executable, COMPARE_PY, *args], capture_output=True, text=True)
            self.assert_one_line(r, 1, "compare", f"refused: '{quantized}' holds no /repro or /bench table")
            self.assertEqual(r.stdout, "")

    def test_compare_refuses_a_table_under_its_current_and_former_name(self):
        run, both = self.path("r.h5"), self.path("both.h5")
        util.write_run(run, [1.5, 3.0])
        util.write_run(both, [1.5, 3.0])
        with h5py.File(both, "a") as f:
            util.write_table(f, "/bench/convert", util.quant_table(5))
        r = subprocess.run([sys.executable, COMPARE_PY, run, both], capture_output=True, text=True)
        self.assert_one_line(r, 2, "compare", f"'{both}': tables /bench/quant and /bench/convert hold the same "
                                              "benchmark")
        self.assertEqual(r.stdout, "")

    def test_outputs_that_cannot_be_written(self):
        run = self.path("r.h5")
        util.write_run(run, [1.5, 3.0])
        blocker = self.path("plain_file")
        with open(blocker, "w", encoding="utf-8") as f:
            f.write("x")
        out = os.path.join(blocker, "cmp.md")  # a folder that cannot exist: its parent is a file
        r = subprocess.run([sys.executable, COMPARE_PY, run, run, "--out", out], capture_output=True, text=True)
        self.assert_one_line(r, 2, "compare", f"cannot write '{out}'")
        r = subprocess.run([sys.executable, REPORT_PY, run, "--out", os.path.join(blocker, "rep")],
                           capture_output=True, text=True)
        self.assert_one_line(r, 2, "report", f"cannot write the report into '{os.path.join(blocker, 'rep')}'")
        self.assertEqual(sorted(os.listdir(self.tmp)), ["plain_file", "r.h5"])

    def test_report_module_is_what_the_runner_uses(self):
        run = self.path("r.h5")
        util.write_run(run, [1.5, 3.0])
        md, pngs, n = report.write_report(run, self.path("out"))
        self.assertEqual(n, 3)
        self.assertEqual(len(pngs), 2)
        self.assertTrue(md.endswith("TABLES.md"))


if __name__ == "__main__":
    unittest.main()
