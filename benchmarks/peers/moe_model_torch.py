#!/usr/bin/env python3
"""moe_model_torch: the reference trainer's model (DESIGN.md "Trainer", trainer/model/model.h) written again in
PyTorch, one class per layer, with the trainer's parameter names, built from the same TOML configuration. Two uses:

    moe_model_torch.py parity FILE.h5 [--json OUT] [--device cuda|cpu]
    moe_model_torch.py bench --config configs/small.toml [--steps N] [--warmup N] [--seed N] [--peak-tflops X]
                             [--h5 PATH] [--section.key VALUE ...]

The architecture (d = hidden, H = heads, dq = nope + rope, dv = v_head_dim; every linear y = x W^T, W [out, in]):
    embed [V, d] -> per layer l:
        h += MLA(RMSNorm_attn_norm(h))
        h += SwiGLU FFN (l < n_dense_layers) or MoE (RMSNorm_ffn_norm(h))
    -> RMSNorm_norm -> lm_head [V, d] -> cross-entropy, mean over targets != -100
  RMSNorm      y = x / sqrt(mean(x^2) + eps) * w, statistics in FP32 (kernels/nn/rmsnorm.h)
  MLA          q = q_up(q_norm(q_down x)) viewed [T, H, nope | rope]  (q_lora_rank = 0: q_proj x, "attn.q_proj")
               kv_down x = [c_kv (kv_lora) | k_rope (rope)]; [k_nope | v] per head = kv_up(kv_norm(c_kv))
               K_h = [k_nope_h | RoPE(k_rope)] (one RoPE key shared by all heads), Q_h = [q_nope_h | RoPE(q_rope_h)]
               O_h = softmax(Q_h K_h^T / sqrt(dq) + causal mask) V_h; out = attn.out [O_0 | ... | O_H-1]
  RoPE         DeepSeek's interleaved pairs (2i, 2i+1) rotated by a = fl32(p * fl32(theta^(-2i/rope))),
               p = 0 .. T-1 in every row (kernels/nn/rope.h)
  SwiGLU       fc1 [2F, d] packed gate rows 0..F-1 | up rows F..2F-1; fc2(silu(gate) * up) (kernels/nn/swiglu.h)
  MoE          router logits = x W_r^T in FP32 [T, E];
                 v3: s = sigmoid(logits), top-k by s + router_bias (selection only), gate = routed_scale s / sum_k s
                 v2: p = softmax(logits), top-k by p, gate = routed_scale p; aux = aux_alpha sum_e f_e P_e,
                     f_e = E count_e / (k T) (a constant), P_e = mean_t p[t, e]          (kernels/nn/router.h)
               y = sum_k gate_k expert_k(x) + shared(x); experts.fc1 [E, 2f, d], experts.fc2 [E, d, f];
               shared = SwiGLU of S f units (shared.fc1 [2 S f, d], shared.fc2 [d, S f])
Parameter names (tensor_name(): the module path, ".weight" dropped): "embed", "layers.<l>.attn_norm",
"layers.<l>.attn.q_down", ".attn.q_norm", ".attn.q_up", ".attn.kv_down", ".attn.kv_norm", ".attn.kv_up", ".attn.out",
"layers.<l>.ffn_norm", ".mlp.fc1", ".mlp.fc2", ".moe.router", ".moe.experts.fc1", ".moe.experts.fc2",
".moe.shared.fc1", ".moe.shared.fc2", "norm", "lm_head"; the v3 state "layers.<l>.moe.router_bias" [E].

parity FILE.h5 (written by `fp4moe parity`, cli/cmd_parity.cpp): loads the configuration (root attribute
config_toml), the BF16 weights (params/<name> as float32), the batch (tokens, targets [B, T]), the routing of every
MoE layer (routing/<l> [B*T, k]), the states, and our loss, aux_loss and gradients (grads/<name>). Runs forward and
backward twice with the routing forced to the dumped one (gates computed from this model's own scores for those
experts): in FP32 (TF32 off; the reference) and under BF16 autocast (the noise floor of a BF16 computation).
Pass criteria (exit 1 when one fails):
    loss:       |ours - torch_fp32| <= 1e-3 |torch_fp32|
    gradients:  for every parameter, rel_l2(ours, torch_fp32) <= max(3 x rel_l2(torch_bf16, torch_fp32), 1e-2)
                (the BF16 tolerance), with rel_l2(a, r) = ||a - r||_2 / ||r||_2 (0 when both are 0)
The aux loss and the agreement of this model's own top-k with the dumped routing are reported, not judged. The
report prints the worst tensors first (largest error over tolerance); the JSON (stdout, or --json OUT with the
table on stdout instead) holds every number.

bench --config FILE: the throughput peer of `fp4moe train`. BF16 weights with FP32 master weights and fused
torch.optim.AdamW (gradient clipping as train.grad_clip), eager mode, random tokens; the routed experts through
torch._grouped_mm (tokens sorted by expert, every expert's rows padded with zeros to a multiple of 16 and to at
least 16, int32 cumulative offsets, the last group extended to the buffer's end so that no row is left unwritten),
attention through scaled_dot_product_attention: the cuDNN backend (Dqk != Dv) when this torch runs it, else the
flash backend with V zero-padded to Dqk (the row says which ran, and why cuDNN did not). Reports one JSON line:
tokens/s, the median step time, model TFLOP/s and MFU (trainer/flops.h's formula, model_flops_per_token() here,
against --peak-tflops, default 989: H100/H200 dense BF16), peak memory. --h5 PATH adds the table
/bench/moe_model_torch to an HDF5 result file (the layout and conventions of group_linear_torch.py).

Exit codes: 0 success (parity: every criterion met); 1 a criterion failed, a step failed or the file could not be
written; 2 bad arguments or input file; 3 PyTorch, CUDA or an operator is missing (one line on stderr).
The configuration and FLOP parts need neither torch nor a GPU (tests/python/test_moe_model_torch.py).
"""

import argparse
import contextlib
import json
import math
import os
import shlex
import statistics
import sys
import tomllib

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # the configuration, FLOP and comparison parts run without torch
    torch = F = None

PEERS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(PEERS))
PROGRAM = "moe_model_torch"
FAMILY = "moe_model_torch"
UNAVAILABLE = 3
IGNORE_INDEX = -100
LOSS_RTOL = 1e-3
GRAD_BF16_FACTOR = 3.0
GRAD_MIN_TOL = 1e-2
GROUPED_MM_ALIGN = 16  # rows per expert padded to a multiple of this (16-byte TMA rows for BF16 and FP8 alike)
H100_H200_DENSE_BF16_FLOPS = 989e12  # trainer/flops.h kH100H200DenseBf16Flops
SECTIONS = ("model", "moe", "train", "recipe", "recompute")


class Unavailable(Exception):
    """What this machine lacks to run (exit 3)."""


