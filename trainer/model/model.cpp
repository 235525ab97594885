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
// Memory: activations kept for backward (MemCategory::activations), max_tokens = micro_batch x seq_len rows:
//   h[l]      [max_tokens, d] x (L + 1)  residual stream entering layer l; h[L] enters the final norm
//   h_out     [max_tokens, d]            final norm output (LM head input), and the final norm's rstd
// plus each decoder layer's own under the recompute policy (decoder_layer.h, mla.h, moe.h, swiglu_mlp.h,
// rms_norm.h; per layer: layer_memory()). Workspace: tmp and d_res [max_tokens, d] BF16 (the branch output / grad
// and the residual-stream grad, shared by all layers), the loss, and the shared scratch arena
// (trainer/memory/scratch.h) sized to the largest of: any layer's forward or backward, the LM head backward's FP32
// Dgrad [max_tokens, d], the final norm's backward, the embedding backward's workspace. Outside DeviceMemory's
// accounting: the cuBLASLt workspaces of the model's CublasLtMatmul (which every layer's GEMMs use, the fp8/mxfp4
// Group Linears' included) and of LmHeadCrossEntropy, the latter's chunk scratch (logits FP32 + dlogits BF16
// [max_tokens, chunk]), and Group Linear's own FP8 buffers, all cudaMalloc'd by those classes.
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
        ce(d, V, std::min(kLmHeadChunk, round_up(V, 8))) {
    FP4MOE_CHECK(max_tokens < (int64_t{1} << 24),
                 "Model: micro_batch x seq_len = {} tokens must stay below 2^24 (the cross-entropy counts in FP32)",
                 max_tokens);
    const int64_t L = cfg.model.layers;
    for (int64_t l = 0; l < L; ++l) layers.push_back(std::make_unique<DecoderLayer>(store, cfg, l, max_tokens, mem));
    norm.emplace(store, "norm", d, static_cast<float>(cfg.model.norm_eps), max_tokens, mem);
    lm_head = &store.add("lm_head", {V, d}, ParamInit::normal, kInitStd, /*decay=*/true);

    const int64_t n = max_tokens * d;
    auto act = [&](const std::string& what) { return DeviceArray<bf16>(mem, n, MemCategory::activations, what); };
    for (int64_t l = 0; l <= L; ++l) h.push_back(act("residual stream h[" + std::to_string(l) + "]"));
    h_out = act("norm output");
    tmp = DeviceArray<bf16>(mem, n, MemCategory::workspace, "model sub-layer output / grad");
    d_res = DeviceArray<bf16>(mem, n, MemCategory::workspace, "model residual-stream grad");
    loss = DeviceArray<float>(mem, 1, MemCategory::workspace, "model loss");
    // The shared scratch: the largest single call (a layer's forward or backward, the LM head's FP32 Dgrad, the
    // final norm's backward, the embedding backward's workspace), once.
    size_t scratch_bytes = std::max({ScratchArena::rounded(static_cast<size_t>(n) * sizeof(float)),
                                     norm->backward_bytes(), embed_ws_bytes(max_tokens)});
    for (const auto& layer : layers) scratch_bytes = std::max(scratch_bytes, layer->scratch_bytes());
    arena.emplace(mem, scratch_bytes, "model scratch arena (shared by the layers)");
  }

  size_t embed_ws_bytes(int64_t M) const {
    return M > 0 ? ScratchArena::rounded(static_cast<size_t>(embedding_backward_workspace_bytes(M, V))) : 0;
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

  // h[0] = embed(tokens); per layer the two residual blocks; h_out = norm(h[L]); loss = CE(h_out W_lm^T, targets).
  void forward(ModelContext& ctx, const int32_t* tokens, const int32_t* targets, int64_t M) {
    embedding_forward(tokens, M, embed->param, V, d, h[0].data(), nullptr, ctx.stream);  // h[0] [M, d]
    for (size_t l = 0; l < layers.size(); ++l) {
      expect_empty_scratch("forward", l);
      layers[l]->forward(ctx, h[l].data(), M, tmp.data(), h[l + 1].data());  // h[l+1] [M, d]
    }
    norm->forward(ctx, h[layers.size()].data(), M, h_out.data());          // h_out [M, d]
    ce.forward(h_out.data(), lm_head->param, targets, M, nullptr, loss.data(), ctx.stream);
  }

  // The same graph in reverse; d_res [M, d] BF16 carries the residual-stream gradient.
  void backward(ModelContext& ctx, const int32_t* tokens, const int32_t* targets, int64_t M, float grad_scale) {
    const int64_t n = M * d;
    {
      ScratchScope scope(*arena);
      float* dh32 = arena->take<float>(n, "LM head Dgrad (FP32)");
      ce.backward(h_out.data(), lm_head->param, targets, M, grad_scale, dh32, lm_head->grad, ctx.stream);
      cast_f32_to_bf16(dh32, n, tmp.data(), ctx.stream);                    // d h_out [M, d]
    }
    norm->backward(ctx, tmp.data(), h[layers.size()].data(), M, d_res.data());  // d h[L]
    for (size_t i = layers.size(); i-- > 0;) {
      expect_empty_scratch("backward", i);
      layers[i]->backward(ctx, h[i].data(), M, d_res.data(), tmp.data(), grad_scale);  // d_res = d h[i]
    }
    ScratchScope scope(*arena);
    const size_t ws_bytes = embed_ws_bytes(M);
    void* ws = arena->take<unsigned char>(static_cast<int64_t>(ws_bytes), "embedding backward workspace");
    embedding_backward(tokens, M, d_res.data(), V, d, embed->grad, ws, static_cast<int64_t>(ws_bytes), ctx.stream);
  }

  CublasLtMatmul lt;
  int64_t V, d, T, max_tokens;
  Param* embed;                                     // [V, d]
  std::vector<std::unique_ptr<DecoderLayer>> layers;  // L
  std::optional<RmsNorm> norm;                      // final norm [d]
  Param* lm_head = nullptr;                         // [V, d]
  LmHeadCrossEntropy ce;

  std::vector<DeviceArray<bf16>> h;                 // L + 1 x [max_tokens, d], see the top of this file
  DeviceArray<bf16> h_out;                          // [max_tokens, d] final norm output
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
  StepStats stats;
  stats.tokens = impl_->check_batch(tokens, targets, M, ctx_.stream);
  impl_->forward(ctx_, tokens, targets, M);
  for (const MoeLayer* moe : impl_->moe_layers()) stats.aux_loss += moe->aux_loss_host();
  CUDA_CHECK(cudaMemcpyAsync(&stats.loss, impl_->loss.data(), sizeof(float), cudaMemcpyDeviceToHost, ctx_.stream));
  CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
  return stats;
}

StepStats Model::forward_backward(const int32_t* tokens, const int32_t* targets, int64_t B, float grad_scale) {
  const int64_t M = checked_tokens(cfg_, tokens, targets, B, "forward_backward");
  FP4MOE_CHECK(std::isfinite(grad_scale), "Model forward_backward: grad_scale must be finite, got {}", grad_scale);
  StepStats stats;
  stats.tokens = impl_->check_batch(tokens, targets, M, ctx_.stream);
  impl_->forward(ctx_, tokens, targets, M);
  for (const MoeLayer* moe : impl_->moe_layers()) stats.aux_loss += moe->aux_loss_host();
  impl_->backward(ctx_, tokens, targets, M, grad_scale);
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
  return counted_bytes(impl_->h[impl_->layers.size()]) + counted_bytes(impl_->h_out) + impl_->norm->kept_bytes();
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
