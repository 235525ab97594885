// The per-buffer terms of the memory estimator (trainer/memory/estimate.h documents every formula): what a decoder
// layer keeps for backward under the recipe and recompute policy, its backward scratch, the model's terms outside
// the layers, and the expert- and pipeline-parallel communication buffers.
#include <algorithm>
#include <cmath>

#include "kernels/attention/flash_attention.h"
#include "kernels/common/check.h"
#include "kernels/nn/adamw.h"
#include "kernels/nn/rmsnorm.h"
#include "kernels/quant/layouts.h"
#include "trainer/memory/estimate_detail.h"
#include "trainer/model/group_linear.h"

namespace fp4moe::mem_detail {

namespace {

// Appends terms of one module and category; zero-byte buffers (absent tensors: r_q = 0) are left out, as
// DeviceMemory allocates nothing for them.
struct Terms {
  std::vector<MemoryTerm>& out;
  MemCategory category;
  const char* module;
  void add(const std::string& tensor, int64_t bytes, bool kept = true, bool device_memory = true,
           bool first_forward = false) const {
    if (bytes > 0) out.push_back(MemoryTerm{category, module, tensor, bytes, 1, kept, device_memory, first_forward});
  }
};

int64_t norm_partials(int64_t rows, int64_t C) { return 4 * rmsnorm_backward_workspace_floats(rows, C); }

// Bytes per routed row of the dispatch payload in a recipe (DESIGN.md "Expert parallelism"): BF16 rows, FP8 1x128
// rows with FP32 scales, or MXFP4 codes with UE8M0 scales.
int64_t dispatch_row_bytes(Recipe r, int64_t d) {
  if (r == Recipe::fp8) return d + 4 * ceil_div(d, kFp8Block);
  if (r == Recipe::mxfp4) return d / 2 + ceil_div(d, kMxBlock);
  return 2 * d;
}

}  // namespace

Dims dims_of(const TrainerConfig& cfg, const ParallelLayout& lay) {
  const ModelConfig& m = cfg.model;
  const MoeConfig& e = cfg.moe;
  Dims g{};
  const int64_t t = lay.tp;
  g.d = m.hidden;
  g.H = m.heads;
  g.Hl = m.heads / t;
  g.nope = m.qk_nope_head_dim;
  g.rope = m.qk_rope_head_dim;
  g.dqk = m.qk_head_dim();
  g.dv = m.v_head_dim;
  g.rq = m.q_lora_rank;
  g.rkv = m.kv_lora_rank;
  g.F = m.dense_ffn;
  g.Fl = m.dense_ffn / t;
  const bool has_moe = m.n_dense_layers < m.layers;
  g.E = has_moe ? e.routed_experts : 0;
  g.El = has_moe ? e.routed_experts / lay.ep : 0;
  g.k = has_moe ? e.top_k : 0;
  g.f = has_moe ? e.expert_ffn : 0;
  g.Sl = has_moe ? e.shared_experts * e.expert_ffn / t : 0;
  g.V = m.vocab_size;
  g.Vl = ceil_div(m.vocab_size, t);
  g.N = lay.micro_batch * lay.seq_len;
  g.Ns = ceil_div(g.N, t);
  const int64_t balanced = g.N * g.k;
  g.R = lay.routed_load == 1.0
            ? ceil_div(balanced, t)
            : static_cast<int64_t>(std::ceil(static_cast<double>(balanced) * lay.routed_load / static_cast<double>(t)));
  g.attn = cfg.recipe.attention;
  g.dense = cfg.recipe.dense_mlp;
  g.shared = cfg.recipe.shared_experts;
  g.routed = cfg.recipe.routed_experts;
  return g;
}

Policy policy_of(const RecomputeConfig& rc) {
  auto in = [&](const char* name) { return std::find(rc.modules.begin(), rc.modules.end(), name) != rc.modules.end(); };
  Policy p;
  p.full = in("full");
  p.mla_up_proj = in("mla_up_proj");
  p.core_attn = in("core_attn");
  p.layernorm = in("layernorm");
  p.moe_act = in("moe_act");
  p.moe = in("moe");
  p.mlp = in("mlp");
  p.shared_experts = in("shared_experts");
  return p;
}

QuantizedCopy quantized_input_copy(Recipe r, int64_t M, int64_t K, int64_t G) {
  if (M <= 0 || K <= 0) return {};
  if (r == Recipe::bf16) return {2 * M * K, 0};
  if (r == Recipe::mxfp4) return {M * ceil_div(K, 2), M * ceil_div(K, kMxBlock)};
  G = std::max<int64_t>(G, 1);
  const QuantizedCopy q{fp8_col_codes_capacity(M, K, G), 4 * fp8_col_scales_capacity(M, K, G)};
  FP4MOE_CHECK(q.codes + q.scales == static_cast<int64_t>(GroupLinear::held_activation_bytes(r, M, K, G)),
               "memory estimate: the FP8 column copy of [{}, {}] in {} groups disagrees with GroupLinear's count", M, K,
               G);
  return q;
}

int64_t quantized_input_bytes(Recipe r, int64_t M, int64_t K, int64_t G) {
  const QuantizedCopy q = quantized_input_copy(r, M, K, G);
  return q.codes + q.scales;
}

int64_t weight_copy_bytes(Recipe r, int64_t G, int64_t N, int64_t K, bool as_allocated) {
  if (r == Recipe::bf16) return 0;
  const int64_t exact = static_cast<int64_t>(GroupLinear::weight_copy_bytes(r, G, N, K));
  if (!as_allocated) return exact;
  const int64_t codes = G * N * K, w_scales = 4 * G * fp8_block_scale_count(N, K),
                wt_scales = 4 * G * fp8_block_scale_count(K, N);
  FP4MOE_CHECK(2 * codes + w_scales + wt_scales == exact,
               "memory estimate: the FP8 weight copies of [{}, {}, {}] disagree with GroupLinear's count", G, N, K);
  return 2 * round_up_256(codes) + round_up_256(w_scales) + round_up_256(wt_scales);
}

std::vector<MemoryTerm> layer_scratch_terms(const TrainerConfig& cfg, const ParallelLayout& lay, int64_t l) {
  const Dims g = dims_of(cfg, lay);
  const int64_t N = g.N, Ns = g.Ns, d = g.d;
  std::vector<MemoryTerm> out;
  const MemCategory ws = MemCategory::workspace;

  const Terms layer{out, ws, "layer"};
  layer.add("attn_norm dweight partials", norm_partials(Ns, d));
  layer.add("ffn_norm dweight partials", norm_partials(Ns, d));

  const Terms mla{out, ws, "mla"};
  if (g.rq > 0) mla.add("q_norm dweight partials", norm_partials(N, g.rq));
  mla.add("kv_norm dweight partials", norm_partials(N, g.rkv));
  mla.add("kvd (kv_down output / grad)", 2 * N * (g.rkv + g.rope));
  mla.add("k_pe", 2 * N * g.rope);
  mla.add("d o", 2 * N * g.Hl * g.dv);
  mla.add("d q", 2 * N * g.Hl * g.dqk);
  mla.add("d k", 2 * N * g.Hl * g.dqk);
  mla.add("d kv", 2 * N * g.Hl * (g.nope + g.dv));
  mla.add("d latent", 2 * N * std::max(g.rq, g.rkv));
  mla.add("dx (FP32)", 4 * N * d);
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(g.dqk)));
  const AttentionShape shape{lay.micro_batch, lay.seq_len, g.Hl, g.dqk, g.dv, scale};
  mla.add("attention backward workspace", flash_attention_backward_workspace_bytes(shape));

  if (!cfg.is_moe_layer(l)) {
    const Terms mlp{out, ws, "mlp"};
    mlp.add("d a", 2 * N * g.Fl);
    mlp.add("d h", 4 * N * g.Fl);
    return out;
  }
  const Terms moe{out, ws, "moe"};
  moe.add("scratch (shared output / routed dx)", 2 * Ns * d);
  moe.add("dx (FP32)", 4 * Ns * d);
  moe.add("dweights", 4 * Ns * g.k);
  const Terms router{out, ws, "moe.router"};
  router.add("logits / dlogits (FP32)", 4 * Ns * g.E);
  router.add("dlogits (BF16)", 2 * Ns * g.E);
  const Terms experts{out, ws, "moe.experts"};
  experts.add("assignment_of", 4 * g.R);
  experts.add("row grads", 2 * g.R * d);
  experts.add("d a", 2 * g.R * g.f);
  experts.add("d h", 4 * g.R * g.f);
  if (g.Sl > 0) {
    const Terms shared{out, ws, "moe.shared"};
    shared.add("d a", 2 * N * g.Sl);
    shared.add("d h", 4 * N * g.Sl);
  }
  return out;
}