class BadInput(Exception):
    """A bad argument, configuration or input file (exit 2)."""


# ---- configuration (no torch) ----------------------------------------------------------------------------------------

def convert_value(text, current, option):
    """The command-line text of --section.key converted to the type of the value the TOML file holds."""
    try:
        if isinstance(current, bool):
            if text.lower() not in ("true", "false"):
                raise ValueError("expected true or false")
            return text.lower() == "true"
        if isinstance(current, int):
            return int(text, 10)
        if isinstance(current, float):
            return float(text)
        if isinstance(current, list):
            return [v for v in (s.strip() for s in text.replace(",", " ").split()) if v]
        return text
    except ValueError as e:
        kind = {int: "an integer", float: "a number", list: "a list"}.get(type(current), "a value")
        raise BadInput(f"--{option} {text!r}: not {kind} ({e})") from None


def parse_overrides(args):
    """["--train.seq_len", "1024", "--moe.top_k=4"] -> [("train", "seq_len", "1024"), ("moe", "top_k", "4")]."""
    out, i = [], 0
    while i < len(args):
        a = args[i]
        if not a.startswith("--") or "." not in a.split("=", 1)[0]:
            raise BadInput(f"unexpected argument {a!r} (configuration overrides are --section.key VALUE)")
        name, eq, value = a[2:].partition("=")
        if not eq:
            if i + 1 >= len(args):
                raise BadInput(f"--{name} needs a value")
            value = args[i + 1]
            i += 1
        section, _, key = name.partition(".")
        out.append((section, key, value))
        i += 1
    return out


def load_config(path, overrides=()):
    """The TOML file `path` as {section: {key: value}}, with (section, key, text) overrides applied (the command
    line wins, as for `fp4moe train`). Rejects an unreadable file, invalid TOML, an override of a key the file
    does not hold, a value that does not convert (BadInput)."""
    try:
        with open(path, "rb") as f:
            cfg = tomllib.load(f)
    except OSError as e:
        raise BadInput(f"--config '{path}': {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise BadInput(f"--config '{path}': not valid TOML ({e})") from None
    for section, key, text in overrides:
        if section not in cfg or key not in cfg[section]:
            raise BadInput(f"--{section}.{key}: no such key in '{path}' (sections: {', '.join(cfg)})")
        cfg[section][key] = convert_value(text, cfg[section][key], f"{section}.{key}")
    check_config(cfg, path)
    return cfg


MODEL_KEYS = {"vocab_size": int, "hidden": int, "layers": int, "n_dense_layers": int, "heads": int,
              "q_lora_rank": int, "kv_lora_rank": int, "qk_nope_head_dim": int, "qk_rope_head_dim": int,
              "v_head_dim": int, "dense_ffn": int, "rope_theta": float, "norm_eps": float}
MOE_KEYS = {"routed_experts": int, "shared_experts": int, "top_k": int, "expert_ffn": int, "router": str,
            "routed_scale": float}


def check_keys(cfg, section, keys, where):
    """cfg[section] holds each of `keys` ({key: type}) of its type (an int is accepted for a float). Raises BadInput
    naming the section or key."""
    if section not in cfg:
        raise BadInput(f"{where}: no [{section}] section")
    for key, kind in keys.items():
        v = cfg[section].get(key)
        ok = isinstance(v, kind) or (kind is float and isinstance(v, int))
        if v is None or isinstance(v, bool) or not ok:
            raise BadInput(f"{where}: {section}.{key} must be a {kind.__name__}, got {v!r}")


def check_config(cfg, where):
    """The [model] keys this model needs, the [moe] keys when some layer is MoE (layers > n_dense_layers; as
    `fp4moe train`, a dense model needs no [moe] section), and the shape rules that make it buildable. Raises
    BadInput naming the key."""
    check_keys(cfg, "model", MODEL_KEYS, where)
    m = cfg["model"]
    if not 0 <= m["n_dense_layers"] <= m["layers"] or m["layers"] < 1:
        raise BadInput(f"{where}: needs layers >= 1 and 0 <= n_dense_layers <= layers")
    if m["qk_rope_head_dim"] % 2:
        raise BadInput(f"{where}: model.qk_rope_head_dim must be even (RoPE rotates pairs)")
    moments = cfg.get("train", {}).get("moments", "fp32")
    if moments != "fp32":  # torch's fused AdamW here keeps its state in the FP32 masters' dtype
        raise BadInput(f"{where}: train.moments = {moments!r}: this peer keeps AdamW's moments in FP32 only")
    if m["layers"] > m["n_dense_layers"]:
        check_keys(cfg, "moe", MOE_KEYS, where)
        e = cfg["moe"]
        if e["router"] not in ("v2", "v3"):
            raise BadInput(f"{where}: moe.router must be \"v2\" or \"v3\", got {e['router']!r}")
        if not 1 <= e["top_k"] <= e["routed_experts"]:
            raise BadInput(f"{where}: needs 1 <= moe.top_k <= moe.routed_experts")


# ---- FLOPs (no torch): trainer/flops.h -------------------------------------------------------------------------------

def count_parameters(cfg):
    """trainer/flops.h count_parameters: {part: count} with total, activated and activated_matmul (integers)."""
    m, e = cfg["model"], cfg.get("moe", {})
    d, H = m["hidden"], m["heads"]
    dq = m["qk_nope_head_dim"] + m["qk_rope_head_dim"]
    if m["q_lora_rank"] > 0:
        mla_matmul = d * m["q_lora_rank"] + m["q_lora_rank"] * H * dq
        mla_norms = m["q_lora_rank"]
    else:
        mla_matmul, mla_norms = d * H * dq, 0
    mla_matmul += d * (m["kv_lora_rank"] + m["qk_rope_head_dim"])
    mla_norms += m["kv_lora_rank"]
    mla_matmul += m["kv_lora_rank"] * H * (m["qk_nope_head_dim"] + m["v_head_dim"])
    mla_matmul += H * m["v_head_dim"] * d
    L, dense = m["layers"], m["n_dense_layers"]
    moe = L - dense
    E, S, k = e.get("routed_experts", 0), e.get("shared_experts", 0), e.get("top_k", 0)
    expert = 3 * d * e.get("expert_ffn", 0)
    router_bias = E if e.get("router") == "v3" else 0
    c = {"embedding": m["vocab_size"] * d, "lm_head": m["vocab_size"] * d, "attention": L * (mla_matmul + mla_norms),
         "norms": L * 2 * d + d, "dense_ffn": dense * 3 * d * m["dense_ffn"], "router": moe * (E * d + router_bias),
         "routed_experts": moe * E * expert, "shared_experts": moe * S * expert}
    c["total"] = sum(c.values())
    c["activated_matmul"] = (L * mla_matmul + c["dense_ffn"] + moe * E * d + moe * (k + S) * expert + c["lm_head"])
    c["activated"] = c["activated_matmul"] + L * mla_norms + c["norms"] + moe * router_bias + d
    return c


def attention_flops_per_token(cfg, seq_len):
    """Per layer, per token, forward, causal: H (dq + dv) (T + 1) (trainer/flops.h)."""
    m = cfg["model"]
    return m["heads"] * (m["qk_nope_head_dim"] + m["qk_rope_head_dim"] + m["v_head_dim"]) * (seq_len + 1)


def model_flops_per_token(cfg, seq_len):
    """{"forward", "attention", "training"}: 2 x activated matmul parameters + attention over all layers; training
    = 3 x forward (trainer/flops.h model_flops_per_token)."""
    attention = float(cfg["model"]["layers"] * attention_flops_per_token(cfg, seq_len))
    forward = 2.0 * count_parameters(cfg)["activated_matmul"] + attention
    return {"forward": forward, "attention": attention, "training": 3.0 * forward}


def model_flops_utilization(cfg, seq_len, tokens_per_second, peak_flops=H100_H200_DENSE_BF16_FLOPS):
    return model_flops_per_token(cfg, seq_len)["training"] * tokens_per_second / peak_flops


# ---- the model (torch) -----------------------------------------------------------------------------------------------

Module = torch.nn.Module if torch is not None else object


def tensor_name(torch_name):
    """The trainer's name of a parameter or buffer: the module path, without nn.Module's ".weight"."""
    return torch_name[: -len(".weight")] if torch_name.endswith(".weight") else torch_name


def linear(in_features, out_features):
    """nn.Linear without bias: weight [out, in], y = x W^T."""
    return torch.nn.Linear(in_features, out_features, bias=False)


class RMSNorm(Module):
    """x [..., C] -> x / sqrt(mean_c x^2 + eps) * weight [C], in FP32, returned in x's dtype."""

    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        rstd = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (xf * rstd * self.weight.float()).to(x.dtype)


def rope_tables(seq_len, dim, theta, device):
    """cos, sin [seq_len, dim / 2] FP32 of the angles a[p, i] = fl32(p * inv_freq[i]), inv_freq[i] =
    fl32(theta^(-2i / dim)) in double (kernels/nn/rope.h rope_inv_freq, theta first rounded to FP32 as RopeConfig
    holds it); cos and sin of the FP32 angle in double, rounded to FP32."""
    theta32 = float(torch.tensor(theta, dtype=torch.float32))
    i = torch.arange(dim // 2, dtype=torch.float64, device=device)
    inv_freq = torch.pow(torch.tensor(theta32, dtype=torch.float64, device=device), -2.0 * i / dim).float()
    pos = torch.arange(seq_len, dtype=torch.float32, device=device)
    angle = (pos[:, None] * inv_freq[None, :]).double()  # the FP32 product, rounded once
    return torch.cos(angle).float(), torch.sin(angle).float()


def apply_rope(x, cos, sin):
    """x [B, T, h, D] -> the interleaved rotation: pair i = (x[2i], x[2i+1]) at position t becomes
    (x0 cos - x1 sin, x0 sin + x1 cos), cos/sin [T, D/2]. In FP32, returned in x's dtype."""
    xf = x.float().unflatten(-1, (-1, 2))
    x0, x1 = xf[..., 0], xf[..., 1]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2).to(x.dtype)


class CausalAttention(Module):
    """The attention core: q, k [B, T, H, Dqk], v [B, T, H, Dv] -> softmax(q k^T scale + causal mask) v [B, T, H, Dv].
    backend "math": explicit scores and an FP32 softmax (the parity check, any dtype); "cudnn": SDPA's cuDNN
    backend (Dqk != Dv taken as is); "flash": SDPA's flash backend on q, k, v zero-padded to one head dim
    (padding q and k adds nothing to q k^T; the padded output columns are dropped)."""

    def __init__(self, backend="math"):
        super().__init__()
        if backend not in ("math", "cudnn", "flash"):
            raise ValueError(f"attention backend must be math, cudnn or flash, got {backend!r}")
        self.backend = backend

    def forward(self, q, k, v, scale):
        if self.backend == "math":
            T = q.shape[1]
            scores = torch.einsum("bthd,bshd->bhts", q, k).float() * scale
            future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
            p = scores.masked_fill(future, float("-inf")).softmax(dim=-1)
            return torch.einsum("bhts,bshd->bthd", p.to(v.dtype), v)
        from torch.nn.attention import SDPBackend, sdpa_kernel
        dv = v.shape[-1]
        qt, kt, vt = (t.contiguous().transpose(1, 2) for t in (q, k, v))  # [B, H, T, D] views of [B, T, H, D]
        if self.backend == "cudnn":
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, scale=scale)
        else:
            dim = max(q.shape[-1], dv)
            qt, kt, vt = (F.pad(t, (0, dim - t.shape[-1])) if t.shape[-1] < dim else t for t in (qt, kt, vt))
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, scale=scale)[..., :dv]
        return o.transpose(1, 2)


