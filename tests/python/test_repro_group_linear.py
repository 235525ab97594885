"""The Group Linear scenario and its PyTorch peer without a GPU: the scenario names its peer and its rows compute
what they say from a bench_group_linear table joined with the peer's (checked against numpy on seeded random
tables); scenario files with a bad peer are refused; the peer lists the same cases and splits as the benchmark,
refuses clearly without PyTorch, and adds its table to an existing result file atomically; repro/run.py runs the
benchmark and then the peer (fake programs), and skips the peer with a note when it reports PyTorch missing."""

import importlib.util
import json
import math
import os
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
from reports import result_file  # noqa: E402
from repro import ours, scenario  # noqa: E402

SCENARIO = os.path.join(ROOT, "repro", "scenarios", "group_linear.toml")
PEER = os.path.join(ROOT, "benchmarks", "peers", "group_linear_torch.py")
RUN_PY = os.path.join(ROOT, "repro", "run.py")
BUILD = os.environ.get("FP4MOE_BUILD", os.path.join(ROOT, "build"))
BENCH = os.path.join(BUILD, "benchmarks", "bench_group_linear")


def load_peer():
    spec = importlib.util.spec_from_file_location("group_linear_torch", PEER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


peer = load_peer()


def torch_importable():
    return importlib.util.find_spec("torch") is not None


# ---- seeded tables shaped like /bench/group_linear and /bench/group_linear_torch -------------------------------------

BENCH_COLUMNS = ["case", "shape", "recipe", "time_us", "tflops", "gbps", "fraction_of_copy_bw", "speedup", "pass",
                 "layer", "experts", "tokens", "split", "n", "k", "speedup_vs_bf16", "fraction_of_dense",
                 "held_bytes", "weight_copy_bytes"]


def group_linear_tables(seed, layers=("v3_fc1", "v2_fc2"), experts=(8, 32), tokens=16384):
    """(bench columns, peer columns): every pass and recipe over the configurations, the dense ceilings, with the
    ratios computed as the benchmark computes them."""
    rng = np.random.default_rng(seed)
    bench = {c: [] for c in BENCH_COLUMNS}
    torch_cols = {c: [] for c, _ in peer.COLUMNS}

    def add(cols, case, layer, g, split, recipe, t, held, extra=None):
        n, k = peer.LAYERS[layer]
        p = case.replace("_dense", "")
        row = {"case": case, "shape": f"{layer} e{g} t{tokens} {split}", "recipe": recipe, "time_us": t,
               "tflops": peer.flops(p, tokens, n, k) / t * 1e-6, "gbps": math.nan, "fraction_of_copy_bw": math.nan,
               "speedup": math.nan, "pass": p, "layer": layer, "experts": g, "tokens": tokens, "split": split, "n": n,
               "k": k, "speedup_vs_bf16": math.nan, "fraction_of_dense": math.nan, "held_bytes": held,
               "weight_copy_bytes": math.nan, **(extra or {})}
        for c in cols:
            cols[c].append(row[c])
        return row

    for layer in layers:
        n, k = peer.LAYERS[layer]
        dense = {p: float(rng.uniform(400, 900)) for p in peer.PASSES}
        for p in peer.PASSES:
            add(bench, p + "_dense", layer, 1, "dense", "fp8", dense[p], math.nan)
        for g in experts:
            for split in ("balanced", "zipf"):
                for p in peer.PASSES:
                    t = {"bf16": float(rng.uniform(900, 1500))}
                    t["fp8"] = t["bf16"] / float(rng.uniform(1.2, 1.6))
                    t["mxfp4"] = t["fp8"] / float(rng.uniform(1.0, 1.5))
                    held = {"bf16": 2.0 * tokens * k, "fp8": 1.04 * tokens * k, "mxfp4": 0.53125 * tokens * k}
                    for recipe in ("bf16", "fp8", "mxfp4"):
                        r = add(bench, p, layer, g, split, recipe, t[recipe], held[recipe])
                        i = len(bench["case"]) - 1
                        bench["speedup"][i] = t["fp8"] / t[recipe]
                        bench["speedup_vs_bf16"][i] = t["bf16"] / t[recipe]
                        bench["fraction_of_dense"][i] = r["tflops"] / (peer.flops(p, tokens, n, k) / dense[p] * 1e-6)
                    tb = float(rng.uniform(1000, 1800))
                    tf = tb / float(rng.uniform(1.0, 1.4))
                    for recipe, tt in (("torch_bf16", tb), ("torch_fp8", tf),
                                       ("torch_fp8_compiled", tf / float(rng.uniform(1.0, 1.3)))):
                        add(torch_cols, p, layer, g, split, recipe, tt, 2.0 * tokens * k,
                            {"rel_err_vs_bf16": 0.05 if recipe in peer.FP8_RECIPES else math.nan,
                             "padded_tokens": tokens, "speedup_vs_bf16": tb / tt})
    return bench, torch_cols


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def col(cols, name, **conds):
    n = len(cols["case"])
    return [cols[name][i] for i in range(n) if all(cols[c][i] == v for c, v in conds.items())]


def by_key(cols, name, **conds):
    """{(case, shape): value} of the rows matching conds."""
    return {(cols["case"][i], cols["shape"][i]): cols[name][i] for i in range(len(cols["case"]))
            if all(cols[c][i] == v for c, v in conds.items())}


Tmp = util.Tmp


# ---- scenario ------------------------------------------------------------------------------------------------------

class GroupLinearScenario(Tmp):
    def setUp(self):
        super().setUp()
        self.scn = scenario.load(SCENARIO)

    def test_names_the_benchmark_its_peer_and_the_paper_row(self):
        s = self.scn
        self.assertEqual((s.benchmark, s.family), ("bench_group_linear", "group_linear"))
        self.assertEqual((s.peer, s.peer_family), ("benchmarks/peers/group_linear_torch.py", "group_linear_torch"))
        self.assertTrue(os.path.exists(os.path.join(ROOT, s.peer)))
        with open(os.path.join(ROOT, s.peer), encoding="utf-8") as f:
            self.assertIn(f'FAMILY = "{s.peer_family}"', f.read())
        (paper,) = [r for r in s.rows if r.paper]
        self.assertEqual(paper.paper, "1.43-1.53")
        self.assertTrue(paper.paper_source.startswith("P1:"))
        self.assertTrue(paper.comparable)
        self.assertIn("not TransformerEngine", paper.note)
        peer_rows = [r for r in s.rows if "peer" in r.row.lower()]
        self.assertEqual(len(peer_rows), 4)
        for r in peer_rows:
            self.assertIn(r.ours.numerator.where["recipe"], peer.RECIPES)
            self.assertEqual(r.ours.match, ["case", "shape"])

    def test_rows_compute_from_the_benchmark_and_peer_tables(self):
        import pandas as pd
        bench, torch_cols = group_linear_tables(5)
        df = pd.concat([pd.DataFrame(bench), pd.DataFrame(torch_cols)], ignore_index=True)
        rows = {r["row"]: r for r in ours.repro_rows(self.scn, df)}
        self.assertEqual(len(rows), len(self.scn.rows))

        main = rows["Group Linear forward+backward: mxfp4 recipe over fp8 recipe"]
        want = util.geomean(col(bench, "speedup", case="fwd+bwd", recipe="mxfp4"))
        self.assertAlmostEqual(main["ours"], want, places=12)
        self.assertAlmostEqual(main["ratio"], want / 1.48, places=12)
        self.assertEqual(main["count"], 8)  # 2 layers x 2 expert counts x 2 splits

        fwd = next(r for k, r in rows.items() if k.startswith("Forward: mxfp4"))
        self.assertAlmostEqual(fwd["ours"], util.geomean(col(bench, "speedup", case="fwd", recipe="mxfp4")),
                               places=12)
        single = next(r for k, r in rows.items() if k.startswith("V3 fused gate/up"))
        (v,) = col(bench, "speedup", case="fwd+bwd", recipe="mxfp4", shape="v3_fc1 e8 t16384 balanced")
        self.assertEqual(single["ours"], v)

        torch_t = by_key(torch_cols, "time_us", case="fwd+bwd", recipe="torch_fp8")
        mx_t = by_key(bench, "time_us", case="fwd+bwd", recipe="mxfp4")
        vs_peer = next(r for k, r in rows.items() if "rowwise) time over our mxfp4" in k)
        self.assertAlmostEqual(vs_peer["ours"], util.geomean([torch_t[key] / mx_t[key] for key in mx_t]), places=9)
        self.assertEqual(vs_peer["count"], 8)
        compiled_t = by_key(torch_cols, "time_us", case="fwd+bwd", recipe="torch_fp8_compiled")
        vs_compiled = next(r for k, r in rows.items() if "compiled quantization" in k)
        self.assertAlmostEqual(vs_compiled["ours"], util.geomean([compiled_t[key] / mx_t[key] for key in mx_t]),
                               places=9)
        self.assertEqual(vs_compiled["count"], 8)
        self.assertLess(vs_compiled["ours"], vs_peer["ours"])  # the synthetic compiled peer is the faster one

        held = next(r for k, r in rows.items() if k.endswith("bf16 recipe over mxfp4 recipe") and "memory" in k)
        self.assertAlmostEqual(held["ours"], 2.0 / 0.53125, places=9)
        ceiling = next(r for k, r in rows.items() if k.startswith("Dense FP8 GEMMs"))
        (t,) = col(bench, "tflops", case="fwd+bwd_dense", shape="v3_fc1 e1 t16384 dense")
        self.assertEqual(ceiling["ours"], t)
        frac = next(r for k, r in rows.items() if k.startswith("mxfp4 forward+backward: TFLOP/s"))
        self.assertAlmostEqual(frac["ours"], util.geomean(col(bench, "fraction_of_dense", case="fwd+bwd",
                                                              recipe="mxfp4")), places=12)

    def test_without_the_peer_table_its_rows_are_nan(self):
        import pandas as pd
        bench, _ = group_linear_tables(6)
        rows = ours.repro_rows(self.scn, pd.DataFrame(bench))
        for r in rows:
            if "peer" in r["row"].lower():
                self.assertTrue(math.isnan(r["ours"]), r["row"])
                self.assertEqual(r["count"], 0)
            else:
                self.assertTrue(math.isfinite(r["ours"]), r["row"])

    def test_bad_peer_fields_are_rejected(self):
        with open(SCENARIO, encoding="utf-8") as f:
            good = f.read()
        cases = [
            (good.replace('peer = "benchmarks/peers/group_linear_torch.py"', 'peer = "/usr/bin/python3"'), "'peer'"),
            (good.replace('peer_family = "group_linear_torch"', 'peer_family = "group_linear"'), "'peer_family'"),
            (good.replace('peer_family = "group_linear_torch"\n', ""), "'peer_family'"),
        ]
        for text, message in cases:
            with self.subTest(message):
                p = self.path("bad.toml")
                with open(p, "w", encoding="utf-8") as f:
                    f.write(text)
                with self.assertRaises(scenario.ScenarioError) as cm:
                    scenario.load(p)
                self.assertIn("bad.toml", str(cm.exception))
                self.assertIn(message, str(cm.exception))


# ---- the peer without a GPU ------------------------------------------------------------------------------------------

class PeerProgram(Tmp):
    def run_peer(self, *args, python=sys.executable):
        return subprocess.run([python, PEER, *args], capture_output=True, text=True, timeout=120)

    def test_zipf_split_is_a_skewed_split_of_every_token(self):
        for g in (8, 16, 32):
            for t in (16384, 32768, 65536):
                sizes = peer.zipf_split(g, t)
                self.assertEqual(sum(sizes), t)
                self.assertTrue(all(s >= 1 for s in sizes))
                # the expert of rank 0 holds the most tokens, about 1 / H_G of them
                ranks = [(7 * e + 3) % g for e in range(g)]
                top = sizes[ranks.index(0)]
                self.assertEqual(top, max(sizes))
                harmonic = sum(1.0 / (r + 1) for r in range(g))
                self.assertLess(abs(top - t / harmonic), 2)
                self.assertEqual(peer.balanced_split(g, t), [t // g] * g)
        with self.assertRaises(ValueError):
            peer.zipf_split(14, 1000)

    def test_lists_the_same_cases_and_splits_as_the_benchmark(self):
        if not os.access(BENCH, os.X_OK):
            self.skipTest(f"{BENCH} is not built (set FP4MOE_BUILD to the build folder)")
        r = subprocess.run([BENCH, "--list_splits"], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.splitlines(), peer.split_lines())
        for extra in ([], ["--all"]):
            for flt in ["", scenario.load(SCENARIO).filter["smoke"], "zipf"]:
                with self.subTest(extra=extra, filter=flt):
                    args = extra + ([f"--benchmark_filter={flt}"] if flt else [])
                    b = subprocess.run([BENCH, "--benchmark_list_tests", *args], capture_output=True, text=True,
                                       timeout=60)
                    self.assertEqual(b.returncode, 0, b.stderr)
                    ours_names = {line.split("/min_time")[0] for line in b.stdout.splitlines()}
                    ours_layer = {n.split("/", 2)[2] for n in ours_names if "_dense/" not in n}
                    p = self.run_peer("--list", *extra, *(["--filter", flt] if flt else []))
                    self.assertEqual(p.returncode, 0, p.stderr)
                    peer_names = p.stdout.splitlines()
                    self.assertTrue(peer_names)
                    self.assertEqual({n.split("/", 2)[2] for n in peer_names}, ours_layer)
                    self.assertEqual({n.split("/")[1] for n in peer_names}, set(peer.RECIPES))
                    per_recipe = [n for n in ours_names if n.split("/")[1] == "fp8" and "_dense/" not in n]
                    self.assertEqual(len(peer_names), len(peer.RECIPES) * len(per_recipe))

    def test_refuses_clearly_without_pytorch(self):
        if torch_importable():
            self.skipTest("PyTorch is installed here")
        out = self.path("r.h5")
        r = self.run_peer("--h5", out)
        self.assertEqual(r.returncode, 3, r.stdout + r.stderr)
        lines = r.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertIn("group_linear_torch: PyTorch is not installed", lines[0])
        self.assertNotIn("Traceback", r.stderr)
        self.assertFalse(os.path.exists(out))

    def test_bad_arguments(self):
        for args, message in [(["--filter", "(v3"], "not a regular expression"), ([], "--h5 PATH"),
                              (["--h5", self.path("x.h5"), "--filter", "no-such-case"], "no case matches"),
                              (["--h5", self.tmp], "is a folder")]:
            with self.subTest(message):
                r = self.run_peer(*args)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn(message, r.stderr)
                self.assertNotIn("Traceback", r.stderr)

    def rows(self, n=3):
        rng = np.random.default_rng(9)
        out = []
        for i in range(n):
            row = {c: (f"s{i}" if kind == "str" else int(rng.integers(1, 100)) if kind == "i64" else
                       float(rng.uniform(1, 2))) for c, kind in peer.COLUMNS}
            row["speedup"] = math.nan
            out.append(row)
        return out

    def test_adds_its_table_to_the_benchmark_file(self):
        path = self.path("bench_group_linear.h5")
        bench, _ = group_linear_tables(7, layers=("v3_fc2",), experts=(8,))
        util.write_bench_file(path, "group_linear", bench, git_sha="bench-sha")
        rows = self.rows()
        for attempt in range(2):  # the second write replaces the first
            peer.write_into(path, rows, {"torch_version": "x"}, lambda: self.fail("the file exists: no new root"))
        with h5py.File(path, "r") as f:
            self.assertEqual(sorted(f["bench"]), ["group_linear", "group_linear_torch"])
            self.assertEqual(result_file.text(f.attrs["git_sha"]), "bench-sha")
            t = result_file.read_table(f["bench/group_linear_torch"])
            self.assertEqual(list(t.columns), [c for c, _ in peer.COLUMNS])
            self.assertEqual(t["time_us"].tolist(), [r["time_us"] for r in rows])
            self.assertEqual(len(result_file.read_table(f["bench/group_linear"])), len(bench["case"]))
        self.assertEqual(os.listdir(self.tmp), ["bench_group_linear.h5"])

    def test_new_file_and_refusal_of_another_schema(self):
        path = self.path("new.h5")
        root = {"schema_version": result_file.SCHEMA_VERSION, **util.ROOT_ATTRS}
        peer.write_into(path, self.rows(2), {}, lambda: root)
        with h5py.File(path, "r") as f:
            result_file.check_schema(path, f)
            self.assertEqual(result_file.text(f.attrs["gpu"]), "NVIDIA H200")
            self.assertEqual(len(result_file.read_table(f["bench/group_linear_torch"])), 2)
        other = self.path("v2.h5")
        util.write_bench_file(other, "group_linear", {"case": ["x"]}, schema_version=2)
        before = read_bytes(other)
        with self.assertRaises(result_file.SchemaError):
            peer.write_into(other, self.rows(1), {}, lambda: root)
        self.assertEqual(read_bytes(other), before)
        self.assertEqual(sorted(os.listdir(self.tmp)), ["new.h5", "v2.h5"])


# ---- repro/run.py with the peer -------------------------------------------------------------------------------------

class RunWithPeer(Tmp):
    H200 = "GPU 0:        NVIDIA H200 (sm_90), 132 SMs, 139.8 GiB, L2 60.0 MiB\n"

    def fake_build(self, bench_rc=0):
        build = self.path("build")
        os.makedirs(os.path.join(build, "benchmarks"))
        with open(os.path.join(build, "fp4moe"), "w") as f:
            f.write(f"#!/bin/sh\ncat <<'EOF'\n{self.H200}EOF\n")
        os.chmod(os.path.join(build, "fp4moe"), 0o755)
        self.bench, self.torch_cols = group_linear_tables(41)
        self.argv_log = self.path("argv.jsonl")
        helper = textwrap.dedent(f"""\
            import json, math, sys
            sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
            import h5py, repro_test_util as util
            def load(text):
                return {{k: [math.nan if v is None else v for v in vs] for k, vs in json.loads(text).items()}}
            with open({self.argv_log!r}, "a") as log:
                log.write(json.dumps(sys.argv[1:]) + "\\n")
            """)

        def jsonable(cols):
            return json.dumps({k: [None if isinstance(x, float) and math.isnan(x) else x for x in v]
                               for k, v in cols.items()})

        prog = os.path.join(build, "benchmarks", "bench_group_linear")
        with open(prog, "w") as f:
            f.write(f"#!{sys.executable}\n" + helper + textwrap.dedent(f"""\
                args = sys.argv[1:]
                if {bench_rc} == 0:
                    util.write_bench_file(args[args.index("--h5") + 1], "group_linear", load({jsonable(self.bench)!r}))
                sys.exit({bench_rc})
                """))
        os.chmod(prog, 0o755)
        return build, helper, jsonable(self.torch_cols)

    def fake_python(self, helper, torch_json, rc):
        """A stand-in for the Python that runs the peer: `python PEER --h5 H [--filter F]` adds the peer table to H
        (rc 0), or says PyTorch is missing (rc 3), or fails (other rc)."""
        prog = self.path("fake_python")
        with open(prog, "w") as f:
            f.write(f"#!{sys.executable}\n" + helper + textwrap.dedent(f"""\
                args = sys.argv[2:]
                if {rc} == 3:
                    print("group_linear_torch: PyTorch is not installed (No module named 'torch')", file=sys.stderr)
                    sys.exit(3)
                if {rc} == 0:
                    with h5py.File(args[args.index("--h5") + 1], "a") as f:
                        util.write_table(f, "/bench/group_linear_torch", load({torch_json!r}))
                sys.exit({rc})
                """))
        os.chmod(prog, 0o755)
        return prog

    def run_py(self, build, python, *args):
        return subprocess.run([sys.executable, RUN_PY, "--build", build, "--out", self.path("runs"), "--only",
                               "group_linear", "--peer-python", python, *args],
                              capture_output=True, text=True, timeout=300)

    def run_file(self):
        (h5,) = [n for n in os.listdir(self.path("runs")) if n.endswith(".h5")]
        return self.path("runs", h5)

    def test_benchmark_then_peer_into_one_run_file(self):
        build, helper, torch_json = self.fake_build()
        r = self.run_py(build, self.fake_python(helper, torch_json, 0), "--scale", "smoke")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("[1/1] group_linear: peer group_linear_torch done", r.stdout)
        with open(self.argv_log) as f:
            calls = [json.loads(line) for line in f]
        smoke = scenario.load(SCENARIO).filter["smoke"]
        self.assertEqual(len(calls), 2)
        self.assertIn(f"--benchmark_filter={smoke}", calls[0])
        self.assertEqual(calls[1][0], PEER)
        self.assertEqual(calls[1][calls[1].index("--filter") + 1], smoke)
        self.assertEqual(calls[1][calls[1].index("--h5") + 1], calls[0][calls[0].index("--h5") + 1])
        with h5py.File(self.run_file(), "r") as f:
            self.assertEqual(sorted(f["bench"]), ["group_linear", "group_linear_torch"])
            t = result_file.read_table(f["repro/group_linear"])
            g = f["repro/group_linear"]
            self.assertEqual(result_file.text(g.attrs["peer_exit_code"]), 0)
            self.assertEqual(result_file.text(g.attrs["peer"]), "benchmarks/peers/group_linear_torch.py")
        vs_peer = t[t["row"].str.contains(r"rowwise\) time over our mxfp4")].iloc[0]
        torch_t = by_key(self.torch_cols, "time_us", case="fwd+bwd", recipe="torch_fp8")
        mx_t = by_key(self.bench, "time_us", case="fwd+bwd", recipe="mxfp4")
        self.assertAlmostEqual(vs_peer["ours"], util.geomean([torch_t[k] / mx_t[k] for k in mx_t]), places=9)

    def test_peer_without_pytorch_is_skipped_with_a_note(self):
        build, helper, torch_json = self.fake_build()
        r = self.run_py(build, self.fake_python(helper, torch_json, 3))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("peer group_linear_torch skipped: group_linear_torch: PyTorch is not installed", r.stdout)
        with h5py.File(self.run_file(), "r") as f:
            self.assertEqual(sorted(f["bench"]), ["group_linear"])
            t = result_file.read_table(f["repro/group_linear"])
            self.assertEqual(result_file.text(f["repro/group_linear"].attrs["peer_exit_code"]), 3)
        for _, row in t.iterrows():
            if "peer" in row["row"].lower():
                self.assertTrue(math.isnan(row["ours"]))
                self.assertIn("the peer did not run: group_linear_torch: PyTorch is not installed", row["note"])
            else:
                self.assertTrue(math.isfinite(row["ours"]), row["row"])
                self.assertNotIn("the peer did not run", row["note"])

    def test_a_failing_peer_fails_the_run(self):
        build, helper, torch_json = self.fake_build()
        r = self.run_py(build, self.fake_python(helper, torch_json, 1))
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("peer group_linear_torch exited with 1", r.stdout)
        self.assertIn("failed: group_linear (peer)", r.stderr)
        self.assertNotIn("Traceback", r.stderr)
        with h5py.File(self.run_file(), "r") as f:
            self.assertEqual(sorted(f["bench"]), ["group_linear"])


if __name__ == "__main__":
    unittest.main()
