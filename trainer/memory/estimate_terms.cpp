// The per-buffer terms of the memory estimator (trainer/memory/estimate.h): every buffer of a decoder layer from the
// layers' own buffer plans (DecoderLayer::buffers at one GPU's shapes), its backward scratch, the model's terms
// outside the layers, and the expert- and pipeline-parallel communication buffers.
#include <algorithm>
#include <cmath>

#include "kernels/attention/flash_attention.h"
#include "kernels/common/check.h"
#include "kernels/nn/adamw.h"
#include "kernels/nn/cross_entropy.h"
#include "kernels/nn/rmsnorm.h"
#include "kernels/quant/layouts.h"
#include "trainer/memory/estimate_detail.h"
#include "trainer/model/decoder_layer.h"
#include "trainer/model/layout_emulation.h"
#include "trainer/model/model.h"

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
  g.R = routed_row_count(balanced, lay.routed_load, t);
  g.attn = cfg.recipe.attention;
  g.dense = cfg.recipe.dense_mlp;
  g.shared = cfg.recipe.shared_experts;
  g.routed = cfg.recipe.routed_experts;
  return g;
}

LayerShape layer_shape(const TrainerConfig& cfg, const ParallelLayout& lay) {
  const Dims g = dims_of(cfg, lay);
  LayerShape s;
  s.tokens = g.N;
  s.seq_share = g.Ns;
  s.seq_len = lay.seq_len;
  s.heads = g.Hl;
  s.dense_ffn = g.Fl;
  s.routed_rows = g.R;
  s.local_experts = g.El;
  s.shared_ffn = g.Sl;
  return s;
}

std::vector<MemoryTerm> layer_buffer_terms(const TrainerConfig& cfg, const ParallelLayout& lay, int64_t l) {
  std::vector<MemoryTerm> out;
  for (const BufferPlan& plan : DecoderLayer::buffers(cfg, l, layer_shape(cfg, lay)))
    for (const PlannedBuffer& b : plan.buffers())
      if (b.bytes() > 0)
        out.push_back(MemoryTerm{b.category, plan.module(), b.tensor, b.bytes(), 1, b.held, true,
                                 b.lifetime == Lifetime::first_forward});
  return out;
}

std::vector<MemoryTerm> model_terms(const TrainerConfig& cfg, const ParallelLayout& lay, int64_t stage) {
  const Dims g = dims_of(cfg, lay);
  const int64_t N = g.N, Ns = g.Ns;
  const bool first = stage == 0, last = stage == lay.pp - 1;
  std::vector<MemoryTerm> out;
  // The passes' scratch (the LM head's Dgrad, the embedding backward's workspace) is the shared arena's
  // (Model::scratch_arena_bytes, counted by the caller).
  const BufferPlan own = Model::buffers(cfg, Ns, first, last, 0);
  for (const PlannedBuffer& b : own.buffers())
    if (b.bytes() > 0 && b.lifetime != Lifetime::forward_scratch && b.lifetime != Lifetime::backward_scratch)
      out.push_back(MemoryTerm{b.category, "model", b.tensor, b.bytes(), 1, b.held, true, false});
  if (last) {
    const Terms act{out, MemCategory::activations, "model"};
    act.add("LM head cross-entropy statistics", LmHeadCrossEntropy::stats_bytes(N), true, false);
  }
  if (last) {
    const Terms ws{out, MemCategory::workspace, "model"};
    const int64_t chunk = Model::lm_head_chunk(g.Vl);
    ws.add("LM head chunk logits (FP32) and dlogits (BF16)",
           LmHeadCrossEntropy::logits_bytes(N, chunk) + LmHeadCrossEntropy::dlogits_bytes(N, chunk), true, false);
  }
  const Terms trainer{out, MemCategory::workspace, "trainer"};
  trainer.add("batch tokens", 4 * N);
  trainer.add("batch targets", 4 * N);
  trainer.add("gradient norm partial sums", 8 * kGradNormSlots);
  trainer.add("gradient norm and clip scale", 8);
  if (cfg.train.cuda_graph) {  // trainer/train/step_graph.h
    trainer.add("step losses", 4 * cfg.train.grad_accum);
  }
  return out;
}

std::vector<MemoryTerm> comm_terms(const TrainerConfig& cfg, const ParallelLayout& lay, bool stage_has_moe) {
  const Dims g = dims_of(cfg, lay);
  std::vector<MemoryTerm> out;
  const BufferPlan plan = Model::comm_buffers(cfg, g.Ns, g.R, lay.ep, lay.pp, stage_has_moe);
  for (const PlannedBuffer& b : plan.buffers())
    if (b.bytes() > 0) out.push_back(MemoryTerm{b.category, "comm", b.tensor, b.bytes(), 1, b.held, true, false});
  return out;
}

}  // namespace fp4moe::mem_detail

namespace fp4moe {

ExpertParallelRowBytes expert_parallel_row_bytes(Recipe routed, int64_t d) {
  FP4MOE_CHECK(d >= 1, "expert_parallel_row_bytes: d must be >= 1, got {}", d);
  const int64_t bf16_row = 2 * d, fp8_row = d + 4 * ceil_div(d, kFp8Block), mxfp4_row = d / 2 + ceil_div(d, kMxBlock);
  // Dispatch: the stored MXFP4 input, else FP8 when the layer's Fprop quantizes its BF16 input, else BF16.
  const int64_t dispatch = routed.mxfp4_input ? mxfp4_row : quantizes_bf16_input(routed) ? fp8_row : bf16_row;
  // Backward dispatch: the output gradient in FP8 unless Dgrad runs in BF16.
  const int64_t backward_dispatch = routed.dgrad == GemmPrecision::bf16 ? bf16_row : fp8_row;
  return ExpertParallelRowBytes{dispatch, bf16_row, backward_dispatch, bf16_row};
}

std::vector<MemoryTerm> layer_activation_terms(const TrainerConfig& cfg, const ParallelLayout& lay, int64_t l) {
  validate_config(cfg);
  validate_layout(cfg, lay);
  FP4MOE_CHECK(l >= 0 && l < cfg.model.layers, "layer_activation_terms: layer {} is outside [0, model.layers = {})", l,
               cfg.model.layers);
  std::vector<MemoryTerm> out;
  for (MemoryTerm& t : mem_detail::layer_buffer_terms(cfg, lay, l))
    if (t.category == MemCategory::activations) out.push_back(std::move(t));
  return out;
}

}  // namespace fp4moe
