#!/usr/bin/env python3
"""attention_torch: the PyTorch peer of bench_attention, run on the same GPU. The same causal attention (BF16,
softmax scale 1/sqrt(Dqk)), forward, backward and forward+backward, on the same shapes, through
torch.nn.functional.scaled_dot_product_attention:

    mla    B=1 T=4096 H=128, Dqk/Dv = 192/128
    small  B=8 T=1024 H=12,  96/64

    benchmarks/peers/attention_torch.py [--h5 PATH] [--filter REGEX] [--min-time S]
    benchmarks/peers/attention_torch.py --list [--filter REGEX]        (no torch needed)

Backends, tried in this order for each shape until one runs a forward and backward: cuDNN
(SDPBackend.CUDNN_ATTENTION), memory-efficient (EFFICIENT_ATTENTION), flash (FLASH_ATTENTION; it refuses
Dqk != Dv). The one that ran is recorded per row (column `backend`, and recipe torch_<backend>).
Tensors are laid out as bench_attention's, [B*T, H, D] contiguous, and handed to SDPA as (B, H, T, D) views
(no copies); gradients flow back to the [B*T, H, D] leaves. Inputs N(0, 1), seeded.
Cases are named as bench_attention names its own, <pass>/<shape> (--filter: re.search on the name); FLOPs use the
same convention: forward 2 B H T (T+1)/2 (Dqk + Dv), backward 2.5x, forward+backward 3.5x forward.
Check before timing (once per shape): outputs and gradients finite, and on sequence 0, heads 0-1, a relative L2
error against SDPA's math backend in FP32 below 2e-2 (O) and 5e-2 (dQ, dK, dV), else the shape's cases fail.
Timing: CUDA events around one pass (forward with autograd recording, as in training; backward through
torch.autograd.grad on a retained graph), at least 5 passes and --min-time seconds after a warm-up; the median.

Prints one JSON line per case (case, pass, shape, backend, time_us, tflops, B, T, H, dqk, dv, rel_err) and, with
--h5, writes the table /bench/attention_torch into the HDF5 result file PATH (reports/result_file.py; the layout of
results/h5_file.h): added to the file when it exists (bench_attention's own result file; replaced if already there),
else a new file with the root attributes of this machine; written to a temporary copy and renamed. Columns: those of
/bench/attention (case = pass, shape, recipe torch_<backend>, time_us, tflops, gbps, fraction_of_copy_bw, speedup
NaN), then pass, B, T, H, dqk, dv, backend, rel_err.

Exit codes: 0 every selected case ran; 1 a case failed or the file could not be written; 2 bad arguments;
3 PyTorch, CUDA, a Hopper GPU or torch.nn.attention are missing (one line on stderr saying which).
"""

import argparse
import json
import math
import os
import re
import shlex
import sys
import warnings

PEERS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(PEERS))
sys.path.insert(0, ROOT)
sys.path.insert(0, PEERS)

import peer_result_file  # noqa: E402
import peer_torch  # noqa: E402

PROGRAM = "attention_torch"
FAMILY = "attention_torch"
UNAVAILABLE = 3
SHAPES = {"mla": (1, 4096, 128, 192, 128), "small": (8, 1024, 12, 96, 64)}  # B, T, H, Dqk, Dv
PASSES = ("fwd", "bwd", "fwd+bwd")
BACKENDS = ("cudnn", "efficient", "flash")
MAX_ERR_O, MAX_ERR_GRAD = 2e-2, 5e-2


class Unavailable(Exception):
    """What this machine lacks to run the peer (exit 3)."""


# ---- cases (no torch) --------------------------------------------------------------------------------------------

def case_name(pass_, shape):
    return f"{pass_}/{shape}"


def shape_text(shape):
    b, t, h, dqk, dv = SHAPES[shape]
    return f"{shape} B{b} T{t} H{h} {dqk}/{dv}"


def selected_cases(pattern):
    """[(shape, pass)] whose name matches `pattern` (re.search; empty: all), in bench_attention's order."""
    rx = re.compile(pattern) if pattern else None
    return [(s, p) for s in SHAPES for p in PASSES if rx is None or rx.search(case_name(p, s))]


