"""benchmarks/peers/moe_model_torch.py: what runs without torch (the configuration loader and its overrides, the FLOP
formula of trainer/flops.h against the numbers `fp4moe train --dry-run --no-data-check` prints and against
DeepSeek's published totals, the parity file reader, the comparison and its pass criteria, the command line's exit
codes), and the torch parts (parameter names and shapes, RoPE pairing, routing, a self-consistent parity run; on a
GPU the grouped-GEMM experts and the SDPA attention against the plain versions), which skip with the reason when
torch is absent. The binary is $FP4MOE_BUILD/fp4moe (ctest sets FP4MOE_BUILD to the build folder)."""

import glob
import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import unittest

import h5py
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PEER = os.path.join(ROOT, "benchmarks", "peers", "moe_model_torch.py")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli_test_util import binary  # noqa: E402


def load_peer():
    spec = importlib.util.spec_from_file_location("moe_model_torch", PEER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


mm = load_peer()
torch = mm.torch
HAS_CUDA = torch is not None and torch.cuda.is_available()
NO_TORCH = "PyTorch is not installed (the torch parts run on the GPU machine)"
PRESETS = sorted(os.path.splitext(os.path.basename(p))[0] for p in glob.glob(os.path.join(ROOT, "configs", "*.toml")))


def preset(name, *overrides):
    return mm.load_config(os.path.join(ROOT, "configs", f"{name}.toml"), list(overrides))


def run_peer(*args):
    return subprocess.run([sys.executable, PEER, *args], capture_output=True, text=True, timeout=120, cwd=ROOT)


# ---- configuration ---------------------------------------------------------------------------------------------------

class Config(unittest.TestCase):
    def test_presets_load(self):
        self.assertIn("v3_layer", PRESETS)
        for name in PRESETS:
            with self.subTest(name=name):
                cfg = preset(name)
                with open(os.path.join(ROOT, "configs", f"{name}.toml"), "rb") as f:
                    self.assertEqual(cfg, tomllib.load(f))

    def test_v3_layer_is_one_moe_layer_of_v3(self):
        v3, one = preset("v3"), preset("v3_layer")
        for key in ("hidden", "heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                    "v_head_dim", "rope_theta", "norm_eps", "vocab_size"):
            self.assertEqual(one["model"][key], v3["model"][key], key)
        self.assertEqual((one["model"]["layers"], one["model"]["n_dense_layers"]), (1, 0))
        self.assertEqual((one["moe"]["routed_experts"], one["moe"]["top_k"], one["moe"]["shared_experts"]), (16, 8, 1))
        self.assertEqual(one["moe"]["expert_ffn"], v3["moe"]["expert_ffn"])
        self.assertEqual((one["train"]["seq_len"], one["train"]["micro_batch"]), (4096, 1))

    def test_overrides_convert_to_the_file_type(self):
        cfg = mm.load_config(os.path.join(ROOT, "configs", "small.toml"), mm.parse_overrides(
            ["--train.seq_len", "1024", "--train.lr=3e-4", "--moe.router", "v2", "--model.rope_theta", "5e4",
             "--recompute.modules", "mla_up_proj,core_attn"]))
        self.assertEqual(cfg["train"]["seq_len"], 1024)
        self.assertIsInstance(cfg["train"]["seq_len"], int)
        self.assertEqual(cfg["train"]["lr"], 3e-4)
        self.assertEqual(cfg["moe"]["router"], "v2")
        self.assertEqual(cfg["model"]["rope_theta"], 5e4)
        self.assertEqual(cfg["recompute"]["modules"], ["mla_up_proj", "core_attn"])

    def test_bad_overrides_and_files(self):
        small = os.path.join(ROOT, "configs", "small.toml")
        cases = [(["--train.seq_ln", "1"], "no such key"), (["--train.seq_len", "1.5"], "not an integer"),
                 (["--train.lr", "fast"], "not a number"), (["--train.seq_len"], "needs a value"),
                 (["5"], "unexpected argument"), (["--moe.router", "v4"], "moe.router"),
                 (["--model.qk_rope_head_dim", "15"], "even"), (["--moe.top_k", "99"], "top_k")]
        for args, words in cases:
            with self.subTest(args=args):
                with self.assertRaisesRegex(mm.BadInput, words):
                    mm.load_config(small, mm.parse_overrides(args))
        with self.assertRaisesRegex(mm.BadInput, "nope.toml"):
            mm.load_config(os.path.join(ROOT, "configs", "nope.toml"))
        with tempfile.NamedTemporaryFile("w", suffix=".toml") as f:
            f.write("[model]\nhidden = \n")
            f.flush()
            with self.assertRaisesRegex(mm.BadInput, "not valid TOML"):
                mm.load_config(f.name)


    def test_a_dense_model_needs_no_moe_section(self):
        """As `fp4moe train`: [moe] is required only when some layer is MoE (dense_small has none)."""
        dense = preset("dense_small")
        self.assertNotIn("moe", dense)
        self.assertEqual(dense["model"]["n_dense_layers"], dense["model"]["layers"])
        c = mm.count_parameters(dense)
        self.assertEqual((c["router"], c["routed_experts"], c["shared_experts"]), (0, 0, 0))
        with open(os.path.join(ROOT, "configs", "small.toml")) as f:
            small = f.read()
        with tempfile.NamedTemporaryFile("w", suffix=".toml") as f:
            f.write(small[:small.index("[moe]")] + small[small.index("[train]"):])
            f.flush()
            with self.assertRaisesRegex(mm.BadInput, r"no \[moe\] section"):
                mm.load_config(f.name)

# ---- FLOPs -----------------------------------------------------------------------------------------------------------

DRY_RUN_CASES = [(name, ()) for name in PRESETS] + [
    ("tiny", ("--model.q_lora_rank", "0")), ("tiny", ("--moe.router", "v2")),
    ("small", ("--train.seq_len", "4096")), ("v2", ("--moe.shared_experts", "0"))]


class Flops(unittest.TestCase):
    def test_deepseek_published_totals(self):
        """trainer/flops.h's header: V3 671.0e9 total, 36.6e9 activated, 250.5e9 training FLOPs per token at T = 4096;
        V2 235.7e9, 20.9e9, 155.3e9."""
        v3 = preset("v3", ("model", "layers", "61"), ("model", "n_dense_layers", "3"),
                    ("moe", "routed_experts", "256"), ("model", "vocab_size", "129280"))
        v2 = preset("v2", ("model", "layers", "60"), ("model", "n_dense_layers", "1"),
                    ("moe", "routed_experts", "160"), ("model", "vocab_size", "102400"))
        for cfg, total, active, train in ((v3, 671.0e9, 36.6e9, 250.5e9), (v2, 235.7e9, 20.9e9, 155.3e9)):
            c = mm.count_parameters(cfg)
            self.assertEqual(round(c["total"] / 1e8), round(total / 1e8))
            self.assertEqual(round(c["activated"] / 1e8), round(active / 1e8))
            self.assertEqual(round(mm.model_flops_per_token(cfg, 4096)["training"] / 1e8), round(train / 1e8))

    def test_mfu(self):
        cfg = preset("v3_layer")
        f = mm.model_flops_per_token(cfg, 4096)["training"]
        self.assertAlmostEqual(mm.model_flops_utilization(cfg, 4096, 1000.0), f * 1000.0 / 989e12)
        self.assertAlmostEqual(f, 3 * (2 * mm.count_parameters(cfg)["activated_matmul"] + 128 * 320 * 4097))

    def test_against_the_trainer_dry_run(self):
        exe = binary()
        if not os.access(exe, os.X_OK):
            self.skipTest(f"{exe} is not built (set FP4MOE_BUILD to the build folder)")
        for name, args in DRY_RUN_CASES:
            with self.subTest(config=name, overrides=args):
                cmd = [exe, "train", "--config", os.path.join("configs", f"{name}.toml"), "--dry-run",
                       "--no-data-check", *args]
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT)
                self.assertEqual(r.returncode, 0, f"{' '.join(cmd)}\n{r.stdout}\n{r.stderr}")
                total = int(re.search(r"^parameters total: (\d+)", r.stdout, re.M).group(1))
                active = int(re.search(r"^parameters activated per token: (\d+)", r.stdout, re.M).group(1))
                m = re.search(r"model flops per token \(seq_len (\d+), causal\): forward (\S+), training 3x (\S+)",
                              r.stdout)
                cfg = preset(name, *mm.parse_overrides(list(args)))
                c = mm.count_parameters(cfg)
                f = mm.model_flops_per_token(cfg, int(m.group(1)))
                self.assertEqual((c["total"], c["activated"]), (total, active))
                self.assertEqual(int(m.group(1)), cfg["train"]["seq_len"])
                self.assertEqual(f"{f['forward']:.4g}", m.group(2))
                self.assertEqual(f"{f['training']:.4g}", m.group(3))


# ---- files, comparison, command line (no torch) ----------------------------------------------------------------------

def write_parity_file(path, cfg_text, params, grads, states, routing, tokens, targets, loss, aux):
    """A file in the layout of cli/cmd_parity.cpp."""
    with h5py.File(path, "w") as f:
        f.attrs["config_toml"] = cfg_text
        f.attrs["config_path"] = "configs/tiny.toml"
        f.attrs["model_config_text"] = ""
        f["tokens"] = np.asarray(tokens, dtype=np.int32)
        f["targets"] = np.asarray(targets, dtype=np.int32)
        f["loss"] = np.float32(loss)
        f["aux_loss"] = np.float32(aux)
        for group, tensors in (("params", params), ("grads", grads), ("states", states)):
            for name, v in tensors.items():
                f[f"{group}/{name}"] = np.asarray(v, dtype=np.float32)
        for layer, v in routing.items():
            f[f"routing/{layer}"] = np.asarray(v, dtype=np.int32)


def tiny_toml():
    with open(os.path.join(ROOT, "configs", "tiny.toml")) as f:
        return f.read()


class FilesAndCommandLine(unittest.TestCase):
    """The parity file reader and comparison, the bench table writer and the exit codes: numpy and h5py only."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="fp4moe_parity_logic_")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_rel_l2(self):
        self.assertEqual(mm.rel_l2(np.zeros(3), np.zeros(3)), 0.0)
        self.assertEqual(mm.rel_l2(np.ones(3), np.zeros(3)), math.inf)
        self.assertEqual(mm.rel_l2(np.array([np.nan]), np.ones(1)), math.inf)
        self.assertAlmostEqual(mm.rel_l2(np.array([3.0, 4.0 + 0.5]), np.array([3.0, 4.0])), 0.1)

    def test_compare_criteria_and_order(self):
        rng = np.random.default_rng(1)
        ref = {n: rng.standard_normal(50) for n in ("a", "b", "c", "d")}

        def noisy(scale):
            return {n: v + scale[n] * np.linalg.norm(v) / math.sqrt(v.size) * rng.standard_normal(v.size)
                    for n, v in ref.items()}

        fp32 = {"loss": 10.0, "aux_loss": 0.0, "grads": ref}
        bf16 = {"loss": 10.001, "aux_loss": 0.0, "grads": noisy({"a": 0.02, "b": 0.02, "c": 0.001, "d": 0.001})}
        # a: 2x its BF16 noise (passes), b: 5x (fails), c: under the 1e-2 floor (passes), d: 3e-2 > floor (fails)
        ours_grads = {"a": ref["a"] + 2 * (bf16["grads"]["a"] - ref["a"]),
                      "b": ref["b"] + 5 * (bf16["grads"]["b"] - ref["b"]),
                      "c": ref["c"] * (1 + 0.005), "d": ref["d"] * (1 + 0.03)}
        report = mm.compare({"loss": 10.005, "aux_loss": 0.0, "grads": ours_grads}, fp32, bf16)
        rows = {r["name"]: r for r in report["tensors"]}
        self.assertTrue(rows["a"]["pass"])
        self.assertFalse(rows["b"]["pass"])
        self.assertTrue(rows["c"]["pass"])
        self.assertAlmostEqual(rows["c"]["tolerance"], 1e-2)
        self.assertFalse(rows["d"]["pass"])
        self.assertEqual(sorted(report["failed_tensors"]), ["b", "d"])
        self.assertFalse(report["pass"])
        self.assertTrue(report["loss"]["pass"])  # 5e-4 relative
        ratios = [r["rel_err_ours"] / r["tolerance"] for r in report["tensors"]]
        self.assertEqual(ratios, sorted(ratios, reverse=True))  # worst first
        text = "\n".join(mm.report_lines(report))
        self.assertIn("FAIL", text)
        self.assertLess(text.index("\nb "), text.index("\na "))
        json.dumps(mm.json_safe(report), allow_nan=False)

        passing = mm.compare({"loss": 10.0, "aux_loss": 0.0, "grads": ref}, fp32, bf16)
        self.assertTrue(passing["pass"])
        off = mm.compare({"loss": 10.02, "aux_loss": 0.0, "grads": ref}, fp32, bf16)
        self.assertFalse(off["loss"]["pass"])
        self.assertFalse(off["pass"])
        missing = mm.compare({"loss": 10.0, "aux_loss": 0.0, "grads": {}}, fp32, bf16)
        self.assertEqual(sorted(missing["failed_tensors"]), ["a", "b", "c", "d"])

    def test_routing_agreement(self):
        a = np.array([[0, 1], [2, 3], [4, 5]])
        self.assertAlmostEqual(mm.routing_agreement(a, np.array([[1, 0], [2, 3], [5, 6]])), 2 / 3)

    def test_read_parity_file(self):
        path = os.path.join(self.tmp, "p.h5")
        tokens = np.arange(8).reshape(2, 4)
        write_parity_file(path, tiny_toml(), {"embed": np.ones((3, 2))}, {"embed": np.zeros((3, 2))},
                          {"layers.1.moe.router_bias": np.zeros(8)}, {1: np.zeros((8, 2))}, tokens, tokens, 2.5, 0.0)
        d = mm.read_parity_file(path)
        self.assertEqual(d["config"]["model"]["hidden"], 64)
        self.assertEqual(d["tokens"].dtype, np.int64)
        self.assertEqual(d["tokens"].shape, (2, 4))
        self.assertEqual((d["loss"], d["aux_loss"]), (2.5, 0.0))
        self.assertEqual(list(d["routing"]), [1])
        self.assertEqual(d["params"]["embed"].shape, (3, 2))
        self.assertIn("layers.1.moe.router_bias", d["states"])

    def test_read_parity_file_rejects(self):
        bad = os.path.join(self.tmp, "bad.h5")
        with open(bad, "w") as f:
            f.write("not hdf5")
        with self.assertRaisesRegex(mm.BadInput, "not an HDF5 file"):
            mm.read_parity_file(bad)
        empty = os.path.join(self.tmp, "empty.h5")
        h5py.File(empty, "w").close()
        with self.assertRaisesRegex(mm.BadInput, "config_toml"):
            mm.read_parity_file(empty)
        nograd = os.path.join(self.tmp, "nograd.h5")
        write_parity_file(nograd, tiny_toml(), {"embed": np.ones(2)}, {}, {}, {}, [[1]], [[1]], 1.0, 0.0)
        with self.assertRaisesRegex(mm.BadInput, "no gradient for embed"):
            mm.read_parity_file(nograd)

    def test_bench_table_into_a_result_file(self):
        sys.path.insert(0, ROOT)
        from reports import result_file
        path = os.path.join(self.tmp, "run.h5")
        with h5py.File(path, "w") as f:
            result_file.set_attribute(f, "schema_version", result_file.SCHEMA_VERSION)
            f.create_group("bench/other")
        row = {"config": "small", "config_path": "configs/small.toml", "layers": 8, "micro_batch": 8,
               "seq_len": 1024, "steps": 20, "step_time_us": 2.0e5, "tokens_per_s": 40960.0, "model_tflops": 23.3,
               "mfu": 0.0235, "peak_mem_gib": 30.5, "attention_backend": "cudnn", "attention_cudnn_refused": "",
               "peak_tflops": 989.0, "torch_version": "2.11"}
        for _ in range(2):  # a second write replaces the table
            mm.write_into(path, [mm.table_row(row)], mm.table_attributes(row, "moe_model_torch.py bench"), "cmd")
        with h5py.File(path, "r") as f:
            self.assertIn("other", f["bench"])
            t = result_file.read_table(f[f"bench/{mm.FAMILY}"])
            self.assertEqual(len(t), 1)
            self.assertEqual(list(t.columns), [c for c, _ in mm.COLUMNS])
            self.assertEqual(t["recipe"][0], "torch_bf16")
            self.assertEqual(t["shape"][0], "small l8 b8 t1024")
            self.assertAlmostEqual(t["mfu"][0], 0.0235)
            self.assertTrue(math.isnan(t["speedup"][0]))
        self.assertEqual(os.listdir(self.tmp), ["run.h5"])  # no temporary left behind

    def test_command_line_exit_codes(self):
        r = run_peer("parity", os.path.join(self.tmp, "missing.h5"))
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("is not a file", r.stderr)
        r = run_peer("bench", "--config", "configs/small.toml", "--train.seq_ln", "5")
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--train.seq_ln: no such key", r.stderr)
        r = run_peer("bench", "--config", "configs/small.toml", "--steps", "0")
        self.assertEqual(r.returncode, 2, r.stderr)
        r = run_peer("bench", "--config", "configs/small.toml", "--h5", self.tmp)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("is a folder", r.stderr)
        if torch is None:
            r = run_peer("bench", "--config", "configs/small.toml", "--train.seq_len", "128")
            self.assertEqual(r.returncode, 3, r.stderr)
            self.assertIn("PyTorch is not installed", r.stderr)
            path = os.path.join(self.tmp, "p.h5")
            write_parity_file(path, tiny_toml(), {"embed": np.ones(2)}, {"embed": np.ones(2)}, {}, {}, [[1]], [[1]],
                              1.0, 0.0)
            r = run_peer("parity", path)
            self.assertEqual(r.returncode, 3, r.stderr)


# ---- torch -----------------------------------------------------------------------------------------------------------

def expected_tensors(cfg):
    """{name: shape} of the trainer's parameters and states, from the brief of trainer/model (independent of the
    module structure of the peer)."""
    m, e = cfg["model"], cfg["moe"]
    d, H, V = m["hidden"], m["heads"], m["vocab_size"]
    nope, rope, dv = m["qk_nope_head_dim"], m["qk_rope_head_dim"], m["v_head_dim"]
    out = {"embed": (V, d), "norm": (d,), "lm_head": (V, d)}
    for l in range(m["layers"]):
        p = f"layers.{l}"
        out[f"{p}.attn_norm"] = (d,)
        out[f"{p}.ffn_norm"] = (d,)
        if m["q_lora_rank"]:
            out[f"{p}.attn.q_down"] = (m["q_lora_rank"], d)
            out[f"{p}.attn.q_norm"] = (m["q_lora_rank"],)
            out[f"{p}.attn.q_up"] = (H * (nope + rope), m["q_lora_rank"])
        else:
            out[f"{p}.attn.q_proj"] = (H * (nope + rope), d)
        out[f"{p}.attn.kv_down"] = (m["kv_lora_rank"] + rope, d)
        out[f"{p}.attn.kv_norm"] = (m["kv_lora_rank"],)
        out[f"{p}.attn.kv_up"] = (H * (nope + dv), m["kv_lora_rank"])
        out[f"{p}.attn.out"] = (d, H * dv)
        if l < m["n_dense_layers"]:
            out[f"{p}.mlp.fc1"] = (2 * m["dense_ffn"], d)
            out[f"{p}.mlp.fc2"] = (d, m["dense_ffn"])
        else:
            E, f, S = e["routed_experts"], e["expert_ffn"], e["shared_experts"]
            out[f"{p}.moe.router"] = (E, d)
            if e["router"] == "v3":
                out[f"{p}.moe.router_bias"] = (E,)
            out[f"{p}.moe.experts.fc1"] = (E, 2 * f, d)
            out[f"{p}.moe.experts.fc2"] = (E, d, f)
            if S:
                out[f"{p}.moe.shared.fc1"] = (2 * S * f, d)
                out[f"{p}.moe.shared.fc2"] = (d, S * f)
    return out


def seeded_dump(cfg, B, seed=0):
    """A parity dump made by the peer itself: BF16-representable weights, a batch with ignored targets, the routing
    the FP32 model chooses, and the FP32 model's own loss and gradients as "ours"."""
    g = torch.Generator().manual_seed(seed)
    model = mm.MoEModel(cfg)
    params = {}
    for name, t in model.named_tensors().items():
        if name.endswith("router_bias"):
            v = torch.randn(t.shape, generator=g) * 0.01
        elif t.ndim == 1:
            v = 1 + 0.1 * torch.randn(t.shape, generator=g)
        else:
            v = torch.randn(t.shape, generator=g) * 0.05
        params[name] = v.bfloat16().float().numpy()
    T, V = cfg["train"]["seq_len"], cfg["model"]["vocab_size"]
    seqs = torch.randint(0, V, (B, T + 1), generator=g)
    targets = seqs[:, 1:].clone()
    targets[:, ::7] = mm.IGNORE_INDEX
    dump = {"config": cfg, "config_path": "", "tokens": seqs[:, :-1].numpy(), "targets": targets.numpy(),
            "params": {n: v for n, v in params.items() if not n.endswith("router_bias")},
            "states": {n: v for n, v in params.items() if n.endswith("router_bias")}}
    model = mm.MoEModel(cfg)
    mm.load_into(model, dump)
    with torch.no_grad():
        _, _, used = model(torch.from_numpy(dump["tokens"]), torch.from_numpy(dump["targets"]))
    dump["routing"] = {l: idx.numpy() for l, idx in used.items()}  # the FP32 model's own choice
    own = mm.run_torch(dump, "cpu", bf16=False)
    dump.update(loss=own["loss"], aux_loss=own["aux_loss"], grads=own["grads"])
    return dump