std::vector<MemoryTerm> model_terms(const TrainerConfig& cfg, const ParallelLayout& lay, int64_t stage) {
  const Dims g = dims_of(cfg, lay);
  const int64_t N = g.N, Ns = g.Ns, d = g.d;
  const bool first = stage == 0, last = stage == lay.pp - 1;
  std::vector<MemoryTerm> out;
  if (last) {
    const Terms act{out, MemCategory::activations, "model"};
    act.add("h[L] (final norm input)", 2 * Ns * d);
    act.add("h_out (LM head input)", 2 * Ns * d);
    act.add("final norm rstd", 4 * Ns);
    act.add("LM head cross-entropy statistics", 16 * N, true, false);
  }
  const Terms ws{out, MemCategory::workspace, "model"};
  ws.add("sub-layer output / branch grad", 2 * Ns * d);
  ws.add("residual-stream grad", 2 * Ns * d);
  if (first) ws.add("embedding backward keys and positions", 4 * round_up(4 * N, 256));
  if (last) {
    const int64_t chunk = std::min<int64_t>(8192, round_up(g.Vl, 8));
    ws.add("LM head Dgrad (FP32)", 4 * N * d);
    ws.add("loss", 4);
    ws.add("final norm dweight partials", norm_partials(Ns, d));
    ws.add("LM head chunk logits (FP32) and dlogits (BF16)", 6 * N * chunk, true, false);
  }
  const Terms trainer{out, MemCategory::workspace, "trainer"};
  trainer.add("batch tokens", 4 * N);
  trainer.add("batch targets", 4 * N);
  trainer.add("gradient norm partial sums", 8 * kGradNormSlots);
  trainer.add("gradient norm and clip scale", 8);
  return out;
}

