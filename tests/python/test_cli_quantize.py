"""`fp4moe quantize` on the CPU: output datasets, shapes and layouts decoded independently with numpy, the block
scales against the format rules, small dequantization errors, and a clear one-line error (exit code 2) for each
bad input. The binary is $FP4MOE_BUILD/fp4moe (ctest sets FP4MOE_BUILD to the build folder)."""

import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import unittest

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli_test_util import binary  # noqa: E402

E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float64)


def e4m3_table():
    """Value of each E4M3 (OCP E4M3FN) byte; 0x7F and 0xFF are NaN."""
    t = np.empty(256)
    for b in range(256):
        e, m = (b >> 3) & 15, b & 7
        v = m * 2.0**-9 if e == 0 else (8 + m) * 2.0 ** (e - 10)
        t[b] = np.nan if (b & 0x7F) == 0x7F else (-v if b & 0x80 else v)
    return t


E4M3 = e4m3_table()


def bf16_bits(values):
    """float32 -> BF16 bits, round to nearest even (finite inputs)."""
    u = np.asarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_to_f64(bits):
    return (np.asarray(bits, dtype=np.uint32) << 16).view(np.float32).astype(np.float64)


def pow2_fp8_exponent(amax):
    """The smallest p with amax <= 448 * 2^p (exact), as the pow2 FP8 block scale."""
    p = int(np.ceil(np.log2(amax / 448.0)))
    while amax > 448.0 * 2.0**p:
        p += 1
    while amax <= 448.0 * 2.0 ** (p - 1):
        p -= 1
    return p


def splitmix64_at(seed, n):
    """Output number n of the splitmix64 stream seeded `seed` (kernels/quant/mx_random.h)."""
    mask = (1 << 64) - 1
    z = (seed + (n + 1) * 0x9E3779B97F4A7C15) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return z ^ (z >> 31)