@unittest.skipIf(torch is None, NO_TORCH)
class TorchModel(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(0)
        torch.set_float32_matmul_precision("highest")

    def test_names_and_shapes(self):
        for name, args in (("tiny", ()), ("tiny", (("model", "q_lora_rank", "0"), ("moe", "router", "v2"))),
                           ("tiny", (("moe", "shared_experts", "0"),))):
            cfg = preset(name, *args)
            with self.subTest(overrides=args):
                got = {n: tuple(t.shape) for n, t in mm.MoEModel(cfg).named_tensors().items()}
                self.assertEqual(got, expected_tensors(cfg))

    def test_rope_interleaved_pairs(self):
        T, D, theta = 9, 8, 10000.0
        cos, sin = mm.rope_tables(T, D, theta, "cpu")
        x = torch.randn(2, T, 3, D, dtype=torch.float64)
        y = mm.apply_rope(x, cos, sin).numpy()
        xn = x.numpy()
        for t in (0, 1, 8):
            for i in range(D // 2):
                a = np.float32(np.float32(t) * np.float32(theta ** (-2.0 * i / D)))
                c, s = math.cos(float(a)), math.sin(float(a))
                x0, x1 = xn[:, t, :, 2 * i], xn[:, t, :, 2 * i + 1]
                np.testing.assert_allclose(y[:, t, :, 2 * i], x0 * c - x1 * s, rtol=1e-6, atol=1e-6)
                np.testing.assert_allclose(y[:, t, :, 2 * i + 1], x0 * s + x1 * c, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(y[:, 0], xn[:, 0], rtol=1e-6)  # position 0: no rotation

    def test_route(self):
        logits = torch.randn(10, 8)
        bias = torch.zeros(8)
        bias[3] = 100.0  # expert 3 always selected by v3, its gate still from the score alone
        idx, gates, own, aux = mm.route(logits, bias, "v3", 2, 2.5, 0.0)
        self.assertTrue(bool((idx == 3).any(dim=1).all()))
        torch.testing.assert_close(gates.sum(dim=1), torch.full((10,), 2.5))
        s = torch.sigmoid(logits).gather(1, idx)
        torch.testing.assert_close(gates, 2.5 * s / s.sum(dim=1, keepdim=True))
        forced = torch.tensor([[0, 1]] * 10)
        idx, gates, own, aux = mm.route(logits, None, "v2", 2, 16.0, 0.003, forced)
        self.assertTrue(bool((idx == forced).all()))
        p = torch.softmax(logits, dim=-1)
        torch.testing.assert_close(gates, 16.0 * p[:, :2])
        f = torch.zeros(8)
        f[:2] = 8 * 10 / (2 * 10)
        torch.testing.assert_close(aux, 0.003 * (f * p.mean(dim=0)).sum())

    def test_parity_of_the_model_with_itself(self):
        for args in ((), (("moe", "router", "v2"), ("moe", "aux_alpha", "0.01"))):
            cfg = preset("tiny", ("train", "seq_len", "16"), *args)
            with self.subTest(overrides=args):
                dump = seeded_dump(cfg, B=2)
                fp32 = mm.run_torch(dump, "cpu", bf16=False)
                bf16 = mm.run_torch(dump, "cpu", bf16=True)
                report = mm.compare(dump, fp32, bf16)
                self.assertTrue(report["pass"], "\n".join(mm.report_lines(report)))
                self.assertTrue(all(r["rel_err_ours"] < 1e-5 for r in report["tensors"]))
                self.assertTrue(all(0 < r["rel_err_torch_bf16"] < 0.5 for r in report["tensors"]))
                if args:
                    self.assertGreater(fp32["aux_loss"], 0.0)
                broken = dict(dump, grads={**dump["grads"], "norm": dump["grads"]["norm"] * 3.0})
                self.assertEqual(mm.compare(broken, fp32, bf16)["failed_tensors"], ["norm"])

    def test_parity_command_on_a_file(self):
        tmp = tempfile.mkdtemp(prefix="fp4moe_parity_torch_")
        try:
            cfg = preset("tiny", ("train", "seq_len", "16"))
            dump = seeded_dump(cfg, B=2)
            path = os.path.join(tmp, "p.h5")
            with open(os.path.join(ROOT, "configs", "tiny.toml")) as f:
                text = f.read().replace("seq_len = 64", "seq_len = 16")
            write_parity_file(path, text, dump["params"], dump["grads"], dump["states"], dump["routing"],
                              dump["tokens"], dump["targets"], dump["loss"], dump["aux_loss"])
            out = os.path.join(tmp, "report.json")
            r = run_peer("parity", path, "--device", "cpu", "--json", out)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            with open(out) as f:
                report = json.load(f)
            self.assertTrue(report["pass"])
            self.assertEqual(len(report["tensors"]), len(dump["params"]))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


@unittest.skipIf(not HAS_CUDA, "needs torch with a CUDA device (the GPU machine)")
class TorchGpu(unittest.TestCase):
    def test_grouped_experts_match_the_loop(self):
        if not hasattr(torch, "_grouped_mm"):
            self.skipTest(f"torch {torch.__version__} has no torch._grouped_mm")
        g = torch.Generator(device="cuda").manual_seed(3)
        E, d, f, N, k = 8, 64, 32, 200, 2
        experts = mm.RoutedExperts(E, d, f).cuda().to(torch.bfloat16)
        with torch.no_grad():
            experts.fc1.normal_(0, 0.1, generator=g)
            experts.fc2.normal_(0, 0.1, generator=g)
        x = torch.randn(N, d, device="cuda", generator=g).bfloat16().requires_grad_()
        idx = torch.stack([torch.randperm(E - 1, device="cuda", generator=g)[:k] for _ in range(N)])  # expert 7 idle
        gates = torch.rand(N, k, device="cuda", generator=g).requires_grad_()
        results = []
        for grouped in (False, True):
            experts.grouped = grouped
            for t in (x, gates, experts.fc1, experts.fc2):
                t.grad = None
            y = experts(x, idx, gates)
            y.float().square().sum().backward()
            results.append([y.float(), x.grad.float(), gates.grad.float(), experts.fc1.grad.float(),
                            experts.fc2.grad.float()])
        for name, a, b in zip(("y", "dx", "dgates", "dfc1", "dfc2"), *results):
            self.assertTrue(bool(torch.isfinite(b).all()), name)
            self.assertLess(float((a - b).norm() / a.norm().clamp_min(1e-30)), 2e-2, name)
        self.assertEqual(float(results[1][4][7].abs().max()), 0.0)  # the idle expert: zero gradient

    def test_sdpa_backends_match_the_math_core(self):
        B, T, H, dq, dv = 2, 128, 4, 48, 32
        q, k = (torch.randn(B, T, H, dq, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        v = torch.randn(B, T, H, dv, device="cuda", dtype=torch.bfloat16)
        ref = mm.CausalAttention("math")(q.float(), k.float(), v.float(), dq ** -0.5)
        ran = 0
        for backend in ("cudnn", "flash"):
            try:
                o = mm.CausalAttention(backend)(q, k, v, dq ** -0.5)
            except RuntimeError as e:
                print(f"{backend} does not run here: {e}", file=sys.stderr)
                continue
            ran += 1
            self.assertEqual(tuple(o.shape), (B, T, H, dv))
            self.assertLess(float((o.float() - ref).norm() / ref.norm()), 2e-2, backend)
        self.assertGreater(ran, 0, "neither SDPA backend ran")

    def test_bench_runs(self):
        r = run_peer("bench", "--config", "configs/tiny.toml", "--steps", "2", "--warmup", "1")
        self.assertEqual(r.returncode, 0, r.stderr)
        row = json.loads(r.stdout.strip().splitlines()[-1])
        self.assertGreater(row["tokens_per_s"], 0)
        self.assertIn(row["attention_backend"], ("cudnn", "flash"))
        self.assertTrue(math.isfinite(row["loss_last"]))


if __name__ == "__main__":
    unittest.main()
