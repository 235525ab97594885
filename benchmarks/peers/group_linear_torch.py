#!/usr/bin/env python3
"""group_linear_torch: the PyTorch peer of bench_group_linear, run on the same GPU. The same Group Linear (the MoE
routed experts' linear layer, Y_g = X_g W_g^T over ragged token groups), forward, backward and forward+backward,
on the same layers, experts, tokens and splits, in three PyTorch recipes:

    torch_bf16  torch._grouped_mm on BF16 operands (Fprop, Dgrad; Wgrad as the 2d x 2d grouped product dY^T X)
    torch_fp8   torch._scaled_grouped_mm with rowwise FP8 (E4M3) scales, quantization included: X and dY rowwise
                along the reduction dimension for Fprop and Dgrad, dY and X per expert along tokens for Wgrad
                (per-group column scales), power-of-two scales as TransformerEngine and torchao round them; the
                quantizers are plain PyTorch operations (amax, scale, cast), no fused kernels
    torch_fp8_compiled  torch_fp8 with its quantizers compiled by torch.compile (dynamic shapes, compiled on
                first use and warmed up before timing): the fused amax/scale/cast kernels a PyTorch user would
                get, the strongest FP8 peer; the same GEMMs and the same quantization rule as torch_fp8

    benchmarks/peers/group_linear_torch.py --h5 PATH [--filter REGEX] [--all] [--min-time S]
    benchmarks/peers/group_linear_torch.py --list [--filter REGEX] [--all]      (no torch needed)
    benchmarks/peers/group_linear_torch.py --list-splits                          (no torch needed)

Cases are named as bench_group_linear names its own, <pass>/<recipe>/<layer>/e<experts>/t<tokens>/<split>, so that
one --benchmark_filter regular expression selects the same configurations in both (--filter: re.search on the name).
Splits: exactly bench_group_linear's (balanced, and Zipf with the same integer rule; --list-splits prints them in the
same format as `bench_group_linear --list_splits`). Each expert's tokens are padded with zero rows to a multiple of 16
(as PyTorch MoE code such as torchtitan pads them for the FP8 grouped GEMMs); FLOPs count the real tokens only.
Weights are quantized once outside the timed region (once per optimizer step), as in bench_group_linear; dW comes
out in BF16 (the grouped GEMMs' only output type), where our layer accumulates into an FP32 master gradient.
Check before timing (once per configuration): outputs finite and mostly nonzero, and for the FP8 recipes a relative L2
error against the BF16 recipe's outputs below 0.25 (a wrong scale or operand layout fails the case).
Timing: CUDA events around one pass, at least 5 passes and --min-time seconds after a warm-up; the median.

Writes the table /bench/group_linear_torch into the HDF5 result file PATH (reports/result_file.py; the layout of
results/h5_file.h): added to the file when it exists (the benchmark's own result file; replaced if already there),
else a new file with the root attributes of this machine. Written to a temporary copy and renamed. Columns: those of
/bench/group_linear (case = pass, shape "<layer> e<experts> t<tokens> <split>", recipe torch_bf16, torch_fp8 or
torch_fp8_compiled, time_us, tflops, ...), speedup NaN (the ratios to our recipes are computed by the reproduction suite), plus
rel_err_vs_bf16 and padded_tokens.

Exit codes: 0 every selected case ran; 1 a case failed or the file could not be written; 2 bad arguments;
3 PyTorch, CUDA, a Hopper GPU or the grouped GEMM operators are missing (one line on stderr saying which).
"""

import argparse
import importlib
import math
import os
import re
import shlex
import sys

PEERS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(PEERS))
sys.path.insert(0, ROOT)
sys.path.insert(0, PEERS)

import peer_result_file  # noqa: E402
import peer_torch  # noqa: E402

PROGRAM = "group_linear_torch"
FAMILY = "group_linear_torch"
UNAVAILABLE = 3
LAYERS = {"v3_fc1": (4096, 7168), "v3_fc2": (7168, 2048), "v2_fc1": (3072, 5120), "v2_fc2": (5120, 1536)}
PASSES = ("fwd", "bwd", "fwd+bwd")
RECIPES = ("torch_bf16", "torch_fp8", "torch_fp8_compiled")
FP8_RECIPES = ("torch_fp8", "torch_fp8_compiled")
ZIPF_UNIT = 1 << 40
TOKEN_ALIGN = 16
E4M3_MAX = 448.0
MAX_REL_ERR = 0.25