std::vector<MemoryTerm> comm_terms(const TrainerConfig& cfg, const ParallelLayout& lay, bool stage_has_moe) {
  const Dims g = dims_of(cfg, lay);
  std::vector<MemoryTerm> out;
  const Terms comm{out, MemCategory::comm, "comm"};
  if (lay.ep > 1 && stage_has_moe) {
    const int64_t sent = g.Ns * g.k, received = g.R, d = g.d;
    const int64_t fwd = dispatch_row_bytes(g.routed, d), combine = 2 * d;
    const int64_t bwd = dispatch_row_bytes(g.routed == Recipe::bf16 ? Recipe::bf16 : Recipe::fp8, d);
    if ((sent + received) * (fwd + combine) >= (sent + received) * 2 * bwd) {
      comm.add("dispatch send", sent * fwd, true, false);
      comm.add("dispatch receive", received * fwd, true, false);
      comm.add("combine send (BF16)", received * combine, true, false);
      comm.add("combine receive (BF16)", sent * combine, true, false);
    } else {
      comm.add("backward dy send", sent * bwd, true, false);
      comm.add("backward dy receive", received * bwd, true, false);
      comm.add("backward dx send", received * bwd, true, false);
      comm.add("backward dx receive", sent * bwd, true, false);
    }
  }
  if (lay.pp > 1) {
    comm.add("pipeline send (hidden state)", 2 * g.Ns * g.d, true, false);
    comm.add("pipeline receive (hidden state)", 2 * g.Ns * g.d, true, false);
  }
  return out;
}

}  // namespace fp4moe::mem_detail