def flops(pass_, shape):
    b, t, h, dqk, dv = SHAPES[shape]
    fwd = 2.0 * b * h * (t * (t + 1) / 2.0) * (dqk + dv)
    return {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}[pass_] * fwd


# ---- torch ---------------------------------------------------------------------------------------------------------

def require_torch():
    """(torch, sdpa_kernel, SDPBackend), or Unavailable saying what is missing."""
    torch = peer_torch.hopper_torch(Unavailable)
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        raise Unavailable(f"PyTorch {torch.__version__} has no torch.nn.attention.sdpa_kernel (2.3 or later "
                          f"needed to choose the SDPA backend)") from None
    return torch, sdpa_kernel, SDPBackend


def backend_enum(SDPBackend, name):
    return {"cudnn": getattr(SDPBackend, "CUDNN_ATTENTION", None), "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "flash": SDPBackend.FLASH_ATTENTION, "math": SDPBackend.MATH}[name]


def rel_l2(a, ref):
    a, ref = a.detach().float(), ref.detach().float()
    return float((a - ref).norm() / ref.norm().clamp_min(1e-30))


class Workload:
    """One shape: [B*T, H, D] leaves, the (B, H, T, D) views SDPA sees, and the passes as callables."""

    def __init__(self, torch, sdpa_kernel, SDPBackend, shape, seed):
        self.torch, self.sdpa_kernel, self.SDPBackend = torch, sdpa_kernel, SDPBackend
        self.b, self.t, self.h, self.dqk, self.dv = SHAPES[shape]
        self.scale = 1.0 / math.sqrt(self.dqk)
        gen = torch.Generator(device="cuda")
        gen.manual_seed(seed)
        rows = self.b * self.t

        def leaf(d):
            return torch.randn(rows, self.h, d, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()

        self.q, self.k, self.v = leaf(self.dqk), leaf(self.dqk), leaf(self.dv)
        self.dout = torch.randn(self.b, self.h, self.t, self.dv, device="cuda", dtype=torch.bfloat16, generator=gen)
        self.backend = None
        self.out = None

    def view(self, x):
        """[B*T, H, D] -> (B, H, T, D), a strided view."""
        return x.reshape(self.b, self.t, self.h, x.shape[-1]).transpose(1, 2)

    def forward(self):
        t = self.torch
        with self.sdpa_kernel([backend_enum(self.SDPBackend, self.backend)]):
            self.out = t.nn.functional.scaled_dot_product_attention(
                self.view(self.q), self.view(self.k), self.view(self.v), is_causal=True, scale=self.scale)
        return self.out

    def backward(self, retain=True):
        with self.sdpa_kernel([backend_enum(self.SDPBackend, self.backend)]):
            return self.torch.autograd.grad(self.out, (self.q, self.k, self.v), self.dout, retain_graph=retain)

    def run(self, pass_):
        if pass_ == "fwd":
            self.forward()
        elif pass_ == "bwd":
            self.backward(retain=True)
        else:
            self.forward()
            self.backward(retain=False)

    def choose_backend(self):
        """Tries the backends in order; the first that runs a forward and backward stays. Returns the gradients."""
        reasons = []
        for name in BACKENDS:
            if backend_enum(self.SDPBackend, name) is None:
                reasons.append(f"{name}: not in this torch")
                continue
            self.backend = name
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    self.forward()
                    grads = self.backward(retain=True)
                self.torch.cuda.synchronize()
                return grads
            except RuntimeError as e:
                reasons.append(f"{name}: {' '.join(str(e).split())[:160]}")
                self.backend, self.out = None, None
        raise RuntimeError("no SDPA backend ran (" + "; ".join(reasons) + ")")

    def check(self):
        """Chooses the backend, then checks finiteness and sequence 0, heads 0-1 against the FP32 math backend.
        Returns the largest relative error; raises RuntimeError on a failed check."""
        t = self.torch
        dq, dk, dv = self.choose_backend()
        for name, x in (("O", self.out), ("dQ", dq), ("dK", dk), ("dV", dv)):
            bad = int((~t.isfinite(x)).sum())
            if bad:
                raise RuntimeError(f"{name} has {bad} NaN/Inf elements (backend {self.backend})")
        heads = min(2, self.h)

        def part(x):  # sequence 0, heads 0..1 as (1, heads, T, D) FP32 leaves
            return self.view(x.detach())[:1, :heads].float().clone().requires_grad_()

        qs, ks, vs = part(self.q), part(self.k), part(self.v)
        with self.sdpa_kernel([self.SDPBackend.MATH]):
            ref = t.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=self.scale)
        rdq, rdk, rdv = t.autograd.grad(ref, (qs, ks, vs), self.dout[:1, :heads].float())
        errs = {"O": (rel_l2(self.out[:1, :heads], ref), MAX_ERR_O),
                "dQ": (rel_l2(self.view(dq)[:1, :heads], rdq), MAX_ERR_GRAD),
                "dK": (rel_l2(self.view(dk)[:1, :heads], rdk), MAX_ERR_GRAD),
                "dV": (rel_l2(self.view(dv)[:1, :heads], rdv), MAX_ERR_GRAD)}
        for name, (err, tol) in errs.items():
            if not err < tol:
                raise RuntimeError(f"{name}: relative L2 error {err:.3g} against the FP32 math backend (expected < "
                                   f"{tol}, backend {self.backend})")
        return max(err for err, _ in errs.values())


def time_pass(torch, work, pass_, min_time_s, min_iters=5, max_iters=10000):
    """Median seconds of one pass over CUDA events, after a warm-up pass (bwd runs on a retained forward graph)."""
    if pass_ == "bwd":
        work.forward()
    return peer_torch.median_pass_seconds(torch, lambda: work.run(pass_), min_time_s, min_iters, max_iters)


# ---- result file ---------------------------------------------------------------------------------------------------

COLUMNS = [("case", "str"), ("shape", "str"), ("recipe", "str"), ("time_us", "f64"), ("tflops", "f64"),
           ("gbps", "f64"), ("fraction_of_copy_bw", "f64"), ("speedup", "f64"), ("pass", "str"), ("B", "i64"),
           ("T", "i64"), ("H", "i64"), ("dqk", "i64"), ("dv", "i64"), ("backend", "str"), ("rel_err", "f64")]


def table_attributes(torch, command):
    return {
        "time_us": "median over the timed passes (CUDA events), microseconds",
        "tflops": "causal: fwd 2 B H T (T+1)/2 (dqk + dv), bwd 2.5x fwd, fwd+bwd 3.5x fwd, over time_us",
        "recipe": "torch_<backend>: torch.nn.functional.scaled_dot_product_attention, is_causal, BF16, the backend "
                  "chosen by sdpa_kernel (cuDNN, then memory-efficient, then flash: the first that runs)",
        "rel_err": "largest relative L2 error of O, dQ, dK, dV on sequence 0, heads 0-1 against SDPA's FP32 math "
                   "backend",
        "speedup": "NaN: the ratios to bench_attention are computed from its table /bench/attention",
        "gbps": "not measured (NaN)",
        "torch_version": str(torch.__version__),
        "peer_command": command,
    }


def write_into(path, rows, attributes, new_file_root):
    """Adds (or replaces) /bench/attention_torch in the result file `path`, or creates it with the root attributes
    `new_file_root()`; atomically (peer_result_file.write_table)."""
    peer_result_file.write_table(path, FAMILY, COLUMNS, rows, attributes, new_file_root)


# ---- main ----------------------------------------------------------------------------------------------------------

def measure(torch, sdpa_kernel, SDPBackend, cases, min_time_s):
    """Rows of the table for the selected cases, and the names of the cases that failed."""
    rows, failed = [], []
    by_shape = {}
    for shape, p in cases:
        by_shape.setdefault(shape, []).append(p)
    for shape, passes in by_shape.items():
        b, t, h, dqk, dv = SHAPES[shape]
        try:
            work = Workload(torch, sdpa_kernel, SDPBackend, shape, seed=1000 + t + h)
            err = work.check()
        except (RuntimeError, ValueError) as e:
            print(f"{PROGRAM}: {shape}: {e}", file=sys.stderr, flush=True)
            failed += [case_name(p, shape) for p in passes]
            torch.cuda.empty_cache()
            continue
        for p in passes:
            name = case_name(p, shape)
            try:
                s = time_pass(torch, work, p, min_time_s)
            except (RuntimeError, ValueError) as e:
                print(f"{PROGRAM}: {name}: {e}", file=sys.stderr, flush=True)
                failed.append(name)
                continue
            row = {"case": p, "shape": shape_text(shape), "recipe": f"torch_{work.backend}", "time_us": s * 1e6,
                   "tflops": flops(p, shape) / s * 1e-12, "gbps": math.nan, "fraction_of_copy_bw": math.nan,
                   "speedup": math.nan, "pass": p, "B": b, "T": t, "H": h, "dqk": dqk, "dv": dv,
                   "backend": work.backend, "rel_err": err}
            rows.append(row)
            print(json.dumps({"case": name, **{k: row[k] for k in ("pass", "shape", "backend", "time_us", "tflops",
                                                                   "B", "T", "H", "dqk", "dv", "rel_err")}}),
                  flush=True)
        del work
        torch.cuda.empty_cache()
    return rows, failed


def main(argv=None):
    p = argparse.ArgumentParser(description="PyTorch peer of bench_attention (torch SDPA, causal, BF16)")
    p.add_argument("--h5", help="HDF5 result file to add /bench/attention_torch to (created if absent)")
    p.add_argument("--filter", default="", help="regular expression on case names (re.search), as "
                                                "--benchmark_filter for bench_attention")
    p.add_argument("--min-time", type=float, default=0.05, help="seconds of timed passes per case (default 0.05)")
    p.add_argument("--list", action="store_true", help="print the selected case names and exit (no torch needed)")
    a = p.parse_args(argv)
    try:
        cases = selected_cases(a.filter)
    except re.error as e:
        print(f"{PROGRAM}: --filter is not a regular expression ({e}): {a.filter!r}", file=sys.stderr)
        return 2
    if a.list:
        for shape, pass_ in cases:
            print(case_name(pass_, shape))
        return 0
    if not cases:
        print(f"{PROGRAM}: no case matches --filter {a.filter!r}", file=sys.stderr)
        return 2
    if a.h5:
        why = peer_result_file.unwritable(a.h5)
        if why:
            print(f"{PROGRAM}: --h5 '{a.h5}': {why}", file=sys.stderr)
            return 2
    try:
        torch, sdpa_kernel, SDPBackend = require_torch()
    except Unavailable as e:
        print(f"{PROGRAM}: {e}", file=sys.stderr)
        return UNAVAILABLE
    command = shlex.join(["benchmarks/peers/attention_torch.py"] + (sys.argv[1:] if argv is None else list(argv)))
    print(f"{PROGRAM}: {len(cases)} cases on {torch.cuda.get_device_name(0)}, torch {torch.__version__}",
          file=sys.stderr, flush=True)
    rows, failed = measure(torch, sdpa_kernel, SDPBackend, cases, a.min_time)
    rc = 1 if failed else 0
    if rows and a.h5:
        try:
            write_into(a.h5, rows, table_attributes(torch, command),
                       lambda: peer_result_file.root_attributes(torch, command))
            print(f"{PROGRAM}: wrote {a.h5} (/bench/{FAMILY}, {len(rows)} rows)", file=sys.stderr, flush=True)
        except Exception as e:  # noqa: BLE001 (h5py raises OSError, KeyError, ...; one line either way)
            print(f"{PROGRAM}: cannot write {a.h5}: {e}", file=sys.stderr)
            rc = 1
    if failed:
        print(f"{PROGRAM}: failed: {', '.join(failed)}", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
