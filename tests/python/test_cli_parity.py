"""`fp4moe parity`: every option error gives one line and exit code 2 before anything runs, and without a GPU the
command says so (exit 2); --dry-run prints the configuration TOML the file carries, which the PyTorch model reads.
With a GPU (the GPU machine): the file's layout, the synthetic batch bit for bit, the routing, finite and nonzero
gradients, a loss near ln(vocab) at initialisation, bitwise repeatability, and, when torch is installed, the parity
check itself (benchmarks/peers/moe_model_torch.py parity FILE, exit 0) on the v3 and v2 routers.
The binary is $FP4MOE_BUILD/fp4moe (ctest sets FP4MOE_BUILD to the build folder)."""

import math
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import tomllib
import unittest

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli_test_util import binary  # noqa: E402
from test_moe_model_torch import PEER, expected_tensors, mm  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MASK = (1 << 64) - 1
IGNORE_EVERY = 17


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def expected_batch(seed, B, T, V):
    """cli/cmd_parity.cpp's synthetic batch: tokens [B, T] and targets (shifted, every 17th position ignored)."""
    key = splitmix64(seed)
    s = np.array([[splitmix64((key + b * (T + 1) + t) & MASK) % V for t in range(T + 1)] for b in range(B)])
    targets = s[:, 1:].copy()
    targets.reshape(-1)[IGNORE_EVERY - 1::IGNORE_EVERY] = -100
    return s[:, :-1], targets