def transform_matrix(transform, k, rht_seed):
    """T [K, K] in float64 with y = x T (kernels/quant/mx_transform.h): block-diagonal Walsh-Hadamard in Sylvester
    order, entry (i, j) = (-1)^popcount(i & j) / sqrt(n); rht: diag(s) H16, s_k = -1 where bit k mod 64 of
    splitmix64_at(rht_seed, k // 64) is set."""
    n = 32 if transform == "h32" else 16
    i = np.arange(n)
    h = np.array([[(-1.0) ** bin(a & b).count("1") for b in i] for a in i]) / np.sqrt(n)
    t = np.kron(np.eye(k // n), h)
    if transform == "rht":
        s = np.array([-1.0 if (splitmix64_at(rht_seed, c // 64) >> (c % 64)) & 1 else 1.0 for c in range(k)])
        t = s[:, None] * t
    return t


class QuantizeCli(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.exe = binary()
        if not os.access(cls.exe, os.X_OK):
            raise unittest.SkipTest(f"{cls.exe} is not built (set FP4MOE_BUILD to the build folder)")
        cls.tmp = tempfile.mkdtemp(prefix="fp4moe_cli_quantize_")
        rng = np.random.default_rng(20260131)
        # Tokens of very different magnitude and a few outlier channels, as in MoE activations.
        x = rng.standard_normal((300, 256)) * np.exp2(rng.integers(-6, 7, (300, 1)))
        x[:, ::37] *= 24.0
        cls.x32 = x.astype(np.float32)
        cls.input = os.path.join(cls.tmp, "in.h5")
        with h5py.File(cls.input, "w") as f:
            f["x"] = cls.x32
            f["x64"] = x  # float64: rounded once to BF16 by the CLI
            f["bits"] = bf16_bits(cls.x32)
            f["bits"].attrs["dtype"] = "bfloat16"
            f["bits_untagged"] = bf16_bits(cls.x32)
            f["cube"] = np.zeros((2, 3, 32), dtype=np.float32)
            f["ints"] = np.zeros((4, 32), dtype=np.int32)
            f["k48"] = cls.x32[:, :48]
            f["w"] = cls.x32[:288]
            bad = cls.x32.copy()
            bad[5, 40] = np.nan  # MX block (5, 1), FP8 block (5, 0)
            bad[7, 200] = -np.inf  # MX block (7, 6), FP8 block (7, 1)
            f["nonfinite"] = bad
            f["ties"] = np.array([[1 + 2.0**-8 + 2.0**-40, 1 + 2.0**-8, -(1 + 3 * 2.0**-8 - 2.0**-45)] + [0.0] * 13])

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def quantize(self, *args, dataset="x", expect_rc=0):
        out = os.path.join(self.tmp, f"q{abs(hash((dataset,) + args))}.h5")
        cmd = [self.exe, "quantize", "--input", self.input, "--dataset", dataset, "--output", out, *args]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, expect_rc, f"{' '.join(cmd)}\nstdout: {r.stdout}\nstderr: {r.stderr}")
        return out, r

    def check_common(self, path, fmt):
        with h5py.File(path, "r") as f:
            for name in ("schema_version", "git_sha", "date", "gpu", "driver", "cuda", "cublaslt", "nccl", "host",
                         "command"):
                self.assertIn(name, f.attrs, name)
            self.assertEqual(f.attrs["format"], fmt)
            self.assertEqual(f.attrs["device"], "cpu")
            self.assertEqual((f.attrs["M"], f.attrs["K"]), (300, 256))
            x = bf16_to_f64(f["input_bf16"][()])
            np.testing.assert_array_equal(f["input_bf16"][()], bf16_bits(self.x32))
            self.assertEqual(f["input_bf16"].attrs["dtype"], "bfloat16")
            y = f["dequantized"][()]
            self.assertEqual(y.dtype, np.float32)
            self.assertEqual(y.shape, (300, 256))
            rel = np.sqrt(np.sum((y - x) ** 2) / np.sum(x**2))
            self.assertAlmostEqual(f.attrs["rel_l2_error"], rel, delta=1e-9 * max(rel, 1e-30))
            self.assertEqual(f.attrs["max_abs_error"], np.max(np.abs(y - x)))
            self.assertEqual(f.attrs["nonfinite_blocks"], 0)
            return x, y, {k: f[k][()] for k in f.keys()}, dict(f.attrs)

    def test_mxfp4_layout_scales_and_error(self):
        for mode in ("floor", "ceil"):
            out, r = self.quantize("--format", "mxfp4", "--scale-mode", mode)
            x, y, d, attrs = self.check_common(out, "mxfp4")
            codes, scales = d["codes"], d["scales"]
            self.assertEqual((codes.dtype, codes.shape), (np.uint8, (300, 128)))
            self.assertEqual((scales.dtype, scales.shape), (np.uint8, (300, 8)))
            # Decode independently: element 2i in the low nibble, 2i+1 in the high nibble; scale 2^(b - 127).
            vals = np.empty((300, 256))
            vals[:, 0::2] = E2M1[codes & 15]
            vals[:, 1::2] = E2M1[codes >> 4]
            decoded = vals * np.exp2(np.repeat(scales.astype(np.float64) - 127, 32, axis=1))
            np.testing.assert_array_equal(decoded.astype(np.float32), y)
            # The shared exponent: floor(log2 amax) - 2 (OCP) or the smallest e with amax <= 6 * 2^e (ceil).
            amax = np.abs(x).reshape(300, 8, 32).max(axis=2)
            e = np.floor(np.log2(amax)) - 2 if mode == "floor" else np.ceil(np.log2(amax / 6))
            np.testing.assert_array_equal(scales.astype(np.int64) - 127, e.astype(np.int64))
            clipped = np.sum(np.abs(x) > 6 * np.exp2(np.repeat(e, 32, axis=1)))
            self.assertEqual(attrs["saturated_elements"], clipped)
            if mode == "ceil":
                self.assertEqual(clipped, 0)
            self.assertGreater(attrs["rel_l2_error"], 0.0)
            self.assertLess(attrs["rel_l2_error"], 0.2)
            self.assertIn("relative L2 error", r.stdout)
            self.assertIn("saturated/clipped", r.stdout)
            self.assertIn("NaN/Inf blocks      0 of 2400", r.stdout)

    def test_mxfp4_stochastic_rounding_depends_on_the_seed(self):
        a, _ = self.quantize("--format", "mxfp4", "--rounding", "stochastic", "--seed", "1")
        b, _ = self.quantize("--format", "mxfp4", "--rounding", "stochastic", "--seed", "2")
        rne, _ = self.quantize("--format", "mxfp4")
        with h5py.File(a) as fa, h5py.File(b) as fb, h5py.File(rne) as fr:
            self.assertFalse(np.array_equal(fa["codes"][()], fb["codes"][()]))
            np.testing.assert_array_equal(fa["scales"][()], fr["scales"][()])
            self.assertEqual(fa.attrs["rounding"], "stochastic")
            self.assertLess(fa.attrs["rel_l2_error"], 0.3)

    def test_largest_seeds_are_recorded_as_given(self):
        top = 2**63 - 1
        out, _ = self.quantize("--format", "mxfp4", "--rounding", "stochastic", "--seed", str(top), "--transform",
                               "rht", "--rht-seed", str(top))
        with h5py.File(out) as f:
            self.assertEqual((int(f.attrs["seed"]), int(f.attrs["rht_seed"])), (top, top))

    def test_mxfp4_transforms_quantize_the_transformed_tensor(self):
        x = bf16_to_f64(bf16_bits(self.x32))
        codes_by_transform = {}
        for transform, seed in (("h16", None), ("h32", None), ("rht", "7"), ("rht", "8")):
            with self.subTest(transform=transform, seed=seed):
                args = ["--format", "mxfp4", "--transform", transform] + (["--rht-seed", seed] if seed else [])
                out, r = self.quantize(*args)
                with h5py.File(out) as f:
                    codes, scales = f["codes"][()], f["scales"][()]
                    y, back = f["dequantized"][()], f["dequantized_inverse"][()]
                    attrs = dict(f.attrs)
                self.assertEqual((attrs["transform"], attrs["rht_seed"]), (transform, int(seed or 0)))
                self.assertEqual((back.dtype, back.shape), (np.float32, (300, 256)))
                t = transform_matrix(transform, 256, int(seed or 0))
                np.testing.assert_allclose(t @ t.T, np.eye(256), atol=1e-12)
                xt = bf16_to_f64(bf16_bits(x @ t))  # the transformed input, rounded to BF16 as the quantizer does
                vals = np.empty((300, 256))
                vals[:, 0::2] = E2M1[codes & 15]
                vals[:, 1::2] = E2M1[codes >> 4]
                decoded = vals * np.exp2(np.repeat(scales.astype(np.float64) - 127, 32, axis=1))
                np.testing.assert_array_equal(decoded.astype(np.float32), y)
                # The codes are those of the transformed tensor: its block exponents, its rounding.
                amax = np.abs(xt).reshape(300, 8, 32).max(axis=2)
                np.testing.assert_array_equal(scales.astype(np.int64) - 127, np.floor(np.log2(amax)) - 2)
                step = np.repeat(np.exp2(scales.astype(np.float64) - 127), 32, axis=1)  # 2^e: steps are 0.5..2 of it
                self.assertLessEqual(np.max(np.abs(decoded - np.clip(xt, -6 * step, 6 * step)) / step), 1.0 + 1e-6)
                # Transformed back: the inverse of the dequantized tensor, and the errors measured on it.
                np.testing.assert_allclose(back, decoded @ t.T, rtol=0, atol=1e-5 * np.max(np.abs(decoded)))
                rel = np.sqrt(np.sum((back - x) ** 2) / np.sum(x**2))
                self.assertAlmostEqual(attrs["rel_l2_error"], rel, delta=1e-9 * rel)
                self.assertLess(rel, 0.2)
                self.assertEqual(attrs["saturated_elements"], np.sum(np.abs(xt) > 6 * step))
                self.assertIn("dequantized_inverse", r.stdout)
                codes_by_transform[(transform, seed)] = codes
        self.assertFalse(np.array_equal(codes_by_transform[("rht", "7")], codes_by_transform[("rht", "8")]))
        self.assertFalse(np.array_equal(codes_by_transform[("h16", None)], codes_by_transform[("h32", None)]))
        plain, _ = self.quantize("--format", "mxfp4", "--transform", "none")
        with h5py.File(plain) as f:
            self.assertNotIn("dequantized_inverse", f)
            self.assertEqual(f.attrs["transform"], "none")

    def test_fp8_row_layout_scales_and_error(self):
        out, _ = self.quantize("--format", "fp8-row")
        x, y, d, attrs = self.check_common(out, "fp8-row")
        codes, scales = d["codes"], d["scales"]
        self.assertEqual((codes.dtype, codes.shape), (np.uint8, (300, 256)))
        self.assertEqual((scales.dtype, scales.shape), (np.float32, (2, 300)))  # [ceil(K/128), round_up(M, 4)]
        decoded = E4M3[codes] * np.repeat(scales.T.astype(np.float64), 128, axis=1)
        np.testing.assert_array_equal(decoded.astype(np.float32), y)
        amax = np.abs(x).reshape(300, 2, 128).max(axis=2)
        want = np.array([[2.0 ** pow2_fp8_exponent(a) for a in row] for row in amax])
        np.testing.assert_array_equal(scales.T, want)
        self.assertEqual(attrs["saturated_elements"], 0)
        self.assertGreater(attrs["rel_l2_error"], 0.0)
        self.assertLess(attrs["rel_l2_error"], 0.05)

    def test_fp8_row_fp32_scales(self):
        out, _ = self.quantize("--format", "fp8-row", "--scale-mode", "fp32")
        x, _, d, attrs = self.check_common(out, "fp8-row")
        amax = np.abs(x).reshape(300, 2, 128).max(axis=2).astype(np.float32)
        np.testing.assert_array_equal(d["scales"].T, amax / np.float32(448))
        self.assertEqual(attrs["scale_mode"], "fp32")
        self.assertLess(attrs["rel_l2_error"], 0.05)

    def test_fp8_col_ragged_groups(self):
        groups = [162, 0, 100, 38]
        out, _ = self.quantize("--format", "fp8-col", "--groups", ",".join(map(str, groups)))
        x, y, d, attrs = self.check_common(out, "fp8-col")
        off = np.concatenate([[0], np.cumsum(groups)])
        np.testing.assert_array_equal(d["group_offsets"], off)
        self.assertEqual(d["group_offsets"].dtype, np.int32)
        K = 256
        ld = [(m + 15) // 16 * 16 for m in groups]
        nb = [(m + 127) // 128 for m in groups]
        self.assertEqual(d["codes"].shape, (K * sum(ld),))
        self.assertEqual(d["scales"].shape, (K * sum(nb),))
        decoded = np.full((300, K), np.nan)
        for g, m_g in enumerate(groups):
            c = d["codes"][K * sum(ld[:g]):K * sum(ld[:g + 1])].reshape(K, ld[g])
            s = d["scales"][K * sum(nb[:g]):K * sum(nb[:g + 1])].reshape(nb[g], K)
            self.assertTrue(np.all(c[:, m_g:] == 0), "padding columns must be zero")
            for t in range(m_g):
                decoded[off[g] + t] = E4M3[c[:, t]] * s[t // 128].astype(np.float64)
            for b in range(nb[g]):  # blocks of 128 tokens along each feature
                amax = np.abs(x[off[g] + 128 * b:off[g] + min(128 * (b + 1), m_g)]).max(axis=0)
                np.testing.assert_array_equal(s[b], [2.0 ** pow2_fp8_exponent(a) for a in amax])
        np.testing.assert_array_equal(decoded.astype(np.float32), y)
        self.assertLess(attrs["rel_l2_error"], 0.05)

    def test_fp8_col_default_is_one_group(self):
        out, _ = self.quantize("--format", "fp8-col")
        with h5py.File(out) as f:
            np.testing.assert_array_equal(f["group_offsets"][()], [0, 300])

    def test_fp8_block(self):
        # A weight-like [N, K] = [288, 256] input: 128x128 blocks, the last row of blocks partial.
        out, _ = self.quantize("--format", "fp8-block", dataset="w")
        with h5py.File(out) as f:
            codes, scales, y = f["codes"][()], f["scales"][()], f["dequantized"][()]
            x = bf16_to_f64(f["input_bf16"][()])
        self.assertEqual(codes.shape, (288, 256))
        self.assertEqual(scales.shape, (3, 4))  # [ceil(N/128), round_up(ceil(K/128), 4)]
        sc = scales[:, :2].astype(np.float64)
        decoded = E4M3[codes] * np.repeat(np.repeat(sc, 128, axis=0)[:288], 128, axis=1)
        np.testing.assert_array_equal(decoded.astype(np.float32), y)
        for nb in range(3):
            for kb in range(2):
                amax = np.abs(x[128 * nb:128 * (nb + 1), 128 * kb:128 * (kb + 1)]).max()
                self.assertEqual(sc[nb, kb], 2.0 ** pow2_fp8_exponent(amax))
        self.assertLess(np.sqrt(np.sum((y - x) ** 2) / np.sum(x**2)), 0.05)

    def test_bf16_bits_and_float64_inputs_match_float32(self):
        ref, _ = self.quantize("--format", "mxfp4")
        bits, _ = self.quantize("--format", "mxfp4", dataset="bits")
        f64, _ = self.quantize("--format", "mxfp4", dataset="x64")
        with h5py.File(ref) as a, h5py.File(bits) as b:
            np.testing.assert_array_equal(a["codes"][()], b["codes"][()])
            np.testing.assert_array_equal(a["scales"][()], b["scales"][()])
            self.assertEqual(b.attrs["input_dtype"], "bfloat16")
        with h5py.File(f64) as c:
            self.assertEqual(c.attrs["input_dtype"], "float64")
            # float64 -> BF16 directly (float32 inputs were already rounded once from these values).
            direct = bf16_to_f64(c["input_bf16"][()])
            x64 = h5py.File(self.input)["x64"][()]
            self.assertLessEqual(np.max(np.abs(direct - x64) / np.abs(x64)), 2.0**-8)

    def test_float64_rounds_once_to_bf16(self):
        out, _ = self.quantize("--format", "fp8-row", dataset="ties")
        with h5py.File(out) as f:
            got = f["input_bf16"][()][0, :3]
        # 1 + 2^-8 + 2^-40 lies above the tie: BF16 1 + 2^-7 (through float32 it would tie and round to 1.0);
        # 1 + 2^-8 is the tie itself: to even, 1.0; the third lies below the tie 1 + 3 * 2^-8: 1 + 2^-7.
        np.testing.assert_array_equal(got, [0x3F81, 0x3F80, 0xBF81])

    def test_nonfinite_blocks_are_counted_and_decode_to_nan(self):
        for fmt, blocks, nan_cols in (("mxfp4", "2 of 2400", [(5, 32, 64), (7, 192, 224)]),
                                      ("fp8-row", "2 of 600", [(5, 0, 128), (7, 128, 256)])):
            out, r = self.quantize("--format", fmt, dataset="nonfinite")
            self.assertIn(f"NaN/Inf blocks      {blocks}", r.stdout)
            with h5py.File(out) as f:
                self.assertEqual(f.attrs["nonfinite_blocks"], 2)
                y = f["dequantized"][()]
                x = bf16_to_f64(f["input_bf16"][()])
                rel = f.attrs["rel_l2_error"]
            mask = np.zeros_like(y, dtype=bool)
            for row, lo, hi in nan_cols:
                mask[row, lo:hi] = True
            self.assertTrue(np.all(np.isnan(y[mask])), fmt)
            self.assertFalse(np.any(np.isnan(y[~mask])), fmt)
            # The error figures cover the finite blocks only.
            want = np.sqrt(np.sum((y[~mask] - x[~mask]) ** 2) / np.sum(x[~mask] ** 2))
            self.assertAlmostEqual(rel, want, delta=1e-9 * want)

    def test_bad_inputs_exit_2_with_one_clear_line(self):
        cases = [
            (["--format", "mxfp4"], "missing.h5", "x", "input file '{input}' does not exist"),
            (["--format", "mxfp4"], None, "nope", "no dataset 'nope' in '{input}' (datasets present: bits, "),
            (["--format", "mxfp4"], None, "cube", "has rank 3 (shape [2, 3, 32]), expected a 2-D [M, K] matrix"),
            (["--format", "mxfp4"], None, "ints", "holds int32, expected float32, float64 or uint16"),
            (["--format", "mxfp4"], None, "bits_untagged", "is uint16 without the attribute dtype=\"bfloat16\""),
            (["--format", "mxfp4"], None, "k48",
             "mxfp4 needs K (the last dimension) to be a multiple of 32: dataset 'k48' has shape [M, K] = [300, 48]"),
            (["--format", "fp8-col", "--groups", "162,0,2577"], None, "x",
             "--groups '162,0,2577' sums to 2739 rows, expected the 300 rows of the input (M)"),
            (["--format", "fp8-col", "--groups", "100,100"], None, "x",
             "--groups '100,100' sums to 200 rows, expected the 300 rows of the input (M)"),
            (["--format", "fp8-col", "--groups", "100,-5,205"], None, "x", "'-5' is not a row count"),
            (["--format", "fp8-row", "--groups", "300"], None, "x", "--groups applies to fp8-col only"),
            (["--format", "fp8-row", "--scale-mode", "ceil"], None, "x",
             "--scale-mode ceil does not apply to fp8-row (expected pow2 or fp32)"),
            (["--format", "mxfp4", "--scale-mode", "pow2"], None, "x",
             "--scale-mode pow2 does not apply to mxfp4 (expected floor or ceil)"),
            (["--format", "fp8-row", "--rounding", "stochastic"], None, "x", "applies to mxfp4 only"),
            (["--format", "fp8-block"], None, "x", "fp8-block needs N (the first dimension) to be a multiple of 16"),
            (["--format", "fp8-row", "--transform", "h16"], None, "x",
             "--transform h16 applies to mxfp4 only, not fp8-row"),
            (["--format", "mxfp4", "--rht-seed", "5"], None, "x",
             "--rht-seed applies to --transform rht only, got --transform none"),
            (["--format", "mxfp4", "--transform", "h32", "--rht-seed", "5"], None, "x",
             "--rht-seed applies to --transform rht only, got --transform h32"),
            (["--format", "mxfp4", "--transform", "rht", "--rht-seed", "-3"], None, "x",
             "--rht-seed must be an integer in [0, 9223372036854775807], got '-3'"),
            # Given, even as an empty word, it is checked: not taken for "not given" (seed 0).
            (["--format", "mxfp4", "--transform", "rht", "--rht-seed", ""], None, "x",
             "--rht-seed must be an integer in [0, 9223372036854775807], got ''"),
            (["--format", "mxfp4", "--rht-seed", ""], None, "x",
             "--rht-seed applies to --transform rht only, got --transform none"),
        ]
        for args, input_override, dataset, expected in cases:
            with self.subTest(args=args, dataset=dataset):
                inp = os.path.join(self.tmp, input_override) if input_override else self.input
                out = os.path.join(self.tmp, "never.h5")
                cmd = [self.exe, "quantize", "--input", inp, "--dataset", dataset, "--output", out, *args]
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn(expected.format(input=inp), r.stderr)
                self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
                self.assertTrue(r.stderr.startswith("fp4moe quantize: error: "), r.stderr)
                self.assertFalse(os.path.exists(out))
                self.assertEqual([n for n in os.listdir(self.tmp) if ".tmp-" in n], [])
        # An unknown format is refused by the argument parser, with the same exit code.
        _, r = self.quantize("--format", "nvfp4", expect_rc=2)
        self.assertIn("--format", r.stderr)
        # So is a seed outside [0, 2^63 - 1] (-1 would wrap around; above 2^63 - 1 the file's signed 64-bit attribute
        # would not record it), with the range in plain numbers.
        for seed in ("-1", "9223372036854775808", "18446744073709551615", "18446744073709551616", "1.5", "x", ""):
            with self.subTest(seed=seed):
                self.assert_one_line_error(
                    self.run_cli("--input", self.input, "--dataset", "x", "--format", "mxfp4", "--rounding",
                                 "stochastic", "--seed", seed, "--output", os.path.join(self.tmp, "never.h5")),
                    f"--seed must be an integer in [0, 9223372036854775807], got '{seed}'")
        # So is an unknown transform.
        self.assert_one_line_error(
            self.run_cli("--input", self.input, "--dataset", "x", "--format", "mxfp4", "--transform", "h8",
                         "--output", os.path.join(self.tmp, "never.h5")), "--transform")
        # Parser errors are one line with the command's prefix too.
        self.assert_one_line_error(
            self.run_cli("--input", self.input, "--dataset", "x", "--format", "mxfp4", "--output",
                         os.path.join(self.tmp, "never.h5"), "--bogus", "1"),
            "unexpected arguments '--bogus 1'")
        self.assert_one_line_error(self.run_cli("--dataset", "x"), "--input is required")

    def run_cli(self, *args):
        return subprocess.run([self.exe, "quantize", *args], capture_output=True, text=True, timeout=60)

    def assert_one_line_error(self, r, expected):
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertTrue(r.stderr.startswith("fp4moe quantize: error: "), r.stderr)
        self.assertIn(expected, r.stderr)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
        self.assertNotRegex(r.stderr, r"\.(cpp|h):\d+\)", "no source locations in user errors")

    def test_bad_output_paths_fail_before_the_input_is_read(self):
        # The input named here does not exist: each output error must come first, so the input is never read.
        missing_input = os.path.join(self.tmp, "not_read.h5")
        base = ["--input", missing_input, "--dataset", "x", "--format", "mxfp4"]
        missing_dir = os.path.join(self.tmp, "no_such_dir", "q.h5")
        cases = [
            (missing_dir, f"--output '{missing_dir}': folder '{os.path.dirname(missing_dir)}' does not exist"),
            (self.tmp, f"--output '{self.tmp}' is a folder, expected a regular file or a path that does not exist"),
            ("", "--output is empty"),
            ("/dev/null", "--output '/dev/null' is a character device, expected a regular file"),
        ]
        for out, expected in cases:
            with self.subTest(output=out):
                self.assert_one_line_error(self.run_cli(*base, "--output", out), expected)
        self.assertFalse(os.path.exists(os.path.dirname(missing_dir)))
        self.assertTrue(stat.S_ISCHR(os.stat("/dev/null").st_mode))
        if os.geteuid() != 0:  # root writes anywhere
            ro = os.path.join(self.tmp, "read_only")
            os.mkdir(ro, 0o555)
            self.assert_one_line_error(self.run_cli(*base, "--output", os.path.join(ro, "q.h5")),
                                       f"folder '{ro}' is not writable")

    def test_only_a_regular_file_is_replaced(self):
        # With a readable input, so that nothing but the check stops the write: a rename over a FIFO, a socket or
        # a device node would replace it with the result file.
        specials = os.path.join(self.tmp, "specials")
        os.makedirs(specials, exist_ok=True)
        fifo = os.path.join(specials, "fifo")
        os.mkfifo(fifo)
        cases = [(fifo, "is a FIFO (named pipe)", stat.S_ISFIFO)]
        sock = socket.socket(socket.AF_UNIX)
        self.addCleanup(sock.close)
        sock.bind(os.path.join(specials, "sock"))
        cases.append((os.path.join(specials, "sock"), "is a socket", stat.S_ISSOCK))
        try:  # a device node of this test's own (root only): a copy of /dev/null's numbers
            os.mknod(os.path.join(specials, "null"), stat.S_IFCHR | 0o666, os.makedev(1, 3))
            cases.append((os.path.join(specials, "null"), "is a character device", stat.S_ISCHR))
        except OSError:
            pass
        for out, expected, kind in cases:
            with self.subTest(output=out):
                r = self.run_cli("--input", self.input, "--dataset", "x", "--format", "mxfp4", "--output", out)
                self.assert_one_line_error(r, f"--output '{out}' {expected}, expected a regular file")
                self.assertTrue(kind(os.lstat(out).st_mode), f"{out} was replaced")
        self.assertEqual(sorted(os.listdir(specials)), sorted(os.path.basename(c[0]) for c in cases))

    def test_output_may_not_replace_the_input(self):
        before = os.stat(self.input)
        folder, name = os.path.split(self.input)
        link, hard = os.path.join(self.tmp, "link_to_input.h5"), os.path.join(self.tmp, "hard_link_to_input.h5")
        os.symlink(self.input, link)
        os.link(self.input, hard)
        self.addCleanup(os.remove, link)
        self.addCleanup(os.remove, hard)
        for out in (self.input, os.path.join(folder, ".", name), link, hard):
            with self.subTest(output=out):
                r = self.run_cli("--input", self.input, "--dataset", "x", "--format", "mxfp4", "--output", out)
                self.assert_one_line_error(r, f"--output '{out}' is the same file as --input '{self.input}'")
        after = os.stat(self.input)
        self.assertEqual((before.st_size, before.st_mtime_ns, before.st_ino), (after.st_size, after.st_mtime_ns,
                                                                              after.st_ino))
        self.assertTrue(os.path.islink(link))
        with h5py.File(self.input, "r") as f:
            self.assertIn("x", f)

    def test_a_symbolic_link_output_writes_its_target(self):
        target = os.path.join(self.tmp, "link_target.h5")
        with open(target, "w", encoding="utf-8") as f:
            f.write("previous")
        link = os.path.join(self.tmp, "latest.h5")
        os.symlink(target, link)
        r = self.run_cli("--input", self.input, "--dataset", "x", "--format", "mxfp4", "--output", link)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(os.path.islink(link))
        self.assertEqual(os.readlink(link), target)
        with h5py.File(target, "r") as f:
            self.assertEqual(f.attrs["format"], "mxfp4")
        dangling = os.path.join(self.tmp, "dangling.h5")
        os.symlink(os.path.join(self.tmp, "nowhere.h5"), dangling)
        r = self.run_cli("--input", self.input, "--dataset", "x", "--format", "mxfp4", "--output", dangling)
        self.assert_one_line_error(r, f"--output '{dangling}' is a symbolic link to")
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "nowhere.h5")))

    def test_unreadable_input_message_names_the_file_not_the_source(self):
        junk = os.path.join(self.tmp, "junk.h5")
        with open(junk, "w", encoding="utf-8") as f:
            f.write("not an HDF5 file\n")
        r = self.run_cli("--input", junk, "--dataset", "x", "--format", "mxfp4", "--output",
                         os.path.join(self.tmp, "never.h5"))
        self.assert_one_line_error(r, f"cannot read input file '{junk}': '{junk}' is not an HDF5 file")

    def test_unreadable_elements_are_a_one_line_error(self):
        # A dataset whose elements live in an external raw file that is gone: the header reads, the data does not.
        path = os.path.join(self.tmp, "external.h5")
        with h5py.File(path, "w") as f:
            f.create_dataset("x", (4, 32), dtype="f4", external=[("gone.bin", 0, h5py.h5f.UNLIMITED)])
        r = self.run_cli("--input", path, "--dataset", "x", "--format", "mxfp4", "--output",
                         os.path.join(self.tmp, "never.h5"))
        self.assert_one_line_error(r, f"cannot read dataset 'x' of '{path}': ")
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "never.h5")))

    def test_values_beyond_bf16_range_are_counted(self):
        path = os.path.join(self.tmp, "huge.h5")
        x = np.ones((2, 64))
        x[0, 3] = 3.4e38  # finite in float32 and float64, beyond BF16's largest value (about 3.39e38): +Inf
        x[1, 40] = -1e300
        x[1, 41] = 3.3e38  # within BF16's range
        with h5py.File(path, "w") as f:
            f["x64"] = x
            f["x32"] = x.astype(np.float32)
        for name, overflowed in (("x64", 2), ("x32", 1)):  # -1e300 is already -Inf in float32
            with self.subTest(dataset=name):
                out = os.path.join(self.tmp, f"huge_{name}.h5")
                r = self.run_cli("--input", path, "--dataset", name, "--format", "mxfp4", "--output", out)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertIn(f"beyond BF16 range   {overflowed} finite input values rounded to +-Inf", r.stdout)
                with h5py.File(out) as f:
                    self.assertEqual(f.attrs["input_overflow_elements"], overflowed)
                    self.assertEqual(f.attrs["nonfinite_blocks"], 2)
                    bits = f["input_bf16"][()]
                self.assertEqual((bits[0, 3], bits[1, 40], bits[1, 41] & 0x7F80), (0x7F80, 0xFF80, 0x7F00))
        out, r = self.quantize("--format", "mxfp4")
        self.assertNotIn("beyond BF16 range", r.stdout)
        with h5py.File(out) as f:
            self.assertEqual(f.attrs["input_overflow_elements"], 0)

    def test_values_below_bf16_range_are_counted(self):
        path = os.path.join(self.tmp, "tiny.h5")
        x = np.ones((2, 64))
        x[0, 3] = 1e-45  # float32's smallest subnormal 2^-149, far below BF16's smallest subnormal 2^-133: +0
        x[0, 4] = 2.0**-134  # half of 2^-133: a tie, to the even BF16 +0
        x[1, 40] = -1e-300  # nonzero in float64; already -0 in float32 (not counted there)
        x[1, 41] = 1e-39  # a BF16 subnormal, kept
        x[1, 42] = 0.0  # zero input is not an underflow
        with h5py.File(path, "w") as f:
            f["x64"] = x
            f["x32"] = x.astype(np.float32)
        for name, underflowed in (("x64", 3), ("x32", 2)):
            with self.subTest(dataset=name):
                out = os.path.join(self.tmp, f"tiny_{name}.h5")
                r = self.run_cli("--input", path, "--dataset", name, "--format", "fp8-row", "--output", out)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertIn(f"below BF16 range    {underflowed} nonzero input values rounded to +-0", r.stdout)
                self.assertNotIn("beyond BF16 range", r.stdout)
                with h5py.File(out) as f:
                    self.assertEqual(f.attrs["input_underflow_elements"], underflowed)
                    self.assertEqual(f.attrs["input_overflow_elements"], 0)
                    bits = f["input_bf16"][()]
                self.assertEqual((bits[0, 3], bits[0, 4], bits[1, 40], bits[1, 42]), (0, 0, 0x8000, 0))
                self.assertNotEqual(bits[1, 41], 0)
        out, r = self.quantize("--format", "mxfp4")
        self.assertNotIn("below BF16 range", r.stdout)
        with h5py.File(out) as f:
            self.assertEqual(f.attrs["input_underflow_elements"], 0)

    def test_fp8_fp32_scales_of_tiny_and_huge_blocks(self):
        # One 1x128 block per row, amax from BF16's smallest subnormal to near its largest value; 448 / amax
        # overflows fp32 below about 1.3e-36 and amax / 448 is subnormal below 448 * 2^-126 (about 5.3e-36).
        amaxes = [2.0**-133, 1e-39, 2.0**-126, 3e-38, 1e-37, 2.0**-118, 5e-36, 1e-30, 1.0, 448.0, 1e10, 1e30, 1e36,
                  1e38, 3e38, 3.38e38]
        pattern = np.zeros(128)
        pattern[:6] = [1.0, -0.75, 0.5, 0.3, 0.125, -0.01]
        path = os.path.join(self.tmp, "range.h5")
        with h5py.File(path, "w") as f:
            f["x"] = (np.array(amaxes)[:, None] * pattern[None, :]).astype(np.float32)
        out = os.path.join(self.tmp, "range_fp32.h5")
        r = self.run_cli("--input", path, "--dataset", "x", "--format", "fp8-row", "--scale-mode", "fp32",
                         "--output", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        with h5py.File(out) as f:
            x = bf16_to_f64(f["input_bf16"][()])
            y = f["dequantized"][()].astype(np.float64)
            s = f["scales"][()][0].astype(np.float64)  # [ceil(K/128), round_up(M, 4)]
            codes = f["codes"][()]
            self.assertEqual(f.attrs["saturated_elements"], 0)
            self.assertEqual(f.attrs["nonfinite_blocks"], 0)
        self.assertTrue(np.all(np.isfinite(y)) and np.all(np.isfinite(s)) and np.all(s > 0))
        self.assertFalse(np.any((codes & 0x7F) == 0x7F), "no E4M3 NaN code")
        np.testing.assert_array_equal((E4M3[codes] * s[:, None]).astype(np.float32), y.astype(np.float32))
        # E4M3 rounding: 2^-4 relative, or half the subnormal step (2^-10 of the scale), plus fp32 roundings.
        bound = (2.0**-4 + 2.0**-18) * np.abs(x) + (2.0**-10 + 2.0**-18) * s[:, None] + 2.0**-149
        worst = np.argmax(np.abs(y - x) - bound)
        self.assertTrue(np.all(np.abs(y - x) <= bound),
                        f"element {np.unravel_index(worst, x.shape)}: {x.flat[worst]} -> {y.flat[worst]}")
        amax = np.abs(x).max(axis=1)
        self.assertLessEqual(np.max(np.abs(y[:, 0] - x[:, 0]) / amax), 2.0**-4 + 2.0**-20)

    def test_uint16_needs_a_string_dtype_attribute(self):
        path = os.path.join(self.tmp, "tags.h5")
        with h5py.File(path, "w") as f:
            for name, tag in (("number", 3), ("other", "float16")):
                f[name] = bf16_bits(self.x32[:4])
                f[name].attrs["dtype"] = tag
        for name, got in (("number", "got no string attribute dtype"), ("other", 'got dtype="float16"')):
            with self.subTest(dataset=name):
                r = self.run_cli("--input", path, "--dataset", name, "--format", "mxfp4", "--output",
                                 os.path.join(self.tmp, "never.h5"))
                self.assert_one_line_error(r, got)

    def test_too_many_groups_for_the_cuda_kernel(self):
        groups = ",".join(["0"] * 1024 + ["300"])  # 1025 groups: the CPU reference takes them, the kernel does not
        r = self.run_cli("--input", self.input, "--dataset", "x", "--format", "fp8-col", "--groups", groups,
                         "--device", "cuda", "--output", os.path.join(self.tmp, "never.h5"))
        self.assert_one_line_error(r, "--groups lists 1025 groups: the cuda column kernel takes at most 1024")
        out, _ = self.quantize("--format", "fp8-col", "--groups", groups)
        with h5py.File(out) as f:
            self.assertEqual(f["group_offsets"].shape, (1026,))

    def test_cuda_without_a_gpu_is_a_clear_error(self):
        env = subprocess.run([self.exe, "env"], capture_output=True, text=True, timeout=60)
        self.assertEqual(env.returncode, 0)
        for line in ("driver:", "CUDA runtime:", "cuBLASLt:", "NCCL:"):
            self.assertIn(line, env.stdout)
        if "no CUDA device" not in env.stdout:
            self.skipTest("a CUDA device is present: --device cuda runs (covered on the GPU machine)")
        _, r = self.quantize("--format", "mxfp4", "--device", "cuda", expect_rc=2)
        self.assertIn("--device cuda: no CUDA device (", r.stderr)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1)


if __name__ == "__main__":
    unittest.main()
