// The decoder (model.h): embedding, L x (RMSNorm -> MLA -> residual, RMSNorm -> dense SwiGLU or MoE -> residual),
// final RMSNorm, LM head with the vocabulary-chunked cross-entropy.
//
// Residual stream: BF16, as in llm.c. Each sub-layer output is added to the stream with one FP32 addition and one
// BF16 rounding (add_bf16); the residual gradient is BF16 too, summed the same way in backward. Sums of several
// Dgrads inside a layer (MLA's two down-projections, the MoE's routed, shared and router paths) run in FP32 and are
// cast once.
//
// Parameters and their init (ParamStore::init draws N(0, std^2) per tensor from the seed and the tensor's name):
//   "embed"                            [V, d]              N(0, 0.02^2)   (untied from the LM head)
//   "layers.<l>.attn_norm"             [d]                 ones, no decay
//   "layers.<l>.attn.*"                MLA (trainer/model/mla.h): q_down, q_up (or q_proj), kv_down, kv_up
//                                      N(0, 0.02^2); out N(0, (0.02 / sqrt(2 L))^2); q_norm, kv_norm ones
//   "layers.<l>.ffn_norm"              [d]                 ones, no decay
//   "layers.<l>.mlp.fc1" / ".fc2"      l < n_dense_layers: dense SwiGLU of width dense_ffn (swiglu_mlp.h);
//                                      fc1 N(0, 0.02^2), fc2 N(0, (0.02 / sqrt(2 L))^2)
//   "layers.<l>.moe.*"                 l >= n_dense_layers: router N(0, 0.02^2), experts and shared experts fc1
//                                      N(0, 0.02^2), fc2 N(0, (0.02 / sqrt(2 L))^2) (trainer/model/moe.h)
//   "norm"                             [d]                 ones, no decay
//   "lm_head"                          [V, d]              N(0, 0.02^2)
// The projections that write into the residual stream (attention out, dense FFN fc2, expert and shared fc2) take
// 0.02 / sqrt(2 L) (GPT-2's scaled init); every other matrix 0.02; norm weights 1.
//
// Memory: activations kept for backward (MemCategory::activations), max_tokens = micro_batch x seq_len rows, one copy
// per activation slot (PipelinePosition::in_flight, model.h):
//   h[l]      [max_tokens, d] x (L + 1)  residual stream entering layer l; h[L] enters the final norm
//   h_out     [max_tokens, d]            final norm output (LM head input), and the final norm's rstd
//   tokens, targets [max_tokens] int32   the micro-batch's own copy (the embedding backward's and the loss's input)
// plus each decoder layer's own under the recompute policy (decoder_layer.h, mla.h, moe.h, swiglu_mlp.h,
// rms_norm.h; per layer: layer_memory()). Workspace: tmp and d_res [max_tokens, d] BF16 (the branch output / grad
// and the residual-stream grad, shared by all layers), the loss, and the shared scratch arena
// (trainer/memory/scratch.h) sized to the largest of: any layer's forward or backward, the LM head backward's FP32
// Dgrad [max_tokens, d], the final norm's backward, the embedding backward's workspace. Outside DeviceMemory's
// accounting: the cuBLASLt workspaces of the model's CublasLtMatmul (which every layer's GEMMs use, the fp8/mxfp4
// Group Linears' included) and of LmHeadCrossEntropy, the latter's chunk scratch (logits FP32 + dlogits BF16
// [max_tokens, chunk]), cudaMalloc'd by those classes. The routed experts' Group Linears take their own buffers from
// DeviceMemory (moe_experts.cpp's counted allocator), so those are counted.
#include "trainer/model/model.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

#include "kernels/common/check.h"
#include "kernels/gemm/cublaslt_matmul.h"
#include "kernels/nn/cross_entropy.h"
#include "kernels/nn/elementwise.h"
#include "kernels/nn/embedding.h"
#include "trainer/memory/estimate.h"
#include "trainer/memory/scratch.h"
#include "trainer/model/decoder_layer.h"
#include "trainer/model/moe.h"
#include "trainer/model/rms_norm.h"

