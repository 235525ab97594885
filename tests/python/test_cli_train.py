"""`fp4moe train`: the dry run of every preset (parameter counts checked against an independent count from the
preset read with Python's own TOML parser), command-line overrides, the run options checked before any device is
used, and a clear one-line error (exit code 2, no source location) for each bad configuration. Seeded token
shards in a temporary folder stand in for `make data`. The binary is $FP4MOE_BUILD/fp4moe."""

import os
import random
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import tomllib
import unittest
from array import array

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts", "data"))
import token_shard  # noqa: E402

PRESETS = ("tiny", "small", "v3", "v2")


def binary():
    build = os.environ.get("FP4MOE_BUILD", os.path.join(ROOT, "build"))
    return os.path.join(build, "fp4moe")


def write_shards(folder, vocab, seed, tokens_per_split=(10000, 10000)):
    """train_000.bin and val_000.bin of tokens_per_split[0] and [1] + 1 tokens. 10001 tokens hold one batch of every
    preset (small: 8 rows of 1024 + 1 tokens)."""
    os.makedirs(folder, exist_ok=True)
    rng = random.Random(seed)
    for split, n in zip(("train", "val"), tokens_per_split):
        tokens = array("H", (rng.randrange(3, vocab) if rng.random() > 0.01 else 2 for _ in range(n)))
        tokens.append(2)
        token_shard.write_shard(os.path.join(folder, f"{split}_000.bin"), tokens, vocab, 2)


def expected_counts(cfg):
    """Total and activated parameters per token, from the architecture (trainer/flops.h's conventions)."""
    m, e = cfg["model"], cfg["moe"]
    d, heads = m["hidden"], m["heads"]
    dq = m["qk_nope_head_dim"] + m["qk_rope_head_dim"]
    q = d * m["q_lora_rank"] + m["q_lora_rank"] + m["q_lora_rank"] * heads * dq if m["q_lora_rank"] else d * heads * dq
    kv = d * (m["kv_lora_rank"] + m["qk_rope_head_dim"]) + m["kv_lora_rank"]
    kv += m["kv_lora_rank"] * heads * (m["qk_nope_head_dim"] + m["v_head_dim"])
    attn = q + kv + heads * m["v_head_dim"] * d + 2 * d  # with the layer's two norms
    expert = 3 * d * e["expert_ffn"]
    bias = e["routed_experts"] if e["router"] == "v3" else 0
    dense_layer = attn + 3 * d * m["dense_ffn"]
    dense, moe = m["n_dense_layers"], m["layers"] - m["n_dense_layers"]
    router = e["routed_experts"] * d + bias
    table = m["vocab_size"] * d
    total = 2 * table + d + dense * dense_layer + moe * (attn + router + (e["routed_experts"] + e["shared_experts"]) * expert)
    activated = table + 2 * d + dense * dense_layer + moe * (attn + router + (e["top_k"] + e["shared_experts"]) * expert)
    return total, activated