class Unavailable(Exception):
    """What this machine lacks to run the peer (exit 3)."""


# ---- splits and cases (no torch) ---------------------------------------------------------------------------------

def balanced_split(experts, tokens):
    """tokens // experts each, the first tokens % experts groups one more (bench_group_linear's balanced_split)."""
    sizes = [tokens // experts] * experts
    for g in range(tokens % experts):
        sizes[g] += 1
    return sizes


def zipf_split(experts, tokens):
    """bench_group_linear's zipf_split, in the same integer arithmetic: expert g has rank (7 g + 3) mod G and weight
    floor(2^40 / (rank + 1)); size floor(tokens w / sum w), the remaining tokens one each to the largest remainders
    (ties: lower g first), then every empty group takes one token from the (first) largest."""
    if experts < 1 or experts % 7 == 0 or tokens < experts:
        raise ValueError(f"zipf_split: expected experts >= 1 not a multiple of 7 and tokens >= experts, got "
                         f"{experts}, {tokens}")
    w = [ZIPF_UNIT // ((7 * g + 3) % experts + 1) for g in range(experts)]
    total = sum(w)
    sizes = [tokens * wg // total for wg in w]
    rem = [tokens * wg % total for wg in w]
    left = tokens - sum(sizes)
    for g in sorted(range(experts), key=lambda g: -rem[g])[:left]:
        sizes[g] += 1
    for g in range(experts):
        if sizes[g] == 0:
            sizes[g] += 1
            sizes[max(range(experts), key=sizes.__getitem__)] -= 1
    return sizes


def split_sizes(split, experts, tokens):
    if split == "zipf":
        return zipf_split(experts, tokens)
    if split == "balanced":
        return balanced_split(experts, tokens)
    raise ValueError(f"unknown split '{split}' (expected balanced or zipf)")


def split_lines():
    """The lines `bench_group_linear --list_splits` prints: "e<G> t<tokens> <split>: sizes"."""
    return [f"e{g} t{t} {s}: {' '.join(map(str, split_sizes(s, g, t)))}"
            for g in (8, 16, 32) for t in (16384, 32768, 65536) for s in ("balanced", "zipf")]


def configurations(all_grid):
    """(layer, experts, tokens, split) in bench_group_linear's order: the default subset, or the whole grid."""
    experts = (8, 16, 32) if all_grid else (8, 32)
    tokens = (16384, 32768, 65536) if all_grid else (16384,)
    return [(layer, g, t, s) for layer in LAYERS for t in tokens for g in experts for s in ("balanced", "zipf")]


def case_name(pass_, recipe, layer, experts, tokens, split):
    return f"{pass_}/{recipe}/{layer}/e{experts}/t{tokens}/{split}"


def selected_cases(all_grid, pattern):
    """[(configuration, recipe, pass)] whose name matches `pattern` (re.search; None: all)."""
    rx = re.compile(pattern) if pattern else None
    out = []
    for cfg in configurations(all_grid):
        for recipe in RECIPES:
            for p in PASSES:
                if rx is None or rx.search(case_name(p, recipe, *cfg)):
                    out.append((cfg, recipe, p))
    return out


def flops(pass_, tokens, n, k):
    """fwd 2 M N K, bwd 4 M N K (Dgrad and Wgrad), fwd+bwd 6 M N K; M the real routed tokens."""
    return {"fwd": 2, "bwd": 4, "fwd+bwd": 6}[pass_] * tokens * n * k


def round_up(v, a):
    return (v + a - 1) // a * a


# ---- torch ---------------------------------------------------------------------------------------------------------

def require_torch():
    """The torch module, or Unavailable saying what is missing."""
    torch = peer_torch.hopper_torch(Unavailable, "torch._scaled_grouped_mm on Hopper (sm_90)")
    for op in ("_grouped_mm", "_scaled_grouped_mm"):
        if not hasattr(torch, op):
            raise Unavailable(f"PyTorch {torch.__version__} has no torch.{op} (grouped GEMMs need 2.8 or later)")
    return torch


def quantize_rows(torch, t):
    """t [..., C] -> (E4M3 codes [..., C], FP32 dequantization scales [...]) with one power-of-two scale per row:
    s = 2^floor(log2(448 / amax)), code = E4M3(v s) (saturated); amax = 0 gives s = 1."""
    amax = t.abs().amax(dim=-1, keepdim=True).float()
    s = torch.where(amax > 0, torch.exp2(torch.floor(torch.log2(E4M3_MAX / amax))), torch.ones_like(amax))
    q = (t.float() * s).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, (1.0 / s).squeeze(-1).contiguous()


def quantize_group_columns(torch, t, gid, experts):
    """t [M, C] (tokens x features) -> (E4M3 codes of t^T [C, M], row-major; FP32 dequantization scales [G * C],
    expert-major), one power-of-two scale per expert and feature (amax over the expert's tokens): the layout
    torch._scaled_grouped_mm takes for a 2d x 2d grouped product over token groups. Experts are padded to
    TOKEN_ALIGN tokens, so the amax goes over chunks of TOKEN_ALIGN tokens first (none straddles two experts) and then
    over each expert's chunks: the same maxima with a 16 times smaller scatter."""
    m, c = t.shape
    chunks = t.view(m // TOKEN_ALIGN, TOKEN_ALIGN, c).abs().amax(dim=1).float()
    amax = torch.zeros(experts, c, device=t.device, dtype=torch.float32).index_reduce_(0, gid[::TOKEN_ALIGN], chunks,
                                                                                       "amax")
    s = torch.where(amax > 0, torch.exp2(torch.floor(torch.log2(E4M3_MAX / amax))), torch.ones_like(amax))
    q = (t.float() * s[gid]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q.t().contiguous(), (1.0 / s).reshape(-1).contiguous()


class Quantizers:
    """The activation quantizers of an FP8 recipe: rows(t) and columns(t, gid, experts), as quantize_rows and
    quantize_group_columns. compiled: both through torch.compile (dynamic shapes, so one compilation serves every
    layer, expert count and split of a run; the first call of each compiles)."""

    def __init__(self, torch, compiled):
        def rows(t):
            return quantize_rows(torch, t)

        def columns(t, gid, experts):
            return quantize_group_columns(torch, t, gid, experts)

        if compiled:
            # Past its recompile limit Dynamo would run a function eagerly without a word: room for every shape.
            config = importlib.import_module("torch._dynamo").config
            for limit in ("recompile_limit", "cache_size_limit"):
                if hasattr(config, limit):
                    setattr(config, limit, max(64, getattr(config, limit)))
            rows, columns = torch.compile(rows, dynamic=True), torch.compile(columns, dynamic=True)
        self.rows, self.columns = rows, columns


class Workload:
    """One configuration and recipe: inputs, quantized weights and the three passes as callables. quantizers: the
    FP8 recipes' Quantizers (None for torch_bf16)."""

    def __init__(self, torch, recipe, n, k, sizes, seed, quantizers=None):
        self.torch, self.recipe, self.n, self.k, self.q = torch, recipe, n, k, quantizers
        dev = "cuda"
        g = len(sizes)
        padded = [round_up(s, TOKEN_ALIGN) for s in sizes]
        self.tokens, self.padded_tokens = sum(sizes), sum(padded)
        starts = [0]
        for p in padded[:-1]:
            starts.append(starts[-1] + p)
        real = torch.cat([torch.arange(s0, s0 + s, device=dev) for s0, s in zip(starts, sizes)])
        gen = torch.Generator(device=dev)
        gen.manual_seed(seed)

        def rows(m, c, lo, hi, outliers):
            # a normal times a per-row power of two in 2^[lo, hi], x32 on one column in 64 (bench_util.cuh's spread)
            v = torch.randn(m, c, device=dev, generator=gen)
            v *= torch.exp2(torch.randint(lo, hi + 1, (m, 1), device=dev, generator=gen).float())
            if outliers:
                v[:, torch.randperm(c, device=dev, generator=gen)[: c // 64]] *= 32.0
            return v.to(torch.bfloat16)

        self.x = torch.zeros(self.padded_tokens, k, device=dev, dtype=torch.bfloat16)
        self.x[real] = rows(self.tokens, k, -4, 4, True)
        self.dy = torch.zeros(self.padded_tokens, n, device=dev, dtype=torch.bfloat16)
        self.dy[real] = rows(self.tokens, n, -2, 2, False)
        self.w = (torch.randn(g, n, k, device=dev, generator=gen) * 0.02).to(torch.bfloat16)
        self.real = real
        self.offs = torch.tensor(padded, device=dev, dtype=torch.int32).cumsum(0, dtype=torch.int32)
        self.gid = torch.repeat_interleave(torch.arange(g, device=dev), torch.tensor(padded, device=dev))
        self.experts = g
        self.wgrad_mat_a_view = True  # dY^T as a transposed view for the BF16 Wgrad (a copy if torch refuses it)
        if recipe in FP8_RECIPES:  # once per optimizer step: outside the timed region (plain PyTorch in both)
            wq, self.sw = quantize_rows(torch, self.w)                                 # [G, N, K], scales [G, N]
            self.wq_t = wq.transpose(-2, -1)                                           # [G, K, N] column-major
            wtq, self.swt = quantize_rows(torch, self.w.transpose(-2, -1).contiguous())  # [G, K, N], scales [G, K]
            self.wtq_t = wtq.transpose(-2, -1)                                         # [G, N, K] column-major
            self.weight_copy_bytes = 2 * g * n * k + 4 * (g * n + g * k)
        else:
            self.weight_copy_bytes = 0
        # Held from forward to backward: the BF16 X in every recipe (the FP8 recipes quantize X per expert along tokens
        # again in backward, as torchao's float8 grouped GEMM keeps the high-precision input).
        self.held_bytes = 2 * self.padded_tokens * k
        self.y = self.dx = self.dw = None

    # -- passes --
    def forward(self):
        t = self.torch
        if self.recipe == "torch_bf16":
            self.y = t._grouped_mm(self.x, self.w.transpose(-2, -1), offs=self.offs)
        else:
            xq, sx = self.q.rows(self.x)
            self.y = t._scaled_grouped_mm(xq, self.wq_t, sx, self.sw, offs=self.offs, out_dtype=t.bfloat16,
                                          use_fast_accum=True)

    def backward(self):
        t = self.torch
        if self.recipe == "torch_bf16":
            self.dx = t._grouped_mm(self.dy, self.w, offs=self.offs)
            dyt = self.dy.t() if self.wgrad_mat_a_view else self.dy.t().contiguous()
            self.dw = t._grouped_mm(dyt, self.x, offs=self.offs)
        else:
            dyq, sdy = self.q.rows(self.dy)
            self.dx = t._scaled_grouped_mm(dyq, self.wtq_t, sdy, self.swt, offs=self.offs, out_dtype=t.bfloat16,
                                           use_fast_accum=True)
            dyc, sdyc = self.q.columns(self.dy, self.gid, self.experts)  # dY^T [N, M]
            xc, sxc = self.q.columns(self.x, self.gid, self.experts)     # X^T [K, M]
            self.dw = t._scaled_grouped_mm(dyc, xc.t(), sdyc, sxc, offs=self.offs, out_dtype=t.bfloat16,
                                           use_fast_accum=True)

    def run(self, pass_):
        if pass_ in ("fwd", "fwd+bwd"):
            self.forward()
        if pass_ in ("bwd", "fwd+bwd"):
            self.backward()

    # -- check --
    def outputs(self):
        return {"Y": self.y[self.real].float(), "dX": self.dx[self.real].float(), "dW": self.dw.float()}

    def check(self, reference=None):
        """Runs forward and backward once; raises RuntimeError on non-finite or mostly zero outputs, or (with the
        BF16 workload of the same configuration as reference) a relative L2 error above MAX_REL_ERR. Returns the
        largest relative error (NaN without reference)."""
        t = self.torch
        self.forward()
        try:
            self.backward()
        except (RuntimeError, ValueError):
            if self.recipe != "torch_bf16" or not self.wgrad_mat_a_view:
                raise
            self.wgrad_mat_a_view = False  # this torch wants dY^T contiguous for the 2d x 2d product
            self.backward()
        t.cuda.synchronize()
        worst = math.nan
        mine = self.outputs()
        theirs = reference.outputs() if reference is not None else {}
        for name, v in mine.items():
            bad = int((~t.isfinite(v)).sum())
            nonzero = int((v != 0).sum())
            if bad or 2 * nonzero <= v.numel():
                raise RuntimeError(f"{name} has {bad} NaN/Inf and {nonzero} nonzero of {v.numel()} elements "
                                   f"(expected all finite, mostly nonzero)")
            if name in theirs:
                ref = theirs[name]
                err = float((v - ref).norm() / ref.norm())
                worst = err if math.isnan(worst) else max(worst, err)
                if not err < MAX_REL_ERR:
                    raise RuntimeError(f"{name}: relative L2 error {err:.3g} against the BF16 recipe (expected < "
                                       f"{MAX_REL_ERR}): the FP8 operands or their scales are laid out wrongly")
        return worst


# ---- result file ---------------------------------------------------------------------------------------------------

COLUMNS = [("case", "str"), ("shape", "str"), ("recipe", "str"), ("time_us", "f64"), ("tflops", "f64"),
           ("gbps", "f64"), ("fraction_of_copy_bw", "f64"), ("speedup", "f64"), ("pass", "str"), ("layer", "str"),
           ("experts", "i64"), ("tokens", "i64"), ("split", "str"), ("n", "i64"), ("k", "i64"),
           ("speedup_vs_bf16", "f64"), ("fraction_of_dense", "f64"), ("held_bytes", "f64"),
           ("weight_copy_bytes", "f64"), ("rel_err_vs_bf16", "f64"), ("padded_tokens", "i64")]


def table_attributes(torch, command):
    return {
        "time_us": "median over the timed passes (CUDA events), microseconds",
        "tflops": "fwd 2 M N K, bwd 4 M N K, fwd+bwd 6 M N K over time_us; M = tokens (real, not padded)",
        "speedup": "NaN: the ratios to bench_group_linear's recipes are computed by the reproduction suite",
        "speedup_vs_bf16": "time of torch_bf16 over this row's, same pass and shape",
        "held_bytes": "activation bytes kept from forward to backward: the BF16 X (padded) in every recipe",
        "weight_copy_bytes": "FP8 copies of W and W^T with their rowwise scales (0 for torch_bf16)",
        "rel_err_vs_bf16": "largest relative L2 error of Y, dX, dW against torch_bf16 (the FP8 recipes' rows)",
        "padded_tokens": "routed tokens after padding each expert to a multiple of 16",
        "recipe": "torch_bf16: torch._grouped_mm; torch_fp8: torch._scaled_grouped_mm, rowwise power-of-two "
                  "scales, quantization in plain PyTorch operations included; torch_fp8_compiled: the same with "
                  "the activation quantizers compiled by torch.compile (dynamic shapes, compiled before timing); "
                  "weights quantized before timing",
        "torch_version": str(torch.__version__),
        "peer_command": command,
        "gbps": "not measured (NaN)",
    }


def write_into(path, rows, attributes, new_file_root):
    """Adds (or replaces) /bench/group_linear_torch in the result file `path`, or creates it with the root attributes
    `new_file_root()`; atomically (peer_result_file.write_table)."""
    peer_result_file.write_table(path, FAMILY, COLUMNS, rows, attributes, new_file_root)


# ---- main ----------------------------------------------------------------------------------------------------------

def measure(torch, cases, min_time_s):
    """Rows of the table for the selected cases, and the names of the cases that failed."""
    rows, failed = [], []
    quantizers = {}  # recipe -> Quantizers, made on first use: one torch.compile per process, not per configuration
    by_cfg = {}
    for cfg, recipe, p in cases:
        by_cfg.setdefault(cfg, {}).setdefault(recipe, []).append(p)
    for cfg, recipes in by_cfg.items():
        layer, experts, tokens, split = cfg
        n, k = LAYERS[layer]
        sizes = split_sizes(split, experts, tokens)
        times = {}
        ref = None
        # torch_bf16 first: it is the FP8 recipes' reference in the check
        for recipe in RECIPES:
            if recipe not in recipes and not (recipe == "torch_bf16" and any(r in recipes for r in FP8_RECIPES)):
                continue
            name0 = case_name("*", recipe, *cfg)
            try:
                if recipe in FP8_RECIPES and recipe not in quantizers:
                    quantizers[recipe] = Quantizers(torch, compiled=recipe == "torch_fp8_compiled")
                work = Workload(torch, recipe, n, k, sizes, seed=1000 * experts + tokens + (n ^ k),
                                quantizers=quantizers.get(recipe))
                err = work.check(ref if recipe in FP8_RECIPES else None)
            except Exception as e:  # noqa: BLE001 (torch.compile raises its own classes; one line and the case fails)
                print(f"{PROGRAM}: {name0}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
                failed += [case_name(p, recipe, *cfg) for p in recipes.get(recipe, [])]
                continue
            for p in recipes.get(recipe, []):
                name = case_name(p, recipe, *cfg)
                try:
                    s = peer_torch.median_pass_seconds(torch, lambda: work.run(p), min_time_s)
                except (RuntimeError, ValueError) as e:
                    print(f"{PROGRAM}: {name}: {e}", file=sys.stderr, flush=True)
                    failed.append(name)
                    continue
                times[(recipe, p)] = s
                us = s * 1e6
                tf = flops(p, tokens, n, k) / s * 1e-12
                print(f"{name:<48} {us:10.1f} us {tf:8.1f} TFLOP/s", flush=True)
                rows.append({"case": p, "shape": f"{layer} e{experts} t{tokens} {split}", "recipe": recipe,
                             "time_us": us, "tflops": tf, "gbps": math.nan, "fraction_of_copy_bw": math.nan,
                             "speedup": math.nan, "pass": p, "layer": layer, "experts": experts, "tokens": tokens,
                             "split": split, "n": n, "k": k, "speedup_vs_bf16": math.nan,
                             "fraction_of_dense": math.nan, "held_bytes": float(work.held_bytes),
                             "weight_copy_bytes": float(work.weight_copy_bytes), "rel_err_vs_bf16": err,
                             "padded_tokens": work.padded_tokens})
            if recipe == "torch_bf16":
                ref = work
            else:
                del work
            torch.cuda.empty_cache()
        ref = None
        torch.cuda.empty_cache()
        for r in rows:
            if (r["layer"], r["experts"], r["tokens"], r["split"]) == cfg and ("torch_bf16", r["pass"]) in times:
                r["speedup_vs_bf16"] = times[("torch_bf16", r["pass"])] * 1e6 / r["time_us"]
    return rows, failed


def main(argv=None):
    p = argparse.ArgumentParser(description="PyTorch peer of bench_group_linear (torch._grouped_mm BF16, "
                                            "torch._scaled_grouped_mm rowwise FP8, its quantizers plain or "
                                            "compiled)")
    p.add_argument("--h5", help="HDF5 result file to add /bench/group_linear_torch to (created if absent)")
    p.add_argument("--filter", default="", help="regular expression on case names (re.search), as "
                                                "--benchmark_filter for bench_group_linear")
    p.add_argument("--all", action="store_true", help="the whole grid (experts 8/16/32, tokens 16k/32k/64k)")
    p.add_argument("--min-time", type=float, default=0.05, help="seconds of timed passes per case (default 0.05)")
    p.add_argument("--list", action="store_true", help="print the selected case names and exit (no torch needed)")
    p.add_argument("--list-splits", action="store_true", help="print every split of the grid and exit")
    a = p.parse_args(argv)
    try:
        cases = selected_cases(a.all, a.filter)
    except re.error as e:
        print(f"{PROGRAM}: --filter is not a regular expression ({e}): {a.filter!r}", file=sys.stderr)
        return 2
    if a.list_splits:
        print("\n".join(split_lines()))
        return 0
    if a.list:
        for cfg, recipe, pass_ in cases:
            print(case_name(pass_, recipe, *cfg))
        return 0
    if not a.h5:
        print(f"{PROGRAM}: name the result file: --h5 PATH", file=sys.stderr)
        return 2
    if not cases:
        print(f"{PROGRAM}: no case matches --filter {a.filter!r}", file=sys.stderr)
        return 2
    why = peer_result_file.unwritable(a.h5)
    if why:
        print(f"{PROGRAM}: --h5 '{a.h5}': {why}", file=sys.stderr)
        return 2
    try:
        torch = require_torch()
    except Unavailable as e:
        print(f"{PROGRAM}: {e}", file=sys.stderr)
        return UNAVAILABLE
    command = shlex.join(["benchmarks/peers/group_linear_torch.py"] + (sys.argv[1:] if argv is None else list(argv)))
    print(f"{PROGRAM}: {len(cases)} cases on {torch.cuda.get_device_name(0)}, torch {torch.__version__}", flush=True)
    rows, failed = measure(torch, cases, a.min_time)
    rc = 1 if failed else 0
    if rows:
        try:
            write_into(a.h5, rows, table_attributes(torch, command),
                       lambda: peer_result_file.root_attributes(torch, command))
            print(f"wrote {a.h5} (/bench/{FAMILY}, {len(rows)} rows)", flush=True)
        except Exception as e:  # noqa: BLE001 (h5py raises OSError, KeyError, ...; one line either way)
            print(f"{PROGRAM}: cannot write {a.h5}: {e}", file=sys.stderr)
            rc = 1
    if failed:
        print(f"{PROGRAM}: failed: {', '.join(failed)}", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