namespace fp4moe {

namespace {

constexpr float kInitStd = 0.02f;
// Vocabulary chunk of the LM head's cross-entropy: 8192 entries keep its scratch at 48 KiB per token.
constexpr int64_t kLmHeadChunk = 8192;

}  // namespace

struct Model::Impl {
  Impl(const TrainerConfig& cfg, ParamStore& store, DeviceMemory& mem)
      : V(cfg.model.vocab_size),
        d(cfg.model.hidden),
        T(cfg.train.seq_len),
        max_tokens(cfg.train.micro_batch * cfg.train.seq_len),
        embed(&store.add("embed", {V, d}, ParamInit::normal, kInitStd, /*decay=*/true)),
        ce(d, V, Model::lm_head_chunk(V)) {
    FP4MOE_CHECK(max_tokens < (int64_t{1} << 24),
                 "Model: micro_batch x seq_len = {} tokens must stay below 2^24 (the cross-entropy counts in FP32)",
                 max_tokens);
    model_cfg = cfg;
    const int64_t L = cfg.model.layers;
    for (int64_t l = 0; l < L; ++l) layers.push_back(std::make_unique<DecoderLayer>(store, cfg, l, max_tokens, mem));
    norm.emplace(store, "norm", d, static_cast<float>(cfg.model.norm_eps), max_tokens, mem);
    lm_head = &store.add("lm_head", {V, d}, ParamInit::normal, kInitStd, /*decay=*/true);

    for (int64_t l = 0; l < L; ++l)
      h.push_back(layers[l]->plans().front().allocate_kept<bf16>(mem, "h (layer input)",
                                                                  "residual stream h[" + std::to_string(l) + "]"));
    const BufferPlan own = Model::buffers(cfg, max_tokens, true, true, 0);  // its buffers (no scratch)
    h.push_back(own.allocate_kept<bf16>(mem, "h[L] (final norm input)", "residual stream"));
    h_out = own.allocate_kept<bf16>(mem, "h_out (LM head input)", "model");
    kept_tokens = own.allocate_kept<int32_t>(mem, "tokens (embedding backward input)", "model");
    kept_targets = own.allocate_kept<int32_t>(mem, "targets (loss input)", "model");
    slots.assign(static_cast<size_t>(mem.slots().count()), Slot{});
    tmp = own.allocate<bf16>(mem, "sub-layer output / branch grad", "model");
    d_res = own.allocate<bf16>(mem, "residual-stream grad", "model");
    loss = own.allocate<float>(mem, "loss", "model");
    // The shared scratch: the largest single call (a layer's forward or backward, the LM head's FP32 Dgrad, the
    // final norm's backward, the embedding backward's workspace), once.
    size_t scratch_bytes = std::max({scratch_of(cfg, max_tokens, "LM head Dgrad (FP32)"), norm->backward_bytes(),
                                     scratch_of(cfg, max_tokens, "embedding backward workspace")});
    for (const auto& layer : layers) scratch_bytes = std::max(scratch_bytes, layer->scratch_bytes());
    arena.emplace(mem, scratch_bytes, "model scratch arena (shared by the layers)");
  }

  // Model::buffers on this GPU for M tokens: both stages, cub's sort storage queried from the device.
  BufferPlan buffers_at(const TrainerConfig& cfg, int64_t M) const {
    const int64_t sort = M > 0 ? embedding_backward_workspace_bytes(M, V) - embedding_backward_array_bytes(M) : 0;
    return Model::buffers(cfg, M, true, true, sort);
  }
  // The planned scratch of one backward over M tokens (Model::buffers), rounded as the arena takes it.
  size_t scratch_of(const TrainerConfig& cfg, int64_t M, const char* tensor) const {
    return ScratchArena::rounded(static_cast<size_t>(buffers_at(cfg, M).at(tensor).bytes()));
  }
  // Model::buffers for M tokens (kept from the last call with the same M).
  const BufferPlan& plan_for(int64_t M) {
    if (M != plan_M) {
      plan = buffers_at(model_cfg, M);
      plan_M = M;
    }
    return plan;
  }