namespace fp4moe {

using mem_detail::Dims;
using mem_detail::dims_of;
using mem_detail::Policy;
using mem_detail::policy_of;
using mem_detail::quantized_input_copy;
using mem_detail::QuantizedCopy;
using mem_detail::Terms;

std::vector<MemoryTerm> layer_activation_terms(const TrainerConfig& cfg, const ParallelLayout& lay, int64_t l) {
  validate_config(cfg);
  validate_layout(cfg, lay);
  FP4MOE_CHECK(l >= 0 && l < cfg.model.layers, "layer_activation_terms: layer {} is outside [0, model.layers = {})", l,
               cfg.model.layers);
  const Dims g = dims_of(cfg, lay);
  const Policy p = policy_of(cfg.recompute);
  const bool moe = cfg.is_moe_layer(l), full = p.full, up = p.mla_up_proj, norms = !full && !p.layernorm;
  const int64_t N = g.N, Ns = g.Ns, d = g.d;
  std::vector<MemoryTerm> out;
  const MemCategory act = MemCategory::activations;

  // Whether a branch's backward reads its BF16 input (a_in, f_in, n_q, n_kv): a bf16 projection's Wgrad, or a
  // rerun from it; fp8/mxfp4 projections read their own copy (trainer/model/linear.h); the MoE block always does.
  const bool attn_bf16 = g.attn == Recipe::bf16;
  const bool a_in_read = attn_bf16 || (up && g.rq == 0);
  const bool f_in_read = moe || g.dense == Recipe::bf16 || p.mlp;
  const Terms layer{out, act, "layer"};
  layer.add("h (layer input)", 2 * Ns * d);
  layer.add("h_mid", 2 * Ns * d, !full);
  layer.add("attn_norm out", 2 * Ns * d, norms && a_in_read);
  layer.add("attn_norm rstd", 4 * Ns, norms);
  layer.add("ffn_norm out", 2 * Ns * d, norms && f_in_read);
  layer.add("ffn_norm rstd", 4 * Ns, norms);

  const Terms mla{out, act, "mla"};
  // A Linear's own copy of its input (fp8, mxfp4: trainer/model/linear.h), codes and scales as two buffers made by
  // its first forward.
  auto copy = [](const Terms& t, const std::string& x, Recipe r, int64_t M, int64_t K, bool kept) {
    const QuantizedCopy q = quantized_input_copy(r, M, K, 1);
    t.add(x + " copy codes", q.codes, kept, true, true);
    t.add(x + " copy scales", q.scales, kept, true, true);
  };
  if (g.rq > 0) {
    mla.add("c_q", 2 * N * g.rq, !full);
    mla.add("q_norm rstd", 4 * N, norms);
    mla.add("n_q", 2 * N * g.rq, norms && (attn_bf16 || up));
  }
  mla.add("q", 2 * N * g.Hl * g.dqk, !full && !up);
  mla.add("c_kv", 2 * N * g.rkv, !full);
  mla.add("kv_norm rstd", 4 * N, norms);
  mla.add("n_kv", 2 * N * g.rkv, norms && (attn_bf16 || up));
  mla.add("kv", 2 * N * g.Hl * (g.nope + g.dv), !full && !up);
  mla.add("k", 2 * N * g.Hl * g.dqk, !full && !up);
  if (up) mla.add("k_pe", 2 * N * g.rope, !full);
  mla.add("o", 2 * N * g.Hl * g.dv, !full && !p.core_attn);
  mla.add("lse", 4 * N * g.Hl, !full && !p.core_attn);
  if (!attn_bf16) {
    const Recipe r = g.attn;
    copy(mla, g.rq > 0 ? "q_down X" : "q_proj X", r, Ns, d, !full);
    copy(mla, "kv_down X", r, Ns, d, !full);
    if (g.rq > 0) copy(mla, "q_up X", r, N, g.rq, !full && !up);
    copy(mla, "kv_up X", r, N, g.rkv, !full && !up);
    copy(mla, "out X", r, N, g.Hl * g.dv, !full);
  }

  if (!moe) {
    const Terms mlp{out, act, "mlp"};
    const bool keep = !full && !p.mlp, bf = g.dense == Recipe::bf16;
    if (!bf) copy(mlp, "fc1 X", g.dense, Ns, d, keep);
    mlp.add("h", 4 * N * g.Fl, keep);
    mlp.add("a", 2 * N * g.Fl, keep && bf);
    if (!bf) copy(mlp, "fc2 X", g.dense, N, g.Fl, true);  // fc2 is not rerun (mlp, full: fc1 and swiglu only)
    return out;
  }

  // The routing is kept under every policy (moe and full rerun the experts from it, not the router).
  const Terms router{out, act, "moe.router"};
  const bool block = !full && !p.moe;  // the experts keep their own tensors (moe, full: only their dispatched input)
  router.add("probs", 4 * Ns * g.E);
  router.add("topk_idx", 4 * Ns * g.k);
  router.add("topk_weight", 4 * Ns * g.k);
  router.add("counts", 4 * g.E);
  router.add("offsets", 4 * (g.E + 1));
  router.add("aux", 4);

  const Terms experts{out, act, "moe.experts"};
  const int64_t R = g.R, f = g.f;
  const bool swiglu_out = block && !p.moe_act;
  // fc1's and fc2's Group Linear keep the fp8 recipe's FP8 column copies of their inputs (codes, scales).
  auto columns = [&](const std::string& x, int64_t K, bool kept) {
    const QuantizedCopy q = quantized_input_copy(Recipe::fp8, R, K, g.El);
    experts.add(x + " FP8 column codes", q.codes, kept, true, true);
    experts.add(x + " FP8 column scales", q.scales, kept, true, true);
  };
  // The permutation and the dispatched input xs in the recipe's storage format stay under every policy: moe and
  // full rerun fc1 from them (fp8: from the FP8 row copy the layer then keeps; fc1's FP8 column copy, which its
  // Wgrad reads, is not rebuilt since fc1's forward does not rerun).
  experts.add("row_of", 4 * R);
  experts.add("xs", 2 * R * d, g.routed == Recipe::bf16);  // fp8, mxfp4: BF16 xs is forward scratch
  if (g.routed == Recipe::fp8) {
    columns("xs", d, true);
    if (!block) {
      experts.add("xs FP8 row codes", R * d);
      experts.add("xs FP8 row scales", 4 * fp8_row_scale_count(R, d));
    }
  }
  if (g.routed == Recipe::mxfp4) {
    experts.add("xs MXFP4 codes", R * (d / 2));
    experts.add("xs MXFP4 scales", R * (d / kMxBlock));
  }
  experts.add("h", 4 * R * f, block);
  experts.add("a", 2 * R * f, swiglu_out && g.routed == Recipe::bf16);
  if (g.routed == Recipe::fp8) columns("a", f, block);  // remade by fc2's rerun under moe/full; not by moe_act
  if (g.routed == Recipe::mxfp4) {
    experts.add("a MXFP4 codes", R * (f / 2), swiglu_out);
    experts.add("a MXFP4 scales", R * (f / kMxBlock), swiglu_out);
  }
  experts.add("ys", 2 * R * d, block);

  if (g.Sl > 0) {
    const Terms shared{out, act, "moe.shared"};
    const bool keep = block && !p.shared_experts, bf = g.shared == Recipe::bf16;
    if (!bf) copy(shared, "fc1 X", g.shared, Ns, d, keep);
    shared.add("h", 4 * N * g.Sl, keep);
    shared.add("a", 2 * N * g.Sl, keep && bf);
    if (!bf) copy(shared, "fc2 X", g.shared, N, g.Sl, true);  // fc2 is not rerun (shared_experts, moe, full)
  }
  return out;
}

}  // namespace fp4moe