class ParityCli(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.exe = binary()
        if not os.access(cls.exe, os.X_OK):
            raise unittest.SkipTest(f"{cls.exe} is not built (set FP4MOE_BUILD to the build folder)")
        env = subprocess.run([cls.exe, "env"], capture_output=True, text=True, timeout=60)
        cls.gpu = env.returncode == 0 and "no CUDA device" not in env.stdout
        cls.tmp = tempfile.mkdtemp(prefix="fp4moe_cli_parity_")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def parity(self, *args, expect_rc=0, timeout=300):
        cmd = [self.exe, "parity", *args]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
        self.assertEqual(r.returncode, expect_rc, f"{' '.join(cmd)}\nstdout: {r.stdout}\nstderr: {r.stderr}")
        return r

    def error(self, *args, words):
        r = self.parity(*args, expect_rc=2)
        lines = r.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertTrue(lines[0].startswith("fp4moe parity: error: "), r.stderr)
        self.assertIn(words, lines[0])
        self.assertIsNone(re.search(r"\.(cpp|cu|h):\d+\)", lines[0]), "a source location reached the user")
        self.assertEqual(r.stdout, "")
        return lines[0]

    def test_option_errors(self):
        out = os.path.join(self.tmp, "never.h5")
        tiny = ("--config", "configs/tiny.toml")
        self.error("--out", out, words="no configuration: pass --config FILE")
        self.error(*tiny, words="no output: pass --out FILE.h5")
        self.error(*tiny, "--out", self.tmp, words="is a folder")
        self.error(*tiny, "--out", os.path.join(self.tmp, "missing", "p.h5"), words="does not exist")
        self.error(*tiny, "--out", out, "--batch", "5", words="--batch 5 must be in [1, train.micro_batch = 4]")
        self.error(*tiny, "--out", out, "--batch", "0", words="--batch 0 must be in")
        self.error(*tiny, "--out", out, "--seed", "-1", words="--seed -1 must be >= 0")
        self.error("--config", "configs/none.toml", "--out", out, words="configs/none.toml")
        self.error(*tiny, "--out", out, "--model.heads", "5", words="model.heads = 5 does not divide")
        self.error(*tiny, "--out", out, "--moe.top_k", "9", words="moe.top_k = 9 exceeds")
        # An argument the parser does not know: one line, the arguments in the order given.
        self.error(*tiny, "--out", out, "--no-such-option", "1", words="unexpected arguments '--no-such-option 1'")
        # A model name the configuration TOML could not carry as it is (a line break, a control character).
        self.error(*tiny, "--dry-run", "--model.name", "two\nlines", words="model.name has character 0x0a")
        self.error(*tiny, "--dry-run", "--model.name", "bell\x07", words="model.name has character 0x07")
        self.assertFalse(os.path.exists(out))

    def test_output_is_never_an_input_or_a_special_file(self):
        config = os.path.join(self.tmp, "tiny.toml")
        shutil.copyfile(os.path.join(ROOT, "configs", "tiny.toml"), config)
        link = os.path.join(self.tmp, "config_link.h5")
        os.symlink(config, link)
        fifo = os.path.join(self.tmp, "fifo")
        os.mkfifo(fifo)
        with open(config, "rb") as f:
            before = f.read()
        for out, words in ((config, f"--out '{config}' is the same file as --config '{config}'"),
                           (link, f"--out '{link}' is the same file as --config '{config}'"),
                           (fifo, f"--out '{fifo}' is a FIFO (named pipe), expected a regular file"),
                           ("/dev/null", "--out '/dev/null' is a character device, expected a regular file")):
            with self.subTest(out=out):
                self.error("--config", config, "--out", out, words=words)
        with open(config, "rb") as f:
            self.assertEqual(f.read(), before)
        self.assertTrue(os.path.islink(link))
        self.assertTrue(stat.S_ISFIFO(os.lstat(fifo).st_mode))
        self.assertTrue(stat.S_ISCHR(os.stat("/dev/null").st_mode))

    def test_without_a_gpu(self):
        if self.gpu:
            self.skipTest("this machine has a GPU")
        out = os.path.join(self.tmp, "nogpu.h5")
        line = self.error("--config", "configs/tiny.toml", "--out", out, words="runs the model on a GPU")
        self.assertIn("no CUDA device", line)
        self.assertFalse(os.path.exists(out))

    def test_dry_run_prints_the_configuration(self):
        r = self.parity("--config", "configs/tiny.toml", "--dry-run", "--moe.router", "v2", "--moe.aux_alpha",
                        "0.003", "--model.name", 'quote " and \\ backslash')
        cfg = tomllib.loads(r.stdout)
        mm.check_config(cfg, "dry run")
        with open(os.path.join(ROOT, "configs", "tiny.toml"), "rb") as f:
            preset = tomllib.load(f)
        for section in ("model", "moe"):
            for key, value in preset[section].items():
                got = cfg[section][key]
                if key == "router":
                    self.assertEqual(got, "v2")
                elif key == "aux_alpha":
                    self.assertEqual(got, 0.003)
                elif key == "name":
                    self.assertEqual(got, 'quote " and \\ backslash')
                elif isinstance(value, (str, bool)):  # model.attention_backend, attention_deterministic
                    self.assertEqual(got, value, f"{section}.{key}")
                else:
                    self.assertEqual(float(got), float(value), f"{section}.{key}")
        self.assertEqual(cfg["train"]["seq_len"], preset["train"]["seq_len"])
        self.assertEqual(cfg["recipe"], preset["recipe"])

    # ---- with a GPU ---------------------------------------------------------------------------------------------

    def dump(self, name, *args):
        if not self.gpu:
            self.skipTest("no CUDA device (the GPU machine runs this)")
        path = os.path.join(self.tmp, f"{name}.h5")
        r = self.parity("--config", "configs/tiny.toml", "--out", path, *args)
        self.assertIn("loss", r.stdout)
        return path

    def check_file(self, path, cfg, seed, B):
        m, e = cfg["model"], cfg["moe"]
        T, V, k, E = cfg["train"]["seq_len"], m["vocab_size"], e["top_k"], e["routed_experts"]
        with h5py.File(path, "r") as f:
            self.assertEqual(f.attrs["schema_version"], 1)
            self.assertEqual(f.attrs["config_path"], "configs/tiny.toml")
            self.assertEqual((f.attrs["seed"], f.attrs["batch"], f.attrs["seq_len"]), (seed, B, T))
            tokens, targets = expected_batch(seed, B, T, V)
            np.testing.assert_array_equal(f["tokens"][()], tokens)
            np.testing.assert_array_equal(f["targets"][()], targets)
            self.assertEqual(f.attrs["valid_targets"], int((targets != -100).sum()))
            loss = float(f["loss"][()])
            self.assertLess(abs(loss - math.log(V)), 0.5, "the loss at initialisation should be near ln(vocab)")
            names = {n: tuple(t.shape) for n, t in f["params"].items()}
            expected = expected_tensors(cfg)
            states = {n for n in expected if n.endswith("router_bias")}
            self.assertEqual(names, {n: s for n, s in expected.items() if n not in states})
            self.assertEqual(set(f["states"]) if "states" in f else set(), states)
            for n in names:
                g, p = f["grads"][n][()], f["params"][n][()]
                self.assertEqual(g.shape, p.shape, n)
                self.assertTrue(np.isfinite(g).all(), n)
                self.assertGreater(float(np.abs(g).max()), 0.0, f"{n}: zero gradient")
                bits = p.view(np.uint32)
                self.assertTrue((bits & 0xFFFF == 0).all(), f"{n}: not BF16 values")
            moe_layers = [l for l in range(m["layers"]) if l >= m["n_dense_layers"]]
            self.assertEqual(sorted(int(l) for l in f["routing"]), moe_layers)
            for l in moe_layers:
                r = f["routing"][str(l)][()]
                self.assertEqual(r.shape, (B * T, k))
                self.assertTrue(((r >= 0) & (r < E)).all())
                self.assertTrue((np.sort(r, axis=1)[:, 1:] != np.sort(r, axis=1)[:, :-1]).all(), "repeated expert")
            return loss, float(f["aux_loss"][()]), {n: f["grads"][n][()] for n in names}

    def torch_parity(self, path):
        if mm.torch is None or not mm.torch.cuda.is_available():
            self.skipTest("torch with CUDA is not installed: the parity check itself is skipped")
        report = os.path.join(self.tmp, os.path.basename(path) + ".json")
        r = subprocess.run([sys.executable, PEER, "parity", path, "--json", report], capture_output=True, text=True,
                           timeout=600, cwd=ROOT)
        print(r.stdout, file=sys.stderr)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_v3_dump_and_parity(self):
        path = self.dump("v3", "--seed", "7", "--batch", "2")
        cfg = mm.load_config(os.path.join(ROOT, "configs", "tiny.toml"))
        loss, aux, grads = self.check_file(path, cfg, 7, 2)
        self.assertEqual(aux, 0.0)
        again = self.dump("v3_again", "--seed", "7", "--batch", "2")
        loss2, _, grads2 = self.check_file(again, cfg, 7, 2)
        self.assertEqual(loss, loss2)
        for n in grads:
            np.testing.assert_array_equal(grads[n], grads2[n], err_msg=f"{n}: not bitwise repeatable")
        self.torch_parity(path)

    def test_v2_dump_and_parity(self):
        path = self.dump("v2", "--moe.router", "v2", "--moe.aux_alpha", "0.01", "--moe.routed_scale", "2")
        cfg = mm.load_config(os.path.join(ROOT, "configs", "tiny.toml"), [("moe", "router", "v2"),
                                                                          ("moe", "aux_alpha", "0.01")])
        _, aux, _ = self.check_file(path, cfg, 1234, 4)
        self.assertGreater(aux, 0.0)
        self.torch_parity(path)

    def test_direct_query_projection(self):
        path = self.dump("qproj", "--model.q_lora_rank", "0", "--batch", "1")
        cfg = mm.load_config(os.path.join(ROOT, "configs", "tiny.toml"), [("model", "q_lora_rank", "0")])
        self.check_file(path, cfg, 1234, 1)
        self.torch_parity(path)


if __name__ == "__main__":
    unittest.main()