class MLA(Module):
    """Multi-head latent attention (DeepSeek-V2 sec. 2.1) as trained: queries through the q_lora bottleneck, keys
    and values up-projected from the kv latent, one decoupled RoPE key shared by the heads. x [B, T, d] -> [B, T, d]."""

    def __init__(self, m, core):
        super().__init__()
        d, H = m["hidden"], m["heads"]
        self.H, self.nope, self.rope, self.dv = H, m["qk_nope_head_dim"], m["qk_rope_head_dim"], m["v_head_dim"]
        self.kv_lora = m["kv_lora_rank"]
        self.scale = 1.0 / math.sqrt(self.nope + self.rope)
        dq = self.nope + self.rope
        if m["q_lora_rank"] > 0:
            self.q_down = linear(d, m["q_lora_rank"])
            self.q_norm = RMSNorm(m["q_lora_rank"], m["norm_eps"])
            self.q_up = linear(m["q_lora_rank"], H * dq)
        else:
            self.q_proj = linear(d, H * dq)
        self.kv_down = linear(d, self.kv_lora + self.rope)
        self.kv_norm = RMSNorm(self.kv_lora, m["norm_eps"])
        self.kv_up = linear(self.kv_lora, H * (self.nope + self.dv))
        self.out = linear(H * self.dv, d)
        self.core = core

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        H, nope, rope, dv = self.H, self.nope, self.rope, self.dv
        q = self.q_up(self.q_norm(self.q_down(x))) if hasattr(self, "q_up") else self.q_proj(x)
        q_nope, q_rope = q.view(B, T, H, nope + rope).split([nope, rope], dim=-1)
        c_kv, k_rope = self.kv_down(x).split([self.kv_lora, rope], dim=-1)
        k_rope = apply_rope(k_rope.unsqueeze(2), cos, sin)  # [B, T, 1, rope]: one key for every head
        k_nope, v = self.kv_up(self.kv_norm(c_kv)).view(B, T, H, nope + dv).split([nope, dv], dim=-1)
        q = torch.cat((q_nope, apply_rope(q_rope, cos, sin)), dim=-1)
        k = torch.cat((k_nope, k_rope.expand(B, T, H, rope)), dim=-1)
        o = self.core(q, k, v, self.scale)  # [B, T, H, dv]
        return self.out(o.reshape(B, T, H * dv))