  std::vector<MoeLayer*> moe_layers() const {
    std::vector<MoeLayer*> out;
    for (const auto& layer : layers)
      if (MoeLayer* moe = layer->moe()) out.push_back(moe);
    return out;
  }

  // Copies tokens and targets [M] to the host and checks them; returns the number of valid targets.
  int64_t check_batch(const int32_t* tokens, const int32_t* targets, int64_t M, cudaStream_t stream) {
    host_tokens.resize(M);
    host_targets.resize(M);
    CUDA_CHECK(cudaMemcpyAsync(host_tokens.data(), tokens, M * sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaMemcpyAsync(host_targets.data(), targets, M * sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    int64_t valid = 0;
    for (int64_t m = 0; m < M; ++m) {
      FP4MOE_CHECK(host_tokens[m] >= 0 && host_tokens[m] < V,
                   "Model: token id {} at position {} (row {}, t={}) is outside [0, vocab_size = {})", host_tokens[m],
                   m, m / T, m % T, V);
      const int32_t t = host_targets[m];
      FP4MOE_CHECK(t == kIgnoreIndex || (t >= 0 && t < V),
                   "Model: target {} at position {} (row {}, t={}) is neither in [0, vocab_size = {}) nor {} (ignored)",
                   t, m, m / T, m % T, V, kIgnoreIndex);
      valid += t != kIgnoreIndex;
    }
    return valid;
  }

  // Every layer call starts from an empty scratch (each layer's scopes give back all they take).
  void expect_empty_scratch(const char* where, size_t l) const {
    FP4MOE_CHECK(arena->used() == 0, "Model {}: the shared scratch holds {} bytes before layer {} (a scope was left "
                 "open)\n{}", where, arena->used(), l, arena->describe());
  }

  // h[0] = embed(tokens); per layer the two residual blocks; h_out = norm(h[L]) (the active slot's buffers).
  void forward(ModelContext& ctx, const int32_t* tokens, int64_t M) {
    embedding_forward(tokens, M, embed->param, V, d, h[0].data(), nullptr, ctx.stream);  // h[0] [M, d]
    for (size_t l = 0; l < layers.size(); ++l) {
      expect_empty_scratch("forward", l);
      layers[l]->forward(ctx, h[l].data(), M, tmp.data(), h[l + 1].data());  // h[l+1] [M, d]
    }
    norm->forward(ctx, h[layers.size()].data(), M, h_out.data());          // h_out [M, d]
  }
  // loss = CE(h_out W_lm^T, targets) into `loss`.
  void head_loss(ModelContext& ctx, const int32_t* targets, int64_t M) {
    ce.forward(h_out.data(), lm_head->param, targets, M, nullptr, loss.data(), ctx.stream);
  }

  // The same graph in reverse, after head_loss; d_res [M, d] BF16 carries the residual-stream gradient.
  void backward(ModelContext& ctx, const int32_t* tokens, const int32_t* targets, int64_t M, float grad_scale) {
    const int64_t n = M * d;
    {
      ScratchScope scope(*arena);
      float* dh32 = take_planned<float>(*arena, plan_for(M).at("LM head Dgrad (FP32)"), "LM head Dgrad (FP32)");
      ce.backward(h_out.data(), lm_head->param, targets, M, grad_scale, dh32, lm_head->grad, ctx.stream);
      cast_f32_to_bf16(dh32, n, tmp.data(), ctx.stream);                    // d h_out [M, d]
    }
    norm->backward(ctx, tmp.data(), h[layers.size()].data(), M, d_res.data());  // d h[L]
    for (size_t i = layers.size(); i-- > 0;) {
      expect_empty_scratch("backward", i);
      layers[i]->backward(ctx, h[i].data(), M, d_res.data(), tmp.data(), grad_scale);  // d_res = d h[i]
    }
    ScratchScope scope(*arena);
    const PlannedBuffer& planned_ws = plan_for(M).at("embedding backward workspace");
    const size_t ws_bytes = ScratchArena::rounded(static_cast<size_t>(planned_ws.bytes()));
    void* ws = take_planned<unsigned char>(*arena, planned_ws, "embedding backward workspace");
    embedding_backward(tokens, M, d_res.data(), V, d, embed->grad, ws, static_cast<int64_t>(ws_bytes), ctx.stream);
  }

  CublasLtMatmul lt;
  TrainerConfig model_cfg;
  BufferPlan plan{"model"};
  int64_t plan_M = -1;
  int64_t V, d, T, max_tokens;
  Param* embed;                                     // [V, d]
  std::vector<std::unique_ptr<DecoderLayer>> layers;  // L
  std::optional<RmsNorm> norm;                      // final norm [d]
  Param* lm_head = nullptr;                         // [V, d]
  LmHeadCrossEntropy ce;

  // Kept per activation slot (see the top of this file):
  std::vector<KeptArray<bf16>> h;                   // L + 1 x [max_tokens, d]
  KeptArray<bf16> h_out;                            // [max_tokens, d] final norm output
  KeptArray<int32_t> kept_tokens, kept_targets;     // [max_tokens] the micro-batch's tokens and targets
  // Host state of each slot: a micro-batch whose forward ran and whose backward has not.
  struct Slot {
    bool in_flight = false;
    int64_t M = 0;    // its tokens
    StepStats stats;  // its forward's (tokens, aux_loss)
  };
  std::vector<Slot> slots;
  DeviceArray<bf16> tmp;                            // [max_tokens, d] sub-layer output (forward) / branch grad
  DeviceArray<bf16> d_res;                          // [max_tokens, d] residual-stream grad
  DeviceArray<float> loss;                          // [1] mean cross-entropy
  std::optional<ScratchArena> arena;                // the shared scratch (ModelContext::scratch)
  std::vector<int32_t> host_tokens, host_targets;   // [M] host copies for the range checks
};

namespace {

const TrainerConfig& validated(const TrainerConfig& cfg) {
  validate_config(cfg);
  return cfg;
}

}  // namespace

Model::Model(const TrainerConfig& cfg, DeviceMemory& mem, cudaStream_t stream) : cfg_(validated(cfg)) {
  // The one place where the model takes its pipeline position from the layout (the stage it runs).
  const ParallelLayout layout = layout_of(cfg_);
  const int64_t stage = cfg_.parallel.stage < 0 ? 0 : cfg_.parallel.stage;
  position_ = PipelinePosition{layout.pp, stage, layout.in_flight(stage)};
  mem.slots().set_count(position_.in_flight);  // before the layers allocate their held activations
  impl_ = std::make_unique<Impl>(cfg_, store_, mem);
  ctx_ = ModelContext{stream, &impl_->lt, &mem, &*impl_->arena};
  store_.allocate(mem);
}

Model::~Model() = default;

void Model::init_weights(uint64_t seed) { store_.init(seed, ctx_.stream); }

namespace {

int64_t checked_tokens(const TrainerConfig& cfg, const int32_t* tokens, const int32_t* targets, int64_t B,
                       const char* what) {
  FP4MOE_CHECK(B >= 1 && B <= cfg.train.micro_batch, "Model {}: B must be in [1, {}] (train.micro_batch), got B={}",
               what, cfg.train.micro_batch, B);
  FP4MOE_CHECK(tokens && targets, "Model {}: tokens and targets (device int32 [B * T]) must not be null", what);
  return B * cfg.train.seq_len;
}

}  // namespace

StepStats Model::forward(const int32_t* tokens, const int32_t* targets, int64_t B) {
  const int64_t M = checked_tokens(cfg_, tokens, targets, B, "forward");
  for (size_t s = 0; s < impl_->slots.size(); ++s)
    FP4MOE_CHECK(!impl_->slots[s].in_flight, "Model forward: slot {} holds a micro-batch whose backward has not run "
                 "(evaluate between optimizer steps)", s);
  ctx_.mem->slots().set_active(0);
  StepStats stats;
  stats.tokens = impl_->check_batch(tokens, targets, M, ctx_.stream);
  impl_->forward(ctx_, tokens, M);
  impl_->head_loss(ctx_, targets, M);
  for (const MoeLayer* moe : impl_->moe_layers()) stats.aux_loss += moe->aux_loss_host();
  CUDA_CHECK(cudaMemcpyAsync(&stats.loss, impl_->loss.data(), sizeof(float), cudaMemcpyDeviceToHost, ctx_.stream));
  CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
  return stats;
}

StepStats Model::forward_backward(const int32_t* tokens, const int32_t* targets, int64_t B, float grad_scale) {
  FP4MOE_CHECK(std::isfinite(grad_scale), "Model forward_backward: grad_scale must be finite, got {}", grad_scale);
  forward_in_slot(0, tokens, targets, B);
  return backward_in_slot(0, grad_scale);
}

StepStats Model::forward_in_slot(int64_t slot, const int32_t* tokens, const int32_t* targets, int64_t B) {
  const int64_t M = checked_tokens(cfg_, tokens, targets, B, "forward_in_slot");
  std::vector<Impl::Slot>& slots = impl_->slots;
  FP4MOE_CHECK(slot >= 0 && slot < static_cast<int64_t>(slots.size()),
               "Model forward_in_slot: slot {} is outside [0, {}) (the stage's in-flight micro-batches)", slot,
               slots.size());
  FP4MOE_CHECK(!slots[slot].in_flight, "Model forward_in_slot: slot {} still holds a micro-batch (run its backward "
               "first)", slot);
  for (size_t s = 0; s < slots.size(); ++s)
    FP4MOE_CHECK(!slots[s].in_flight || slots[s].M == M, "Model forward_in_slot: B={} differs from the B={} of the "
                 "micro-batch in flight in slot {} (in-flight micro-batches share one size)", B,
                 slots[s].M / cfg_.train.seq_len, s);
  ctx_.mem->slots().set_active(slot);
  Impl::Slot& st = slots[slot];
  st.stats = StepStats{};
  st.stats.tokens = impl_->check_batch(tokens, targets, M, ctx_.stream);
  const size_t bytes = static_cast<size_t>(M) * sizeof(int32_t);
  CUDA_CHECK(cudaMemcpyAsync(impl_->kept_tokens.data(), tokens, bytes, cudaMemcpyDeviceToDevice, ctx_.stream));
  CUDA_CHECK(cudaMemcpyAsync(impl_->kept_targets.data(), targets, bytes, cudaMemcpyDeviceToDevice, ctx_.stream));
  impl_->forward(ctx_, impl_->kept_tokens.data(), M);
  for (const MoeLayer* moe : impl_->moe_layers()) st.stats.aux_loss += moe->aux_loss_host();
  st.M = M;
  st.in_flight = true;
  return st.stats;
}

StepStats Model::backward_in_slot(int64_t slot, float grad_scale) {
  std::vector<Impl::Slot>& slots = impl_->slots;
  FP4MOE_CHECK(slot >= 0 && slot < static_cast<int64_t>(slots.size()) && slots[slot].in_flight,
               "Model backward_in_slot: slot {} holds no micro-batch (forward_in_slot first; {} slots)", slot,
               slots.size());
  FP4MOE_CHECK(std::isfinite(grad_scale), "Model backward_in_slot: grad_scale must be finite, got {}", grad_scale);
  ctx_.mem->slots().set_active(slot);
  Impl::Slot& st = slots[slot];
  st.in_flight = false;  // whatever happens below, the slot's activations are spent
  const int32_t* targets = impl_->kept_targets.data();
  impl_->head_loss(ctx_, targets, st.M);
  impl_->backward(ctx_, impl_->kept_tokens.data(), targets, st.M, grad_scale);
  StepStats stats = st.stats;
  CUDA_CHECK(cudaMemcpyAsync(&stats.loss, impl_->loss.data(), sizeof(float), cudaMemcpyDeviceToHost, ctx_.stream));
  CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
  return stats;
}

void Model::end_step() {
  for (MoeLayer* moe : impl_->moe_layers()) moe->end_step(ctx_);
}

std::vector<const int32_t*> Model::last_topk_indices() const {
  std::vector<const int32_t*> out;
  for (const MoeLayer* moe : impl_->moe_layers()) out.push_back(moe->topk_idx());
  return out;
}

std::vector<LayerMemory> Model::layer_memory() const {
  std::vector<LayerMemory> out;
  for (size_t l = 0; l < impl_->layers.size(); ++l) out.push_back(impl_->layers[l]->memory(counted_bytes(impl_->h[l])));
  return out;
}

size_t Model::head_activation_bytes() const {
  return static_cast<size_t>(buffers(cfg_, impl_->max_tokens, true, true, 0).counted_bytes(MemCategory::activations));
}

int64_t Model::lm_head_chunk(int64_t vocab) { return std::min(kLmHeadChunk, round_up(vocab, 8)); }

BufferPlan Model::buffers(const TrainerConfig& cfg, int64_t seq_share, bool first_stage, bool last_stage,
                          int64_t embedding_sort_bytes) {
  FP4MOE_CHECK(seq_share >= 0, "Model::buffers: seq_share must be >= 0, got {}", seq_share);
  const int64_t n = seq_share * cfg.model.hidden, head = last_stage ? n : 0;
  const MemCategory ws = MemCategory::workspace;
  BufferPlan p("model");
  p.add("h[L] (final norm input)", head, ElemType::bf16);
  p.add("h_out (LM head input)", head, ElemType::bf16);
  if (last_stage) p.append(RmsNorm::buffers(seq_share, cfg.model.hidden, true), "final norm ");
  p.add("tokens (embedding backward input)", first_stage ? seq_share : 0, ElemType::int32);
  p.add("targets (loss input)", last_stage ? seq_share : 0, ElemType::int32);
  p.add("sub-layer output / branch grad", n, ElemType::bf16, true, ws);
  p.add("residual-stream grad", n, ElemType::bf16, true, ws);
  p.add("loss", last_stage ? 1 : 0, ElemType::fp32, true, ws);
  p.add("LM head Dgrad (FP32)", head, ElemType::fp32, true, ws, Lifetime::backward_scratch);
  FP4MOE_CHECK(embedding_sort_bytes >= 0, "Model::buffers: embedding_sort_bytes must be >= 0, got {}",
               embedding_sort_bytes);
  const int64_t embed_ws = first_stage ? embedding_backward_array_bytes(seq_share) + embedding_sort_bytes : 0;
  p.add("embedding backward workspace", embed_ws, ElemType::byte, true, ws, Lifetime::backward_scratch);
  return p;
}

const ScratchArena& Model::scratch() const { return *impl_->arena; }

std::vector<DispatchBytes> Model::dispatch_bytes() const {
  std::vector<DispatchBytes> out;
  for (const MoeLayer* moe : impl_->moe_layers()) out.push_back(moe->experts().dispatch_bytes());
  return out;
}

void Model::force_routing(std::vector<const int32_t*> topk_per_layer) {
  const std::vector<MoeLayer*> moes = impl_->moe_layers();
  FP4MOE_CHECK(topk_per_layer.empty() || topk_per_layer.size() == moes.size(),
               "Model force_routing: expected one top-k array per MoE layer ({}) or none, got {}", moes.size(),
               topk_per_layer.size());
  for (size_t i = 0; i < moes.size(); ++i) moes[i]->force_routing(topk_per_layer.empty() ? nullptr : topk_per_layer[i]);
}

}  // namespace fp4moe