class TrainCli(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.exe = binary()
        if not os.access(cls.exe, os.X_OK):
            raise unittest.SkipTest(f"{cls.exe} is not built (set FP4MOE_BUILD to the build folder)")
        cls.tmp = tempfile.mkdtemp(prefix="fp4moe_cli_train_")
        cls.data = os.path.join(cls.tmp, "shards")
        write_shards(cls.data, 32768, 20261129)
        cls.small_vocab = os.path.join(cls.tmp, "shards_1000")
        write_shards(cls.small_vocab, 1000, 7)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def train(self, *args, config="tiny", data=None, expect_rc=0):
        cmd = [self.exe, "train"]
        if config:
            cmd += ["--config", os.path.join("configs", f"{config}.toml") if config in PRESETS else config]
        cmd += ["--train.data_dir", data or self.data, *args]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT)
        self.assertEqual(r.returncode, expect_rc, f"{' '.join(cmd)}\nstdout: {r.stdout}\nstderr: {r.stderr}")
        return r

    def rejected(self, *parts, args=(), **kw):
        r = self.train("--dry-run", *args, expect_rc=2, **kw)
        lines = r.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertTrue(lines[0].startswith("fp4moe train: error: "), r.stderr)
        self.assertIsNone(re.search(r"\.cpp:\d+\)", lines[0]), f"source location in a user error: {lines[0]}")
        for p in parts:
            self.assertIn(p, lines[0])
        self.assertEqual(r.stdout, "")

    @staticmethod
    def field(out, name):
        m = re.search(rf"^{re.escape(name)}: (\d+)", out, re.M)
        return int(m.group(1)) if m else None

    def test_dry_run_of_every_preset_matches_an_independent_count(self):
        for name in PRESETS:
            with self.subTest(name):
                with open(os.path.join(ROOT, "configs", f"{name}.toml"), "rb") as f:
                    cfg = tomllib.load(f)  # the presets are plain TOML, readable by any parser
                r = self.train("--dry-run", config=name)
                total, activated = expected_counts(cfg)
                self.assertEqual(self.field(r.stdout, "parameters total"), total, r.stdout)
                self.assertEqual(self.field(r.stdout, "parameters activated per token"), activated, r.stdout)
                t = cfg["train"]
                tokens = t["seq_len"] * t["micro_batch"] * t["grad_accum"]
                self.assertIn(f"tokens per step: {tokens} ", r.stdout)
                self.assertIn(f"hidden {cfg['model']['hidden']},", r.stdout)
                self.assertRegex(r.stdout, r"model flops per token \(seq_len \d+, causal\): forward [0-9.e+]+")
                self.assertEqual(r.stderr, "")

    def test_production_shapes_give_the_published_totals(self):
        # DeepSeek-V3 (671B total, 37B activated) and V2 (236B, 21B), published to the nearest billion; their
        # vocabularies fit no uint16 token shard, hence --no-data-check.
        for name, layers, dense, experts, vocab, total_b, activated_b in (("v3", 61, 3, 256, 129280, 671, 37),
                                                                          ("v2", 60, 1, 160, 102400, 236, 21)):
            with self.subTest(name):
                with open(os.path.join(ROOT, "configs", f"{name}.toml"), "rb") as f:
                    cfg = tomllib.load(f)
                cfg["model"].update(layers=layers, n_dense_layers=dense, vocab_size=vocab)
                cfg["moe"]["routed_experts"] = experts
                r = self.train("--dry-run", "--no-data-check", "--model.layers", str(layers), "--model.n_dense_layers",
                               str(dense), "--moe.routed_experts", str(experts), "--model.vocab_size", str(vocab),
                               config=name)
                total, activated = expected_counts(cfg)
                self.assertEqual(self.field(r.stdout, "parameters total"), total)
                self.assertEqual(self.field(r.stdout, "parameters activated per token"), activated)
                self.assertEqual(round(total / 1e9), total_b)
                self.assertEqual(round(activated / 1e9), activated_b)
                self.assertIn("not checked", r.stdout)
        self.train("--no-data-check", expect_rc=2)  # only with --dry-run

    def test_command_line_overrides_the_file(self):
        base = self.train("--dry-run")
        wider = self.train("--dry-run", "--moe.top_k", "3")
        with open(os.path.join(ROOT, "configs", "tiny.toml"), "rb") as f:
            cfg = tomllib.load(f)
        m, e = cfg["model"], cfg["moe"]
        per_expert = 3 * m["hidden"] * e["expert_ffn"] * (m["layers"] - m["n_dense_layers"])
        grow = (3 - e["top_k"]) * per_expert
        self.assertEqual(self.field(wider.stdout, "parameters activated per token"),
                         self.field(base.stdout, "parameters activated per token") + grow)
        self.assertIn("top-3", wider.stdout)
        r = self.train("--dry-run", "--recipe.routed_experts", "mxfp4", "--recompute.modules", "moe_act", "core_attn")
        self.assertIn("routed_experts mxfp4", r.stdout)
        self.assertIn("recompute: moe_act core_attn", r.stdout)

    def test_run_options_are_checked_before_the_device(self):
        # Each fails before anything is allocated, with or without a GPU.
        def refused(*args, parts=()):
            r = self.train(*args, expect_rc=2)
            lines = r.stderr.strip().splitlines()
            self.assertEqual(len(lines), 1, r.stderr)
            self.assertTrue(lines[0].startswith("fp4moe train: error: "), r.stderr)
            self.assertIsNone(re.search(r"\.cpp:\d+\)", lines[0]), lines[0])
            for p in parts:
                self.assertIn(p, lines[0])
            self.assertEqual(r.stdout, "")

        missing = os.path.join(self.tmp, "missing.ckpt")
        refused("--resume", missing, parts=("--resume", missing, "does not exist"))
        refused("--resume", "latest", parts=("--resume latest needs train.checkpoint_dir",))
        refused("--log-interval", "0", parts=("--log-interval must be >= 1",))
        refused("--memory-budget", "0", parts=("--memory-budget must be a finite number of GiB in (0, ",))
        refused("--synthetic-data", "--run", "a/b", parts=("run name 'a/b'",))
        refused("--synthetic-data", "--train.eval_interval", "5", "--train.eval_steps", "0",
                parts=("train.eval_steps = 0 evaluates the whole validation split", "synthetic data"))
        refused("--data", os.path.join(self.tmp, "nowhere"), parts=("nowhere", "not a folder"))

    def test_out_never_destroys_a_file(self):
        # Each refusal comes before any device is used (with or without a GPU) and leaves the file as it was.
        def refused(*args, parts=(), config="tiny"):
            r = self.train("--synthetic-data", *args, config=config, expect_rc=2)
            lines = r.stderr.strip().splitlines()
            self.assertEqual(len(lines), 1, r.stderr)
            self.assertTrue(lines[0].startswith("fp4moe train: error: "), r.stderr)
            self.assertIsNone(re.search(r"\.cpp:\d+\)", lines[0]), lines[0])
            for p in parts:
                self.assertIn(p, lines[0])

        earlier = os.path.join(self.tmp, "earlier.h5")
        with open(earlier, "wb") as f:
            f.write(b"an earlier result")
        refused("--out", earlier, parts=(f"--out '{earlier}' already exists", "pass --overwrite to replace it"))
        refused("--out", earlier, "--dry-run", parts=(f"--out '{earlier}' already exists",))
        self.train("--synthetic-data", "--out", earlier, "--overwrite", "--dry-run")
        with open(earlier, "rb") as f:
            self.assertEqual(f.read(), b"an earlier result")

        config = os.path.join(self.tmp, "own_tiny.toml")
        shutil.copyfile(os.path.join(ROOT, "configs", "tiny.toml"), config)
        link = os.path.join(self.tmp, "config_link.h5")
        os.symlink(config, link)
        refused("--out", link, "--overwrite", config=config,
                parts=(f"--out '{link}' is the same file as --config '{config}'",))
        with open(config, "rb") as a, open(os.path.join(ROOT, "configs", "tiny.toml"), "rb") as b:
            self.assertEqual(a.read(), b.read())

        fifo = os.path.join(self.tmp, "fifo")
        os.mkfifo(fifo)
        refused("--out", fifo, "--overwrite",
                parts=(f"--out '{fifo}' is a FIFO (named pipe), expected a regular file",))
        self.assertTrue(stat.S_ISFIFO(os.lstat(fifo).st_mode))
        refused("--out", "/dev/null", "--overwrite",
                parts=("--out '/dev/null' is a character device, expected a regular file",))
        self.assertTrue(stat.S_ISCHR(os.stat("/dev/null").st_mode))

        r = subprocess.run([self.exe, "train", "--help"], capture_output=True, text=True, timeout=60)
        self.assertIn("--overwrite", r.stdout)

    def test_bad_shapes_are_rejected(self):
        self.rejected("model.heads = 5 does not divide model.hidden = 64", args=("--model.heads", "5"))
        self.rejected("moe.top_k = 9 exceeds moe.routed_experts = 8", args=("--moe.top_k", "9"))
        self.rejected("model.n_dense_layers = 3", "model.layers = 2", args=("--model.n_dense_layers", "3"))
        self.rejected("moe.expert_ffn = 48", "multiple of 32",
                      args=("--moe.expert_ffn", "48", "--recipe.routed_experts", "mxfp4"))

    def test_parallel_section_sets_the_estimated_layout(self):
        one = self.train("--dry-run").stdout
        self.assertIn("memory estimate, 1 GPU", one)
        r = self.train("--dry-run", "--parallel.pp", "2", "--parallel.dp", "2", "--parallel.ep", "2",
                       "--parallel.micro_batches", "4", "--train.grad_accum", "4", "--parallel.zero1", "true",
                       "--parallel.stage", "0")
        self.assertIn("memory estimate, 4 GPUs (the configuration's [parallel] section)", r.stdout)
        self.assertIn("pp 2 tp 1 dp 2 ep 2, ZeRO-1; stage 0 (layers 0-0), 2 micro-batches", r.stdout)
        self.assertIn("(4 per step)", r.stdout)
        # Training emulates one GPU of the layout; what it cannot emulate or support is refused, one line, before
        # any device is looked for.
        for args, words in ((("--parallel.tp", "2"), ("parallel.tp = 2", "tensor parallelism is not emulated")),
                            (("--parallel.ep", "2", "--parallel.dp", "2", "--parallel.routed_load", "1.5"),
                             ("parallel.routed_load = 1.5", "not emulated")),
                            (("--parallel.pp", "2", "--parallel.stage", "0"),
                             ("train.eval_interval = 10", "stage 0", "no LM head")),
                            (("--parallel.pp", "2", "--parallel.stage", "1", "--train.checkpoint_dir", "ckpt"),
                             ("train.checkpoint_dir = 'ckpt'", "emulated layout")),
                            # a data-parallel replica under ZeRO-1 holds only its optimizer shard: no checkpoint
                            (("--parallel.dp", "2", "--parallel.zero1", "true", "--train.checkpoint_dir", "ckpt"),
                             ("train.checkpoint_dir", "ZeRO-1 shard"))):
            r = self.train(*args, expect_rc=2)
            for w in words:
                self.assertIn(w, r.stderr)
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)

    def test_bad_parallel_layouts_are_rejected(self):
        self.rejected("[parallel]", "tp = 3 must divide model.heads = 4", args=("--parallel.tp", "3"))
        self.rejected("[parallel]", "ep = 4 must divide dp x tp = 2",
                      args=("--parallel.dp", "2", "--parallel.ep", "4"))
        self.rejected("parallel.stage = 1", "parallel.pp = 1", args=("--parallel.stage", "1"))
        self.rejected("parallel.micro_batches must be >= 1, got 0", args=("--parallel.micro_batches", "0"))
        self.rejected("train.grad_accum = 1 must equal parallel.micro_batches = 4",
                      args=("--parallel.pp", "2", "--parallel.micro_batches", "4"))

    def test_bad_names_are_rejected(self):
        self.rejected("recipe.dense_mlp = 'fp6'", "bf16, fp8 or mxfp4", args=("--recipe.dense_mlp", "fp6"))
        self.rejected("unknown module 'attn'", "mla_up_proj", args=("--recompute.modules", "attn"))
        self.rejected("'full'", "cannot be combined", args=("--recompute.modules", "full", "moe"))
        self.rejected("moe.router = 'v1'", args=("--moe.router", "v1"))
        self.rejected("train.non_finite = 'retry'", args=("--train.non_finite", "retry"))
        # Unknown options and stray values on the command line: one line, the arguments in the order given.
        self.rejected("unexpected arguments '--model.hiddn 64'", args=("--model.hiddn", "64"))
        self.rejected("unexpected arguments '--bogus 1'", args=("--bogus", "1"))
        self.rejected("--log-interval", "x", args=("--log-interval", "x"))

    def test_floats_used_in_float32_are_representable(self):
        self.rejected("train.eps = 1e-50 is below the smallest normal float32 1.17549e-38; it is used in float32",
                      args=("--train.eps", "1e-50"))
        self.rejected("model.norm_eps = 1e-320 is below the smallest normal float32",
                      args=("--model.norm_eps", "1e-320"))
        self.rejected("model.rope_theta = 1e+300 exceeds the largest float32", args=("--model.rope_theta", "1e300"))
        for gib in ("1e300", "nan", "0"):
            self.rejected("--memory-budget must be a finite number of GiB in (0, ", args=("--memory-budget", gib))

    def test_bad_files_are_rejected(self):
        unknown = os.path.join(self.tmp, "unknown.toml")
        with open(os.path.join(ROOT, "configs", "tiny.toml")) as f:
            text = f.read()
        with open(unknown, "w") as f:
            f.write(text.replace("[moe]\n", "[moe]\nexperts = 8\n"))
        self.rejected(unknown, "unknown option 'moe.experts'", config=unknown)
        missing = os.path.join(self.tmp, "missing.toml")
        self.rejected(missing, "does not exist", config=missing)
        self.rejected("no configuration", "--config", config=None)

    def write_config(self, name, text):
        path = os.path.join(self.tmp, name)
        with open(path, "wb") as f:
            f.write(text.encode())
        return path

    def tiny_text(self):
        with open(os.path.join(ROOT, "configs", "tiny.toml")) as f:
            return f.read()

    def test_toml_files_read_as_toml(self):
        # A byte order mark, '#' inside a string, comments after values and a recompute list over several lines.
        text = "\ufeff" + self.tiny_text().replace('name = "tiny"', 'name = "tiny#2"  # a comment').replace(
            "modules = []", 'modules = [\n  "moe_act",  # SwiGLU\n  "core_attn",\n]')
        r = self.train("--dry-run", config=self.write_config("full.toml", text))
        self.assertIn("model: tiny#2\n", r.stdout)
        self.assertIn("recompute: moe_act core_attn\n", r.stdout)
        bad = self.write_config("unterminated.toml", self.tiny_text().replace('name = "tiny"', 'name = "tiny'))
        self.rejected(bad, "line 7, column", config=bad)
        twice = self.write_config("twice.toml", self.tiny_text().replace("hidden = 64\n", "hidden = 64\nhidden = 64\n"))
        self.rejected(twice, "'hidden'", config=twice)
        wrong = self.write_config("wrong.toml", self.tiny_text().replace("hidden = 64", 'hidden = "64"'))
        self.rejected(wrong, 'model.hidden = "64": expected an integer, got a string', config=wrong)

    def test_what_cannot_run_is_rejected_before_anything_runs(self):
        self.rejected("train.lr must be a finite number > 0, got inf", args=("--train.lr", "inf"))
        self.rejected("train.eps must be a finite number > 0, got nan", args=("--train.eps", "nan"))
        self.rejected("moe.routed_scale must be a finite number > 0, got inf", args=("--moe.routed_scale", "inf"))
        self.rejected("train.seed must be >= 0, got -1", args=("--train.seed=-1",))
        self.rejected("tokens per step", "does not fit in a 64-bit integer",
                      args=("--train.seq_len", "1048576", "--train.micro_batch", "1048576", "--train.grad_accum",
                            "1073741824"))
        no_hidden = self.write_config("no_hidden.toml", self.tiny_text().replace("hidden = 64\n", ""))
        self.rejected(f"model.hidden is missing (set it in the config file '{no_hidden}' or with --model.hidden)",
                      config=no_hidden)

    def test_each_split_must_hold_one_batch(self):
        # tiny: 4 rows of 64 + 1 tokens; 200 tokens hold 3 windows.
        short_val = os.path.join(self.tmp, "short_val")
        write_shards(short_val, 32768, 3, tokens_per_split=(10000, 199))
        self.rejected(short_val, "the val shards hold 3 windows of train.seq_len + 1 = 65 tokens",
                      "train.micro_batch = 4", data=short_val)
        self.train("--dry-run", "--train.eval_interval", "0", data=short_val)
        self.train("--dry-run", "--train.micro_batch", "3", data=short_val)
        short_train = os.path.join(self.tmp, "short_train")
        write_shards(short_train, 32768, 4, tokens_per_split=(199, 10000))
        self.rejected(short_train, "the train shards hold 3 windows", data=short_train)

    def test_bad_data_is_rejected(self):
        missing = os.path.join(self.tmp, "no_shards_here")
        self.rejected(missing, "not a folder", data=missing)
        empty = os.path.join(self.tmp, "empty")
        os.makedirs(empty, exist_ok=True)
        self.rejected(empty, "train", data=empty)
        shard = os.path.join(self.small_vocab, "train_000.bin")
        self.rejected(shard, "1000", "32768", data=self.small_vocab)
        self.rejected("model.vocab_size = 129280 exceeds 65536", args=("--model.vocab_size", "129280"))


if __name__ == "__main__":
    unittest.main()