class SwiGLU(Module):
    """The dense FFN and the shared experts: fc2(silu(gate) * up), [gate | up] = fc1 x with fc1 [2F, d] packed
    (gate rows first), fc2 [d, F]."""

    def __init__(self, d, ffn):
        super().__init__()
        self.fc1 = linear(d, 2 * ffn)
        self.fc2 = linear(ffn, d)

    def forward(self, x):
        gate, up = self.fc1(x).chunk(2, dim=-1)
        return self.fc2(F.silu(gate) * up)


class Router(Module):
    """Router logits x W_r^T [N, E] in FP32 whatever the surrounding precision (DESIGN.md "Recipes")."""

    def __init__(self, d, experts):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(experts, d))

    def forward(self, x):
        with torch.autocast(device_type=x.device.type, enabled=False):
            return F.linear(x.float(), self.weight.float())


def route(logits, bias, style, k, scale, aux_alpha, forced=None):
    """kernels/nn/router.h on logits [N, E] FP32 -> (topk_idx [N, k] int64, gates [N, k] FP32, this router's own
    top-k [N, k], aux loss 0-d FP32). With `forced` [N, k] the experts are those (the gates still come from these
    scores); otherwise the router's own choice."""
    N, E = logits.shape
    probs = torch.sigmoid(logits) if style == "v3" else torch.softmax(logits, dim=-1)
    select = probs.detach() + bias if (style == "v3" and bias is not None) else probs.detach()
    own = torch.topk(select, k, dim=-1).indices
    idx = own if forced is None else forced
    g = probs.gather(1, idx)
    gates = scale * (g / g.sum(dim=-1, keepdim=True) if style == "v3" else g)
    aux = logits.new_zeros(())
    if style == "v2" and aux_alpha > 0:
        counts = torch.zeros(E, device=logits.device).index_add_(
            0, idx.reshape(-1), torch.ones(N * k, device=logits.device))
        f = counts * (E / (k * N))  # no gradient: V2's f_e is a constant
        aux = aux_alpha * (f * probs.mean(dim=0)).sum()
    return idx, gates, own, aux


class RoutedExperts(Module):
    """E SwiGLU experts: fc1 [E, 2f, d] (gate | up rows), fc2 [E, d, f]. x [N, d], topk_idx and gates [N, k] ->
    sum_j gates[:, j] expert_{idx[:, j]}(x) [N, d]. grouped=False: a loop over experts with an FP32 combine (the
    parity check, any dtype); grouped=True: torch._grouped_mm on BF16 weights (the throughput peer)."""

    def __init__(self, experts, d, f, grouped=False):
        super().__init__()
        self.fc1 = torch.nn.Parameter(torch.empty(experts, 2 * f, d))
        self.fc2 = torch.nn.Parameter(torch.empty(experts, d, f))
        self.grouped = grouped

    def forward(self, x, topk_idx, gates):
        return self.forward_grouped(x, topk_idx, gates) if self.grouped else self.forward_loop(x, topk_idx, gates)

    def forward_loop(self, x, topk_idx, gates):
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        for e in range(self.fc1.shape[0]):
            token, slot = torch.nonzero(topk_idx == e, as_tuple=True)
            if token.numel() == 0:
                continue
            gate, up = F.linear(x[token], self.fc1[e]).chunk(2, dim=-1)
            y = F.linear(F.silu(gate) * up, self.fc2[e])
            out.index_add_(0, token, y.float() * gates[token, slot].unsqueeze(-1))
        return out.to(x.dtype)

    def forward_grouped(self, x, topk_idx, gates):
        """Sort the N k assignments by expert (stable: token order within an expert), give expert e the padded
        rows [start_e, end_e) of a buffer of M rows: its count rounded up to GROUPED_MM_ALIGN, at least
        GROUPED_MM_ALIGN (no empty group), zero rows after its tokens; the last group runs to M, a bound known
        without a device-to-host copy, so every row of the grouped GEMMs' outputs (forward and Dgrad) is written."""
        N, k = topk_idx.shape
        E, d, A = self.fc1.shape[0], x.shape[1], GROUPED_MM_ALIGN
        dev = x.device
        flat = topk_idx.reshape(-1)                                        # expert of assignment a = t k + j
        order = torch.argsort(flat, stable=True)                           # assignments sorted by expert
        counts = torch.zeros(E, dtype=torch.int64, device=dev).scatter_add_(0, flat, torch.ones_like(flat))
        rows = torch.clamp((counts + A - 1) // A * A, min=A)
        ends = torch.cumsum(rows, dim=0)
        M = (N * k + E * A + A - 1) // A * A                               # >= sum(rows)
        e_sorted = flat[order]
        rank = torch.arange(N * k, device=dev) - (torch.cumsum(counts, dim=0) - counts)[e_sorted]
        row_of = torch.empty_like(flat)
        row_of[order] = (ends - rows)[e_sorted] + rank                     # buffer row of assignment a
        source = torch.full((M,), N, dtype=torch.int64, device=dev)        # row N of x_ext is zeros
        source[row_of] = torch.arange(N * k, device=dev) // k
        offs = ends.to(torch.int32)
        offs[-1] = M
        xs = torch.cat((x, x.new_zeros(1, d)))[source]                     # [M, d]
        gate, up = torch._grouped_mm(xs, self.fc1.transpose(-2, -1), offs=offs).chunk(2, dim=-1)
        ys = torch._grouped_mm(F.silu(gate) * up, self.fc2.transpose(-2, -1), offs=offs)  # [M, d]
        return torch.bmm(gates.to(ys.dtype).unsqueeze(1), ys[row_of].view(N, k, d)).squeeze(1)


class MoE(Module):
    """Router, routed experts and shared experts. x [B, T, d] -> (y [B, T, d], topk_idx [B*T, k], aux loss)."""

    def __init__(self, m, e, grouped=False):
        super().__init__()
        d, E = m["hidden"], e["routed_experts"]
        self.style, self.k = e["router"], e["top_k"]
        self.scale, self.aux_alpha = float(e["routed_scale"]), float(e.get("aux_alpha", 0.0))
        self.router = Router(d, E)
        if self.style == "v3":
            self.register_buffer("router_bias", torch.zeros(E))
        else:
            self.router_bias = None
        self.experts = RoutedExperts(E, d, e["expert_ffn"], grouped)
        self.shared = SwiGLU(d, e["shared_experts"] * e["expert_ffn"]) if e["shared_experts"] > 0 else None
        self.own_topk = None  # the router's own choice in the last forward (parity: agreement with the dump)

    def forward(self, x, forced=None):
        B, T, d = x.shape
        xt = x.reshape(B * T, d)
        bias = self.router_bias.float() if self.router_bias is not None else None
        idx, gates, self.own_topk, aux = route(self.router(xt), bias, self.style, self.k, self.scale,
                                               self.aux_alpha, forced)
        y = self.experts(xt, idx, gates)
        if self.shared is not None:
            y = y + self.shared(xt)
        return y.view(B, T, d), idx, aux


class DecoderLayer(Module):
    """h += MLA(attn_norm(h)); h += FFN(ffn_norm(h)), the FFN dense (mlp) or MoE (moe)."""

    def __init__(self, cfg, layer, core, grouped=False):
        super().__init__()
        m, e = cfg["model"], cfg.get("moe")
        self.attn_norm = RMSNorm(m["hidden"], m["norm_eps"])
        self.attn = MLA(m, core)
        self.ffn_norm = RMSNorm(m["hidden"], m["norm_eps"])
        if layer < m["n_dense_layers"]:
            self.mlp = SwiGLU(m["hidden"], m["dense_ffn"])
        else:
            self.moe = MoE(m, e, grouped)

    def forward(self, h, cos, sin, forced=None):
        h = h + self.attn(self.attn_norm(h), cos, sin)
        x = self.ffn_norm(h)
        if hasattr(self, "mlp"):
            return h + self.mlp(x), None, None
        y, idx, aux = self.moe(x, forced)
        return h + y, idx, aux


class MoEModel(Module):
    """The whole decoder. forward(tokens, targets [B, T] int64, routing {layer: [B*T, k]} or None) ->
    (mean cross-entropy over targets != -100, aux loss summed over MoE layers, {layer: topk_idx used})."""

    def __init__(self, cfg, attention="math", grouped_experts=False):
        super().__init__()
        m = cfg["model"]
        self.vocab, self.rope_dim, self.theta = m["vocab_size"], m["qk_rope_head_dim"], float(m["rope_theta"])
        core = CausalAttention(attention)
        self.embed = torch.nn.Embedding(m["vocab_size"], m["hidden"])
        self.layers = torch.nn.ModuleList(DecoderLayer(cfg, l, core, grouped_experts) for l in range(m["layers"]))
        self.norm = RMSNorm(m["hidden"], m["norm_eps"])
        self.lm_head = linear(m["hidden"], m["vocab_size"])

    def forward(self, tokens, targets, routing=None):
        T = tokens.shape[1]
        cos, sin = rope_tables(T, self.rope_dim, self.theta, tokens.device)
        h = self.embed(tokens)
        aux = torch.zeros((), dtype=torch.float32, device=tokens.device)
        used = {}
        for l, layer in enumerate(self.layers):
            h, idx, a = layer(h, cos, sin, None if routing is None else routing.get(l))
            if idx is not None:
                used[l], aux = idx, aux + a
        logits = self.lm_head(self.norm(h))
        ce = F.cross_entropy(logits.float().view(-1, self.vocab), targets.reshape(-1), ignore_index=IGNORE_INDEX)
        return ce, aux, used

    def named_tensors(self):
        """{trainer name: tensor} of every parameter and state (router_bias) buffer."""
        out = {tensor_name(n): p for n, p in self.named_parameters()}
        out.update({tensor_name(n): b for n, b in self.named_buffers() if n.endswith("router_bias")})
        return out


def require_torch(device="cuda"):
    """torch, or Unavailable saying what is missing for `device`."""
    if torch is None:
        raise Unavailable("PyTorch is not installed; the parity check and the peer need torch (with CUDA for "
                          "--device cuda and for bench)")
    if device == "cuda" and not torch.cuda.is_available():
        raise Unavailable(f"PyTorch {torch.__version__} sees no CUDA device (built for CUDA {torch.version.cuda})")
    return torch


# ---- parity: the file and the comparison (numpy, h5py) ---------------------------------------------------------------

def read_parity_file(path):
    """The HDF5 file of `fp4moe parity` -> {"config", "config_path", "tokens", "targets" (int64 [B, T]), "loss",
    "aux_loss" (float), "params", "grads", "states" ({name: float32 array}), "routing" ({layer: int64 [B*T, k]})}.
    Raises BadInput naming what is missing."""
    import h5py
    import numpy as np
    if not os.path.isfile(path):
        raise BadInput(f"'{path}' is not a file")
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise BadInput(f"'{path}' is not an HDF5 file ({' '.join(str(e).split())})") from None
    with f:
        def attr(name):
            if name not in f.attrs:
                raise BadInput(f"'{path}' has no root attribute '{name}': not a file of `fp4moe parity`")
            v = f.attrs[name]
            return v.decode() if isinstance(v, bytes) else v

        def need(name):
            if name not in f:
                raise BadInput(f"'{path}' has no '{name}': not a file of `fp4moe parity`")
            return f[name]

        try:
            cfg = tomllib.loads(str(attr("config_toml")))
        except tomllib.TOMLDecodeError as e:
            raise BadInput(f"'{path}': the config_toml attribute is not TOML ({e})") from None
        check_config(cfg, f"'{path}' (config_toml)")
        out = {"config": cfg, "config_path": str(attr("config_path")),
               "tokens": need("tokens")[()].astype(np.int64), "targets": need("targets")[()].astype(np.int64),
               "loss": float(need("loss")[()]), "aux_loss": float(need("aux_loss")[()])}
        for group in ("params", "grads", "states"):
            g = f[group] if group in f else {}
            out[group] = {name: g[name][()].astype(np.float32) for name in g}
        r = f["routing"] if "routing" in f else {}
        out["routing"] = {int(name): r[name][()].astype(np.int64) for name in r}
    if not out["params"]:
        raise BadInput(f"'{path}' holds no params/: not a file of `fp4moe parity`")
    if out["tokens"].ndim != 2 or out["targets"].shape != out["tokens"].shape:
        raise BadInput(f"'{path}': tokens {out['tokens'].shape} and targets {out['targets'].shape} must be the same "
                       f"[B, T]")
    missing = sorted(set(out["params"]) - set(out["grads"]))
    if missing:
        raise BadInput(f"'{path}': no gradient for {', '.join(missing)}")
    return out


def rel_l2(a, ref):
    """||a - ref|| / ||ref|| in float64; 0 when both are zero, inf when only ref is (or a value is not finite)."""
    import numpy as np
    a, ref = np.asarray(a, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    if not (np.isfinite(a).all() and np.isfinite(ref).all()):
        return math.inf
    num, den = float(np.linalg.norm((a - ref).ravel())), float(np.linalg.norm(ref.ravel()))
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / den


def rel_diff(a, ref):
    if not (math.isfinite(a) and math.isfinite(ref)):
        return math.inf
    return abs(a - ref) / abs(ref) if ref != 0 else (0.0 if a == 0 else math.inf)


def compare(ours, fp32, bf16):
    """ours, fp32, bf16: {"loss", "aux_loss", "grads": {name: array}}. -> the report: the loss and aux-loss
    figures, one row per gradient (worst first: largest rel_err_ours / tolerance), and `pass` (the criteria in
    the module docstring)."""
    tensors = []
    for name in sorted(fp32["grads"]):
        ref = fp32["grads"][name]
        e_ours = rel_l2(ours["grads"][name], ref) if name in ours["grads"] else math.inf
        e_bf16 = rel_l2(bf16["grads"][name], ref)
        # a non-finite BF16 run gives no noise floor: the floor alone then
        tol = max(GRAD_BF16_FACTOR * e_bf16, GRAD_MIN_TOL) if math.isfinite(e_bf16) else GRAD_MIN_TOL
        tensors.append({"name": name, "shape": list(ref.shape), "rel_err_ours": e_ours, "rel_err_torch_bf16": e_bf16,
                        "tolerance": tol, "pass": e_ours <= tol})
    tensors.sort(key=lambda r: (-(r["rel_err_ours"] / r["tolerance"]), r["name"]))
    loss_rel = rel_diff(ours["loss"], fp32["loss"])
    report = {
        "loss": {"ours": ours["loss"], "torch_fp32": fp32["loss"], "torch_bf16": bf16["loss"], "rel_diff": loss_rel,
                 "rel_diff_torch_bf16": rel_diff(bf16["loss"], fp32["loss"]), "tolerance": LOSS_RTOL,
                 "pass": loss_rel <= LOSS_RTOL},
        "aux_loss": {"ours": ours["aux_loss"], "torch_fp32": fp32["aux_loss"], "torch_bf16": bf16["aux_loss"],
                     "rel_diff": rel_diff(ours["aux_loss"], fp32["aux_loss"])},
        "tensors": tensors,
    }
    report["failed_tensors"] = [r["name"] for r in tensors if not r["pass"]]
    report["pass"] = report["loss"]["pass"] and not report["failed_tensors"]
    return report


def routing_agreement(dumped, own):
    """Fraction of tokens whose set of k experts is the same in `dumped` and `own` ([N, k] arrays)."""
    import numpy as np
    a, b = np.sort(np.asarray(dumped), axis=1), np.sort(np.asarray(own), axis=1)
    return float((a == b).all(axis=1).mean()) if len(a) else 1.0


def report_lines(report, limit=None):
    """The human-readable report: the loss, then the gradients worst first."""
    lo, aux = report["loss"], report["aux_loss"]
    lines = [f"loss: ours {lo['ours']:.7g}  torch fp32 {lo['torch_fp32']:.7g}  torch bf16 {lo['torch_bf16']:.7g}  "
             f"rel diff {lo['rel_diff']:.3g} (tolerance {lo['tolerance']:g}) {'ok' if lo['pass'] else 'FAIL'}",
             f"aux loss: ours {aux['ours']:.7g}  torch fp32 {aux['torch_fp32']:.7g}  rel diff {aux['rel_diff']:.3g}"]
    for layer, frac in sorted(report.get("routing_agreement", {}).items()):
        lines.append(f"routing of layer {layer}: torch's own top-k equals the dumped one for {100 * frac:.1f}% of "
                     f"tokens (the check forces the dumped one)")
    lines.append(f"{'gradient':<34} {'shape':<18} {'ours':>10} {'torch bf16':>10} {'tolerance':>10}")
    rows = report["tensors"] if limit is None else report["tensors"][:limit]
    for r in rows:
        shape = "x".join(map(str, r["shape"]))
        lines.append(f"{r['name']:<34} {shape:<18} {r['rel_err_ours']:10.3g} {r['rel_err_torch_bf16']:10.3g} "
                     f"{r['tolerance']:10.3g} {'ok' if r['pass'] else 'FAIL'}")
    n_fail = len(report["failed_tensors"])
    lines.append(f"{'PASS' if report['pass'] else 'FAIL'}: loss {'ok' if lo['pass'] else 'off'}, "
                 f"{len(report['tensors']) - n_fail} of {len(report['tensors'])} gradients within tolerance")
    return lines


def json_safe(v):
    """Non-finite floats become null (strict JSON)."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {str(k): json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_safe(x) for x in v]
    return v


# ---- parity: the torch runs ------------------------------------------------------------------------------------------

def load_into(model, dump):
    """Copies params/ and states/ of the dump into the model; rejects a missing, extra or misshapen tensor."""
    mine = model.named_tensors()
    theirs = {**dump["params"], **dump["states"]}
    missing, extra = sorted(set(mine) - set(theirs)), sorted(set(theirs) - set(mine))
    if missing or extra:
        raise BadInput(f"the file's tensors do not match this model's: missing {missing or 'none'}, not in this "
                       f"model {extra or 'none'}")
    with torch.no_grad():
        for name, t in mine.items():
            src = theirs[name]
            if tuple(src.shape) != tuple(t.shape):
                raise BadInput(f"{name}: the file holds shape {list(src.shape)}, this model {list(t.shape)}")
            t.copy_(torch.from_numpy(src))


def run_torch(dump, device, bf16):
    """Forward and backward of the dumped batch with the dumped routing, in FP32 or under BF16 autocast ->
    {"loss", "aux_loss", "grads" {name: float32 array}, "own_topk" {layer: array}}."""
    model = MoEModel(dump["config"], attention="math", grouped_experts=False)
    load_into(model, dump)
    model.to(device)
    tokens = torch.from_numpy(dump["tokens"]).to(device)
    targets = torch.from_numpy(dump["targets"]).to(device)
    routing = {l: torch.from_numpy(v).to(device) for l, v in dump["routing"].items()}
    moe_layers = [l for l, layer in enumerate(model.layers) if hasattr(layer, "moe")]
    if sorted(routing) != moe_layers:
        raise BadInput(f"the file routes layers {sorted(routing)}, the model's MoE layers are {moe_layers}")
    ctx = torch.autocast(device_type=device, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    with ctx:
        ce, aux, _ = model(tokens, targets, routing)
    (ce + aux).backward()
    grads = {tensor_name(n): p.grad.detach().float().cpu().numpy() for n, p in model.named_parameters()
             if p.grad is not None}
    own = {l: model.layers[l].moe.own_topk.cpu().numpy() for l in moe_layers}
    return {"loss": float(ce), "aux_loss": float(aux), "grads": grads, "own_topk": own}


def parity(path, device, json_path):
    """The parity check of the module docstring; returns the exit code."""
    dump = read_parity_file(path)
    require_torch(device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    fp32 = run_torch(dump, device, bf16=False)
    bf16 = run_torch(dump, device, bf16=True)
    ours = {"loss": dump["loss"], "aux_loss": dump["aux_loss"], "grads": dump["grads"]}
    report = compare(ours, fp32, bf16)
    report["routing_agreement"] = {l: routing_agreement(dump["routing"][l], fp32["own_topk"][l])
                                   for l in sorted(dump["routing"])}
    B, T = dump["tokens"].shape
    report = {"file": path, "config_path": dump["config_path"], "config": dump["config"]["model"].get("name", ""),
              "batch": B, "seq_len": T, "device": device, "torch_version": str(torch.__version__), **report}
    text_out = sys.stdout if json_path else sys.stderr
    print("\n".join(report_lines(report)), file=text_out, flush=True)
    payload = json.dumps(json_safe(report), indent=1)
    if json_path:
        with open(json_path, "w") as f:
            f.write(payload + "\n")
    else:
        print(payload, flush=True)
    return 0 if report["pass"] else 1


# ---- bench -----------------------------------------------------------------------------------------------------------

def pick_attention_backend(cfg, seq_len):
    """("cudnn" or "flash", why cuDNN was not taken or ""): the first backend that runs one forward and backward at
    the model's head count, head dims and seq_len (batch 1) and whose output, on a shorter sequence, matches the
    FP32 math core (relative L2 error below 2e-2: a wrongly applied scale or padding fails)."""
    m = cfg["model"]
    H, dq, dv = m["heads"], m["qk_nope_head_dim"] + m["qk_rope_head_dim"], m["v_head_dim"]
    scale = 1.0 / math.sqrt(dq)
    g = torch.Generator(device="cuda").manual_seed(0)

    def inputs(T):
        shapes = ((1, T, H, dq), (1, T, H, dq), (1, T, H, dv))
        return [torch.randn(s, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_() for s in shapes]

    full, short = inputs(seq_len), inputs(min(seq_len, 256))
    with torch.no_grad():
        ref = CausalAttention("math")(*(t.float() for t in short), scale)
    failures = []
    for backend in ("cudnn", "flash"):
        core = CausalAttention(backend)
        try:
            core(*full, scale).float().sum().backward()
            with torch.no_grad():
                err = float((core(*short, scale).float() - ref).norm() / ref.norm())
            torch.cuda.synchronize()
            if not err < 2e-2:
                raise RuntimeError(f"output off the FP32 reference by {err:.3g} (relative L2)")
            return backend, "; ".join(failures)
        except RuntimeError as e:
            failures.append(f"{backend}: {' '.join(str(e).split())[:300]}")
    raise Unavailable(f"no SDPA backend runs the attention ({'; '.join(failures)})")


def init_weights(model, std, seed):
    """Norm weights 1, every other parameter N(0, std^2) from a seeded generator on the parameters' device
    (throughput only: the values matter to the routing balance, not to any comparison)."""
    g = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.fill_(1.0)
            else:
                p.normal_(0.0, std, generator=g)


class Trainer:
    """BF16 model, FP32 master weights and gradients, fused AdamW, global-norm clipping; one step = forward,
    backward, gradient copy to FP32, clip, update, BF16 copy back."""

    def __init__(self, cfg, backend, seed):
        t = cfg["train"]
        with torch.device("cuda"):  # built and initialised on the GPU (FP32), then cast
            model = MoEModel(cfg, attention=backend, grouped_experts=True)
        init_weights(model, 0.02, seed)
        self.model = model.to(dtype=torch.bfloat16)
        for layer in self.model.layers:  # the routing bias stays FP32 state
            if hasattr(layer, "moe") and layer.moe.router_bias is not None:
                layer.moe.router_bias = layer.moe.router_bias.float()
        self.params = list(self.model.parameters())
        self.master = [p.detach().float().clone().requires_grad_() for p in self.params]
        for mp in self.master:
            mp.grad = torch.zeros_like(mp)
        decay = [mp for p, mp in zip(self.params, self.master) if p.ndim >= 2]
        no_decay = [mp for p, mp in zip(self.params, self.master) if p.ndim < 2]
        self.opt = torch.optim.AdamW([{"params": decay, "weight_decay": float(t.get("weight_decay", 0.0))},
                                      {"params": no_decay, "weight_decay": 0.0}],
                                     lr=float(t.get("lr", 1e-4)), betas=(float(t.get("beta1", 0.9)),
                                                                         float(t.get("beta2", 0.95))),
                                     eps=float(t.get("eps", 1e-8)), fused=True)
        self.clip = float(t.get("grad_clip", 0.0))
        B, T, V = t["micro_batch"], t["seq_len"], cfg["model"]["vocab_size"]
        g = torch.Generator(device="cuda").manual_seed(seed + 1)
        seqs = torch.randint(0, V, (B, T + 1), device="cuda", generator=g)
        self.tokens, self.targets = seqs[:, :-1].contiguous(), seqs[:, 1:].contiguous()

    def step(self):
        for p in self.params:
            p.grad = None
        ce, aux, _ = self.model(self.tokens, self.targets)
        (ce + aux).backward()
        grads = [p.grad for p in self.params]
        if any(gr is None for gr in grads):
            raise RuntimeError("a parameter received no gradient")
        with torch.no_grad():
            torch._foreach_copy_([mp.grad for mp in self.master], grads)
            if self.clip > 0:
                torch.nn.utils.clip_grad_norm_(self.master, self.clip, foreach=True)
            self.opt.step()
            torch._foreach_copy_([p.data for p in self.params], [mp.data for mp in self.master])
        return ce.detach()


def bench(cfg, config_path, steps, warmup, peak_tflops, seed):
    """Times `steps` training steps after `warmup` -> the result row (a dict)."""
    t = cfg["train"]
    B, T = t["micro_batch"], t["seq_len"]
    backend, why_not_cudnn = pick_attention_backend(cfg, T)
    trainer = Trainer(cfg, backend, seed)
    losses = [trainer.step() for _ in range(warmup)]
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(steps)]
    for start, stop in events:
        start.record()
        losses.append(trainer.step())
        stop.record()
    torch.cuda.synchronize()
    times = sorted(start.elapsed_time(stop) * 1e-3 for start, stop in events)
    median = statistics.median(times)
    loss_values = [float(v) for v in losses]
    if not all(math.isfinite(v) for v in loss_values):
        raise RuntimeError(f"non-finite loss in the timed steps: {loss_values}")
    tokens_per_s = B * T / median
    flops = model_flops_per_token(cfg, T)
    m = cfg["model"]
    return {
        "program": PROGRAM, "config": m.get("name", ""), "config_path": config_path, "layers": m["layers"],
        "micro_batch": B, "seq_len": T, "steps": steps, "warmup": warmup, "step_time_us": median * 1e6,
        "mean_step_time_us": sum(times) / len(times) * 1e6, "tokens_per_s": tokens_per_s,
        "training_flops_per_token": flops["training"], "model_tflops": flops["training"] * tokens_per_s * 1e-12,
        "mfu": flops["training"] * tokens_per_s / (peak_tflops * 1e12), "peak_tflops": peak_tflops,
        "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30,
        "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30,
        "attention_backend": backend, "attention_cudnn_refused": why_not_cudnn,
        "grouped_mm_align": GROUPED_MM_ALIGN, "loss_first": loss_values[0], "loss_last": loss_values[-1],
        "torch_version": str(torch.__version__), "gpu": torch.cuda.get_device_name(0),
    }


COLUMNS = [("case", "str"), ("shape", "str"), ("recipe", "str"), ("time_us", "f64"), ("tflops", "f64"),
           ("gbps", "f64"), ("fraction_of_copy_bw", "f64"), ("speedup", "f64"), ("config", "str"), ("layers", "i64"),
           ("micro_batch", "i64"), ("seq_len", "i64"), ("steps", "i64"), ("tokens_per_s", "f64"), ("mfu", "f64"),
           ("peak_mem_gib", "f64"), ("attention_backend", "str")]


def table_row(r):
    return {"case": "train_step", "shape": f"{r['config']} l{r['layers']} b{r['micro_batch']} t{r['seq_len']}",
            "recipe": "torch_bf16", "time_us": r["step_time_us"], "tflops": r["model_tflops"], "gbps": math.nan,
            "fraction_of_copy_bw": math.nan, "speedup": math.nan, "config": r["config"], "layers": r["layers"],
            "micro_batch": r["micro_batch"], "seq_len": r["seq_len"], "steps": r["steps"],
            "tokens_per_s": r["tokens_per_s"], "mfu": r["mfu"], "peak_mem_gib": r["peak_mem_gib"],
            "attention_backend": r["attention_backend"]}


def table_attributes(r, command):
    return {
        "time_us": "median training step (forward, backward, FP32 gradient copy, clip, fused AdamW, BF16 copy), "
                   "CUDA events, microseconds",
        "tflops": "model TFLOP/s: trainer/flops.h training FLOPs per token x tokens_per_s",
        "mfu": f"model TFLOP/s over {r['peak_tflops']:g} TFLOP/s",
        "peak_mem_gib": "torch.cuda.max_memory_allocated over the timed steps, GiB",
        "attention_backend": "cudnn: SDPA cuDNN with Dqk != Dv; flash: SDPA flash on V zero-padded to Dqk",
        "attention_cudnn_refused": r["attention_cudnn_refused"] or "",
        "recipe": "torch_bf16: BF16 weights, FP32 master and fused AdamW, torch._grouped_mm routed experts "
                  f"(each expert's rows padded to a multiple of {GROUPED_MM_ALIGN}), eager mode",
        "speedup": "NaN: ratios to the trainer are computed by the reproduction suite",
        "gbps": "not measured (NaN)",
        "torch_version": r["torch_version"], "config_path": r["config_path"], "peer_command": command,
    }


def write_into(path, rows, attributes, command):
    """Adds (or replaces) /bench/moe_model_torch in the result file `path`, or creates it with this machine's root
    attributes (peer_result_file.root_attributes); atomically (peer_result_file.write_table)."""
    sys.path.insert(0, PEERS)
    import peer_result_file
    peer_result_file.write_table(path, FAMILY, COLUMNS, rows, attributes,
                                 lambda: peer_result_file.root_attributes(torch, command))


# ---- main ------------------------------------------------------------------------------------------------------------

def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(prog="moe_model_torch.py", description="PyTorch model of the fp4moe trainer: "
                                "parity check of loss and gradients, and the throughput peer")
    sub = p.add_subparsers(dest="command", required=True)
    pp = sub.add_parser("parity", help="compare the loss and gradients of `fp4moe parity` with this model's")
    pp.add_argument("file", help="HDF5 file written by fp4moe parity")
    pp.add_argument("--json", help="write the JSON report here (default: stdout, the table then on stderr)")
    pp.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="where torch runs (default cuda)")
    pb = sub.add_parser("bench", help="training throughput of this model in BF16 (the peer of fp4moe train)")
    pb.add_argument("--config", required=True, help="trainer configuration (configs/*.toml); override any key "
                                                    "with --section.key VALUE")
    pb.add_argument("--steps", type=int, default=20, help="timed training steps (default 20)")
    pb.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    pb.add_argument("--peak-tflops", type=float, default=H100_H200_DENSE_BF16_FLOPS / 1e12,
                    help="the MFU's peak, TFLOP/s (default 989: H100/H200 SXM dense BF16)")
    pb.add_argument("--seed", type=int, default=None, help="weights and tokens (default: train.seed)")
    pb.add_argument("--h5", help="HDF5 result file to add /bench/moe_model_torch to (created if absent)")
    a, rest = p.parse_known_args(argv)
    try:
        if a.command == "parity":
            if rest:
                raise BadInput(f"unexpected arguments {' '.join(rest)}")
            return parity(a.file, a.device, a.json)
        cfg = load_config(a.config, parse_overrides(rest))
        if a.steps < 1 or a.warmup < 1:
            raise BadInput(f"--steps and --warmup must be >= 1, got {a.steps} and {a.warmup}")
        if a.peak_tflops <= 0:
            raise BadInput(f"--peak-tflops must be > 0, got {a.peak_tflops}")
        if a.h5:
            sys.path.insert(0, PEERS)
            import peer_result_file
            why = peer_result_file.unwritable(a.h5)
            if why:
                raise BadInput(f"--h5 '{a.h5}': {why}")
        require_torch("cuda")
        if not hasattr(torch, "_grouped_mm"):
            raise Unavailable(f"PyTorch {torch.__version__} has no torch._grouped_mm (2.8 or later)")
        seed = a.seed if a.seed is not None else int(cfg["train"].get("seed", 0))
        row = bench(cfg, a.config, a.steps, a.warmup, a.peak_tflops, seed)
    except BadInput as e:
        print(f"{PROGRAM}: {e}", file=sys.stderr)
        return 2
    except Unavailable as e:
        print(f"{PROGRAM}: {e}", file=sys.stderr)
        return UNAVAILABLE
    except RuntimeError as e:  # CUDA out of memory, an operator refusing its inputs, a non-finite loss
        print(f"{PROGRAM}: {a.command} failed: {' '.join(str(e).split())[:2000]}", file=sys.stderr)
        return 1
    print(json.dumps(json_safe(row)), flush=True)
    if a.h5:
        command = shlex.join(["benchmarks/peers/moe_model_torch.py"] + argv)
        try:
            write_into(a.h5, [table_row(row)], table_attributes(row, command), command)
        except Exception as e:  # noqa: BLE001 (h5py raises OSError, KeyError, ...; one line either way)
            print(f"{PROGRAM}: cannot write {a.h5}: {' '.join(str(e).split())}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
