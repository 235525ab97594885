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
// Dgrad [max_tokens, d], the final norm's backward, the embedding backward's workspace; with the cuDNN attention
// backend, its workspace (model.h, "Attention core backend"; counted, not estimated). Outside DeviceMemory's
// accounting: the cuBLASLt workspaces of the model's CublasLtMatmul (which every layer's GEMMs use, the fp8/mxfp4
// Group Linears' included) and of LmHeadCrossEntropy, the latter's chunk scratch (logits FP32 + dlogits BF16
// [max_tokens, chunk]), cudaMalloc'd by those classes. The routed experts' Group Linears take their own buffers from
// DeviceMemory (moe_experts.cpp's counted allocator), so those are counted.
#include "trainer/model/model.h"

#include "kernels/quant/mx_random.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>

#include "kernels/attention/attention_core.h"
#include "kernels/common/check.h"
#include "kernels/gemm/cublaslt_matmul.h"
#include "kernels/nn/cross_entropy.h"
#include "kernels/nn/elementwise.h"
#include "kernels/nn/embedding.h"
#include "trainer/memory/estimate.h"
#include "trainer/memory/scratch.h"
#include "trainer/model/decoder_layer.h"
#include "trainer/model/layout_emulation.h"
#include "trainer/model/mla.h"
#include "trainer/model/moe.h"
#include "trainer/model/profile.h"
#include "trainer/model/rms_norm.h"
#include "trainer/comm/transport.h"

namespace fp4moe {

namespace {

constexpr float kInitStd = 0.02f;
// Vocabulary chunk of the LM head's cross-entropy: 8192 entries keep its scratch at 48 KiB per token.
constexpr int64_t kLmHeadChunk = 8192;

}  // namespace

struct Model::Impl {
  static constexpr const char* kPipelineSend = Model::kPipelineSend;
  static constexpr const char* kPipelineReceive = Model::kPipelineReceive;

  Impl(const TrainerConfig& cfg, const PipelineStage& st, ParamStore& store, DeviceMemory& mem, cudaStream_t stream,
       EpTransport* t)
      : stage(st),
        transport(t),
        V(cfg.model.vocab_size),
        d(cfg.model.hidden),
        T(cfg.train.seq_len),
        max_tokens(cfg.train.micro_batch * cfg.train.seq_len),
        embed(stage.first() ? &store.add("embed", {V, d}, ParamInit::normal, kInitStd, /*decay=*/true) : nullptr),
        ce(d, V, Model::lm_head_chunk(V)) {
    FP4MOE_CHECK(max_tokens < (int64_t{1} << 24),
                 "Model: micro_batch x seq_len = {} tokens must stay below 2^24 (the cross-entropy counts in FP32)",
                 max_tokens);
    model_cfg = cfg;
    // The stage's decoder layers [first_layer, first_layer + layers) under their global indices (all on one GPU).
    const int64_t first = stage.first_layer, n = stage.layers;
    for (int64_t l = first; l < first + n; ++l)
      layers.push_back(std::make_unique<DecoderLayer>(store, cfg, l, max_tokens, mem, transport));
    if (stage.last()) {
      norm.emplace(store, "norm", d, static_cast<float>(cfg.model.norm_eps), max_tokens, mem);
      lm_head = &store.add("lm_head", {V, d}, ParamInit::normal, kInitStd, /*decay=*/true);
    }

    for (int64_t i = 0; i < n; ++i)
      h.push_back(layers[i]->plans().front().allocate_kept<bf16>(
          mem, "h (layer input)", "residual stream h[" + std::to_string(first + i) + "]"));
    const BufferPlan own = Model::buffers(cfg, max_tokens, stage.first(), stage.last(), 0);  // its buffers (no scratch)
    h.push_back(own.allocate_kept<bf16>(mem, "h[L] (final norm input)", "residual stream"));
    h_out = own.allocate_kept<bf16>(mem, "h_out (LM head input)", "model");
    kept_tokens = own.allocate_kept<int32_t>(mem, "tokens (embedding backward input)", "model");  // first stage
    kept_targets = own.allocate_kept<int32_t>(mem, "targets (loss input)", "model");               // last stage
    slots.assign(static_cast<size_t>(mem.slots().count()), Slot{});
    tmp = own.allocate<bf16>(mem, "sub-layer output / branch grad", "model");
    d_res = own.allocate<bf16>(mem, "residual-stream grad", "model");
    loss = own.allocate<float>(mem, "loss", "model");
    // The shared scratch: the largest single call (a layer's forward or backward, the LM head's FP32 Dgrad, the
    // final norm's backward, the embedding backward's workspace), once.
    const LayerShape shape = transport ? LayerShape::expert_parallel_rank(cfg, max_tokens, transport->world_size())
                                       : LayerShape::one_gpu(cfg, max_tokens);
    arena.emplace(mem, Model::scratch_arena_bytes(cfg, stage, shape, embedding_sort_bytes(max_tokens)),
                  "model scratch arena (shared by the layers)");
    setup_attention(cfg, mem, stream);
    // The communication buffers of the emulated layout (none on one GPU): allocated and counted, never transferred.
    bool has_moe = false;
    for (const auto& layer : layers) has_moe = has_moe || layer->has_moe();
    comm_plan = Model::comm_buffers(cfg, max_tokens, LayerShape::one_gpu(cfg, max_tokens).routed_rows, cfg.parallel.ep,
                                    stage.pp, has_moe);
    for (const PlannedBuffer& b : comm_plan.buffers())
      if (b.tensor == kPipelineSend || b.tensor == kPipelineReceive)
        (b.tensor == kPipelineSend ? pp_send : pp_receive) = comm_plan.allocate<bf16>(mem, b.tensor, "comm");
      else
        comm.push_back(comm_plan.allocate<unsigned char>(mem, b.tensor, "comm"));
  }

  // model.attention_backend resolved for the MLA shape at max_tokens (kernels/attention/attention_core.h: under
  // auto both backends timed there on temporary buffers, within the budget's room, freed before the parameters are
  // allocated); with cuDNN chosen, the workspace its plans ask there, from DeviceMemory.
  void setup_attention(const TrainerConfig& cfg, DeviceMemory& mem, cudaStream_t stream) {
    const ModelConfig& m = cfg.model;
    const size_t budget = mem.budget(), used = std::min(budget, mem.current_total());
    const int64_t room = budget == 0 ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(budget - used);
    attention.emplace(m.attention_backend, m.attention_deterministic,
                      MlaAttention::core_shape(m, max_tokens, m.heads, T), MlaAttention::core_layout(m, m.heads),
                      room, stream);
    if (attention->workspace_bytes() == 0) return;
    sdpa_workspace = DeviceArray<unsigned char>(mem, attention->workspace_bytes(), MemCategory::workspace,
                                                "cuDNN attention workspace");
    attention->set_workspace(sdpa_workspace.data(), sdpa_workspace.size());
  }

  // ---- pipeline stage boundaries (trainer/model/layout_emulation.h) ------------------------------------------
  // h[0] [M, d]: the embedding of tokens on the first stage; else the previous stage's output, received into the
  // pipeline receive buffer (here its stand-in) and copied to the kept layer input.
  void stage_input(ModelContext& ctx, const int32_t* tokens, int64_t M) {
    if (stage.first()) {
      ProfileScope profile(ctx, ProfileModule::embedding, ProfilePass::forward);
      embedding_forward(tokens, M, embed->param, V, d, h[0].data(), nullptr, ctx.stream);
      return;
    }
    standin_input(tokens, M, d, pp_receive.data(), ctx.stream);
    CUDA_CHECK(cudaMemcpyAsync(h[0].data(), pp_receive.data(), static_cast<size_t>(M * d) * sizeof(bf16),
                               cudaMemcpyDeviceToDevice, ctx.stream));
  }
  // Where layer i's output goes: the next layer's input, the final norm's input h[L] (last stage), or the pipeline
  // send buffer (the next stage's input; dropped here).
  bf16* layer_output(size_t i) { return i + 1 < layers.size() || stage.last() ? h[i + 1].data() : pp_send.data(); }
  // d_res = the gradient of the stage's output when the stage has no LM head: the next stage's, received into the
  // pipeline receive buffer (here its stand-in, scale grad_scale / M) and copied.
  void stage_output_grad(ModelContext& ctx, int64_t M, float grad_scale) {
    const int64_t n = M * d;
    standin_output_grad(static_cast<uint64_t>(model_cfg.train.seed), backward_passes, n,
                        grad_scale / static_cast<float>(M), pp_receive.data(), ctx.stream);
    CUDA_CHECK(cudaMemcpyAsync(d_res.data(), pp_receive.data(), static_cast<size_t>(n) * sizeof(bf16),
                               cudaMemcpyDeviceToDevice, ctx.stream));
  }
  // The gradient of the stage's input, d_res: into the embedding's on the first stage, else sent to the previous
  // stage through the pipeline send buffer (dropped here).
  void stage_input_grad(ModelContext& ctx, const int32_t* tokens, int64_t M) {
    if (!stage.first()) {
      CUDA_CHECK(cudaMemcpyAsync(pp_send.data(), d_res.data(), static_cast<size_t>(M * d) * sizeof(bf16),
                                 cudaMemcpyDeviceToDevice, ctx.stream));
      return;
    }
    ScratchScope scope(*arena);
    const PlannedBuffer& planned_ws = plan_for(M).at("embedding backward workspace");
    const size_t ws_bytes = ScratchArena::rounded(static_cast<size_t>(planned_ws.bytes()));
    void* ws = take_planned<unsigned char>(*arena, planned_ws, "embedding backward workspace");
    ProfileScope profile(ctx, ProfileModule::embedding, ProfilePass::backward);
    embedding_backward(tokens, M, d_res.data(), V, d, embed->grad, ws, static_cast<int64_t>(ws_bytes), ctx.stream);
  }
  // The mean loss of the last forward (host), or NaN on a stage without the loss.
  float loss_host(cudaStream_t stream) const {
    float out = std::numeric_limits<float>::quiet_NaN();
    if (stage.last())
      CUDA_CHECK(cudaMemcpyAsync(&out, loss.data(), sizeof(float), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    return out;
  }

  // cub's sort storage of the embedding backward over M tokens, queried from the device (first stage; else 0).
  int64_t embedding_sort_bytes(int64_t M) const {
    return M > 0 && stage.first() ? embedding_backward_workspace_bytes(M, V) - embedding_backward_array_bytes(M) : 0;
  }
  // Model::buffers on this GPU for M tokens: its stage, cub's sort storage.
  BufferPlan buffers_at(const TrainerConfig& cfg, int64_t M) const {
    return Model::buffers(cfg, M, stage.first(), stage.last(), embedding_sort_bytes(M));
  }
  // Model::buffers for M tokens (kept from the last call with the same M).
  const BufferPlan& plan_for(int64_t M) {
    if (M != plan_M) {
      plan = buffers_at(model_cfg, M);
      plan_M = M;
    }
    return plan;
  }

  // The decoder layers with a MoE block (MoeLayer, or ExpertParallelMoeLayer over a transport), in order.
  std::vector<DecoderLayer*> moe_layers() const {
    std::vector<DecoderLayer*> out;
    for (const auto& layer : layers)
      if (layer->has_moe()) out.push_back(layer.get());
    return out;
  }

  // Copies tokens and targets [M] to the host and checks them; returns the number of valid targets.
  int64_t check_batch(const int32_t* tokens, const int32_t* targets, int64_t M, cudaStream_t stream) {
    host_tokens.resize(M);
    host_targets.resize(M);
    CUDA_CHECK(cudaMemcpyAsync(host_tokens.data(), tokens, M * sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaMemcpyAsync(host_targets.data(), targets, M * sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    return check_batch_ids(host_tokens, host_targets, V, T, "Model");
  }

  // Every layer call starts from an empty scratch (each layer's scopes give back all they take).
  void expect_empty_scratch(const char* where, size_t l) const {
    FP4MOE_CHECK(arena->used() == 0, "Model {}: the shared scratch holds {} bytes before layer {} (a scope was left "
                 "open)\n{}", where, arena->used(), l, arena->describe());
  }

  // h[0] = embed(tokens) (or the previous stage's output); per layer the two residual blocks; h_out = norm(h[L]) on
  // the last stage (the active slot's buffers).
  void forward(ModelContext& ctx, const int32_t* tokens, int64_t M) {
    stage_input(ctx, tokens, M);  // h[0] [M, d]
    for (size_t l = 0; l < layers.size(); ++l) {
      expect_empty_scratch("forward", l);
      layers[l]->forward(ctx, h[l].data(), M, tmp.data(), layer_output(l));  // h[l+1] [M, d]
    }
    if (!stage.last()) return;  // the output went to the pipeline send buffer
    norm->forward(ctx, h[layers.size()].data(), M, h_out.data());          // h_out [M, d]
  }
  // loss = CE(h_out W_lm^T, targets) into `loss`.
  void head_loss(ModelContext& ctx, const int32_t* targets, int64_t M) {
    ProfileScope profile(ctx, ProfileModule::lm_head_loss, ProfilePass::forward);
    ce.forward(h_out.data(), lm_head->param, targets, M, nullptr, loss.data(), ctx.stream);
  }

  // d_res [M, d] = d(loss)/d h[L] (last stage, after head_loss): the LM head's backward, then the final norm's.
  void head_backward(ModelContext& ctx, const int32_t* targets, int64_t M, float grad_scale) {
    {
      ScratchScope scope(*arena);
      ProfileScope profile(ctx, ProfileModule::lm_head_loss, ProfilePass::backward);
      float* dh32 = take_planned<float>(*arena, plan_for(M).at("LM head Dgrad (FP32)"), "LM head Dgrad (FP32)");
      ce.backward(h_out.data(), lm_head->param, targets, M, grad_scale, dh32, lm_head->grad, ctx.stream);
      cast_f32_to_bf16(dh32, M * d, tmp.data(), ctx.stream);               // d h_out [M, d]
    }
    norm->backward(ctx, tmp.data(), h[layers.size()].data(), M, d_res.data());  // d h[L]
  }

  // The same graph in reverse; d_res [M, d] BF16 carries the residual-stream gradient.
  void backward(ModelContext& ctx, const int32_t* tokens, const int32_t* targets, int64_t M, float grad_scale) {
    if (stage.last()) head_backward(ctx, targets, M, grad_scale);
    else stage_output_grad(ctx, M, grad_scale);  // d_res = d (the stage's output)
    ++backward_passes;
    for (size_t i = layers.size(); i-- > 0;) {
      expect_empty_scratch("backward", i);
      layers[i]->backward(ctx, h[i].data(), M, d_res.data(), tmp.data(), grad_scale);  // d_res = d h[i]
    }
    stage_input_grad(ctx, tokens, M);
  }

  PipelineStage stage;                              // this GPU's pipeline stage (one GPU: all of the model)
  EpTransport* transport;                           // the expert- and data-parallel group; null on one GPU
  CublasLtMatmul lt;
  TrainerConfig model_cfg;
  BufferPlan plan{"model"};
  int64_t plan_M = -1;
  int64_t V, d, T, max_tokens;
  Param* embed;                                     // [V, d] (first stage; else null)
  std::vector<std::unique_ptr<DecoderLayer>> layers;  // the stage's layers (L on one GPU)
  std::optional<RmsNorm> norm;                      // final norm [d]
  Param* lm_head = nullptr;                         // [V, d]
  LmHeadCrossEntropy ce;

  // Kept per activation slot (see the top of this file):
  std::vector<KeptArray<bf16>> h;                   // layers + 1 x [max_tokens, d] (the last one empty on a stage
                                                    // without the LM head)
  KeptArray<bf16> h_out;                            // [max_tokens, d] final norm output (last stage)
  KeptArray<int32_t> kept_tokens, kept_targets;     // [max_tokens] the micro-batch's tokens (first stage) and
                                                    // targets (last stage)
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
  std::optional<AttentionCore> attention;           // model.attention_backend, resolved (ModelContext::attention)
  DeviceArray<unsigned char> sdpa_workspace;        // its cuDNN workspace (where cuDNN was chosen)
  BufferPlan comm_plan{"comm"};                     // Model::comm_buffers of this GPU
  DeviceArray<bf16> pp_send, pp_receive;            // [max_tokens, d] pipeline buffers (pp > 1)
  std::vector<DeviceArray<unsigned char>> comm;     // the expert-parallel buffers (ep > 1, a stage with MoE layers)
  int64_t backward_passes = 0;                      // keys the stand-in output gradient
  std::vector<int32_t> host_tokens, host_targets;   // [M] host copies for the range checks
};

namespace {

const TrainerConfig& validated(const TrainerConfig& cfg, const EpTransport* transport) {
  validate_config(cfg);
  check_emulated_layout(cfg);
  if (transport) check_ranks_config(cfg, transport->world_size());
  return cfg;
}

}  // namespace

Model::Model(const TrainerConfig& cfg, DeviceMemory& mem, cudaStream_t stream, EpTransport* transport)
    : cfg_(validated(cfg, transport)) {
  // The one place where the model takes its pipeline position from the layout: the stage it runs (pipeline_stage:
  // parallel.stage, or the largest estimate) and the micro-batches that stage keeps in flight under 1F1B.
  const ParallelLayout layout = layout_of(cfg_);
  const PipelineStage stage = pipeline_stage(cfg_);
  position_ = PipelinePosition{layout.pp, stage.stage, layout.in_flight(stage.stage)};
  mem.slots().set_count(position_.in_flight);  // before the layers allocate their held activations
  impl_ = std::make_unique<Impl>(cfg_, stage, store_, mem, stream, transport);
  ctx_ = ModelContext{stream, &impl_->lt, &mem, &*impl_->arena};
  ctx_.attention = &*impl_->attention;
  store_.set_shard(layout_of(cfg_).zero1_parts());  // ZeRO-1: this GPU's optimizer shard (params.h)
  store_.set_moments(cfg_.train.moments);              // AdamW m and v in FP32 or BF16
  store_.allocate(mem);
}

Model::~Model() = default;

AttentionBackend Model::attention_backend() const { return impl_->attention->backend(); }
const std::string& Model::attention_backend_note() const { return impl_->attention->note(); }

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
  // An evaluation reads its loss on the host anyway: the routers take their host copy whatever the mode.
  struct ModeGuard {
    bool& flag;
    bool saved;
    ~ModeGuard() { flag = saved; }
  } mode{ctx_.host_sync_free, ctx_.host_sync_free};
  ctx_.host_sync_free = false;
  StepStats stats;
  stats.tokens = impl_->check_batch(tokens, targets, M, ctx_.stream);
  impl_->forward(ctx_, tokens, M);
  if (impl_->stage.last()) impl_->head_loss(ctx_, targets, M);
  for (const DecoderLayer* moe : impl_->moe_layers()) stats.aux_loss += moe->moe_aux_loss_host();
  stats.loss = impl_->loss_host(ctx_.stream);
  stats.has_loss = impl_->stage.last();
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
  ProfileScope profile(ctx_, ProfileModule::other, ProfilePass::forward);  // the pass: what its modules leave
  Impl::Slot& st = slots[slot];
  st.stats = StepStats{};
  const bool sync_free = ctx_.host_sync_free;  // set_host_sync_free: nothing read back here
  st.stats.tokens = sync_free ? 0 : impl_->check_batch(tokens, targets, M, ctx_.stream);
  st.stats.has_loss = impl_->stage.last();
  // The slot's own copies of what its backward reads: the tokens (embedding backward, first stage) and the targets
  // (the loss, last stage). A later stage's forward reads the caller's tokens (the stand-in input).
  const size_t bytes = static_cast<size_t>(M) * sizeof(int32_t);
  if (impl_->stage.first())
    CUDA_CHECK(cudaMemcpyAsync(impl_->kept_tokens.data(), tokens, bytes, cudaMemcpyDeviceToDevice, ctx_.stream));
  if (impl_->stage.last())
    CUDA_CHECK(cudaMemcpyAsync(impl_->kept_targets.data(), targets, bytes, cudaMemcpyDeviceToDevice, ctx_.stream));
  impl_->forward(ctx_, impl_->stage.first() ? impl_->kept_tokens.data() : tokens, M);
  if (sync_free)
    st.stats.aux_loss = std::numeric_limits<float>::quiet_NaN();
  else
    for (const DecoderLayer* moe : impl_->moe_layers()) st.stats.aux_loss += moe->moe_aux_loss_host();
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
  ProfileScope profile(ctx_, ProfileModule::other, ProfilePass::backward);  // the pass: what its modules leave
  Impl::Slot& st = slots[slot];
  st.in_flight = false;  // whatever happens below, the slot's activations are spent
  const int32_t* targets = impl_->stage.last() ? impl_->kept_targets.data() : nullptr;
  if (impl_->stage.last()) impl_->head_loss(ctx_, targets, st.M);
  // Over W ranks the objective is the mean of the W ranks' micro-batch losses (model.h): each rank's part of it
  // carries 1 / W.
  const float scale = grad_scale / static_cast<float>(world_size());
  impl_->backward(ctx_, impl_->stage.first() ? impl_->kept_tokens.data() : nullptr, targets, st.M, scale);
  StepStats stats = st.stats;
  stats.loss = ctx_.host_sync_free ? std::numeric_limits<float>::quiet_NaN() : impl_->loss_host(ctx_.stream);
  return stats;
}

void Model::set_host_sync_free(bool on) {
  FP4MOE_CHECK(!on || impl_->transport == nullptr,
               "Model set_host_sync_free: not over a transport (its exchanges size their buffers on the host)");
  for (size_t s = 0; s < impl_->slots.size(); ++s)
    FP4MOE_CHECK(!impl_->slots[s].in_flight, "Model set_host_sync_free: slot {} holds a micro-batch in flight", s);
  ctx_.host_sync_free = on;
}

const float* Model::loss_device() const { return impl_->loss.data(); }

void Model::begin_step(uint64_t step) {
  ctx_.quant_seed = splitmix64_at(cfg_.train.seed, step);
  // Over W ranks each rank draws its own quantizer bits (stochastic rounding, random Hadamard signs): with one seed,
  // the replicated layers' W ranks would round their gradients with the same bits and the summed rounding errors
  // would be correlated, not independent as over one GPU's W micro-batches. One GPU keeps its seed.
  if (impl_->transport)
    ctx_.quant_seed = splitmix64_at(ctx_.quant_seed, static_cast<uint64_t>(impl_->transport->rank()));
}

void Model::end_step() {
  for (DecoderLayer* moe : impl_->moe_layers()) moe->moe_end_step(ctx_);
}

std::vector<const int32_t*> Model::last_topk_indices() const {
  std::vector<const int32_t*> out;
  for (const DecoderLayer* moe : impl_->moe_layers()) out.push_back(moe->moe_topk_idx());
  return out;
}

Model::ExchangeTotals Model::take_exchange_totals() {
  ExchangeTotals t;
  for (const auto& layer : impl_->layers) {
    ExpertParallelMoeLayer* moe = layer->ep_moe();
    if (!moe) continue;
    t.bytes += moe->exchange().bytes().total();
    for (double ms : moe->exchange().exchange_ms()) t.ms += ms;
    moe->exchange().reset_bytes();
  }
  return t;
}

void Model::set_exchange_timing(bool on) {
  for (const auto& layer : impl_->layers)
    if (ExpertParallelMoeLayer* moe = layer->ep_moe()) moe->exchange().set_timing(on);
}

EpTransport* Model::transport() const { return impl_->transport; }
int Model::world_size() const { return impl_->transport ? impl_->transport->world_size() : 1; }
int Model::rank() const { return impl_->transport ? impl_->transport->rank() : 0; }

void Model::reduce_gradients() {
  if (!impl_->transport) return;
  const ParamStore::GradRange g = store_.replicated_grads();
  impl_->transport->all_reduce_sum(g.data, g.n, ctx_.stream);
}

std::vector<LayerMemory> Model::layer_memory() const {
  std::vector<LayerMemory> out;
  for (size_t l = 0; l < impl_->layers.size(); ++l) out.push_back(impl_->layers[l]->memory(counted_bytes(impl_->h[l])));
  return out;
}

size_t Model::head_activation_bytes() const {
  const PipelineStage& st = impl_->stage;
  return static_cast<size_t>(
      buffers(cfg_, impl_->max_tokens, st.first(), st.last(), 0).counted_bytes(MemCategory::activations));
}

const PipelineStage& Model::stage() const { return impl_->stage; }

int64_t check_batch_ids(std::span<const int32_t> tokens, std::span<const int32_t> targets, int64_t vocab, int64_t T,
                        const char* who) {
  FP4MOE_CHECK(T >= 1 && tokens.size() == targets.size(), "{}: {} tokens and {} targets in rows of T = {}, expected "
               "as many of each and T >= 1", who, tokens.size(), targets.size(), T);
  int64_t valid = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const auto m = static_cast<int64_t>(i);
    FP4MOE_CHECK(tokens[i] >= 0 && tokens[i] < vocab,
                 "{}: token id {} at position {} (row {}, t={}) is outside [0, vocab_size = {})", who, tokens[i], m,
                 m / T, m % T, vocab);
    const int32_t t = targets[i];
    FP4MOE_CHECK(t == kIgnoreIndex || (t >= 0 && t < vocab),
                 "{}: target {} at position {} (row {}, t={}) is neither in [0, vocab_size = {}) nor {} (ignored)", who,
                 t, m, m / T, m % T, vocab, kIgnoreIndex);
    valid += t != kIgnoreIndex;
  }
  return valid;
}

bool emulates_layout(const TrainerConfig& cfg) { return cfg.parallel.gpus() > 1 || cfg.parallel.ep > 1; }

bool layout_is_emulated(const ParallelLayout& layout) { return layout.tp == 1; }

void check_ranks_config(const TrainerConfig& cfg, int world_size) {
  FP4MOE_CHECK(world_size >= 1, "the expert- and data-parallel group must have >= 1 ranks, got {}", world_size);
  const ParallelConfig& p = cfg.parallel;
  FP4MOE_CHECK(!emulates_layout(cfg), "the [parallel] section (tp {} pp {} dp {} ep {}) emulates one GPU of a layout "
               "on one GPU; a run over {} real ranks is {}-way expert and data parallel by itself (remove the layout "
               "from [parallel]; pipeline and tensor parallelism over real ranks are not built)", p.tp, p.pp, p.dp,
               p.ep, world_size, world_size);
  FP4MOE_CHECK(cfg.moe.routed_experts % world_size == 0 || cfg.model.n_dense_layers >= cfg.model.layers,
               "moe.routed_experts = {} must split evenly over the {} expert-parallel ranks", cfg.moe.routed_experts,
               world_size);
}

void check_emulated_layout(const TrainerConfig& cfg) {
  FP4MOE_CHECK(layout_is_emulated(layout_of(cfg)), "parallel.tp = {}: tensor parallelism is not emulated on one GPU "
               "(estimate the layout with --dry-run)", cfg.parallel.tp);
}

BufferPlan Model::comm_buffers(const TrainerConfig& cfg, int64_t seq_share, int64_t routed_rows, int64_t ep,
                               int64_t pp, bool stage_has_moe) {
  FP4MOE_CHECK(seq_share >= 0 && routed_rows >= 0 && ep >= 1 && pp >= 1,
               "Model::comm_buffers: expected seq_share, routed_rows >= 0 and ep, pp >= 1, got {} {} {} {}", seq_share,
               routed_rows, ep, pp);
  const MemCategory comm = MemCategory::comm;
  BufferPlan p("comm");
  if (ep > 1 && stage_has_moe) {
    // One MoE layer's exchange at a time: the forward's dispatch and combine, or the backward's two exchanges when
    // they are larger (sent: this GPU's tokens' k rows; received: the rows its experts get).
    const int64_t sent = seq_share * cfg.moe.top_k, received = routed_rows;
    const ExpertParallelRowBytes row = expert_parallel_row_bytes(cfg.recipe.routed_experts, cfg.model.hidden);
    const auto add = [&](const char* tensor, int64_t bytes) { p.add(tensor, bytes, ElemType::byte, true, comm); };
    if (row.dispatch + row.combine >= row.backward_dispatch + row.backward_combine) {
      add("dispatch send", sent * row.dispatch);
      add("dispatch receive", received * row.dispatch);
      add("combine send (BF16)", received * row.combine);
      add("combine receive (BF16)", sent * row.combine);
    } else {
      add("backward dy send", sent * row.backward_dispatch);
      add("backward dy receive", received * row.backward_dispatch);
      add("backward dx send (BF16)", received * row.backward_combine);
      add("backward dx receive (BF16)", sent * row.backward_combine);
    }
  }
  if (pp > 1) {
    p.add(kPipelineSend, seq_share * cfg.model.hidden, ElemType::bf16, true, comm);
    p.add(kPipelineReceive, seq_share * cfg.model.hidden, ElemType::bf16, true, comm);
  }
  return p;
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

size_t Model::head_scratch_bytes(const TrainerConfig& cfg, const PipelineStage& stage, int64_t seq_share,
                                 int64_t embedding_sort_bytes) {
  const BufferPlan p = buffers(cfg, seq_share, stage.first(), stage.last(), embedding_sort_bytes);
  auto rounded = [&](const char* t) { return ScratchArena::rounded(static_cast<size_t>(p.at(t).bytes())); };
  const size_t norm = stage.last() ? RmsNorm::scratch(seq_share, cfg.model.hidden, true).backward : 0;
  return std::max({rounded("LM head Dgrad (FP32)"), norm, rounded("embedding backward workspace")});
}

size_t Model::scratch_arena_bytes(const TrainerConfig& cfg, const PipelineStage& stage, const LayerShape& shape,
                                  int64_t embedding_sort_bytes) {
  size_t bytes = head_scratch_bytes(cfg, stage, shape.seq_share, embedding_sort_bytes);
  for (int64_t l = stage.first_layer; l < stage.first_layer + stage.layers; ++l)
    bytes = std::max(bytes, DecoderLayer::scratch(cfg, l, shape).high_water());
  return bytes;
}

std::vector<DispatchBytes> Model::dispatch_bytes() const {
  std::vector<DispatchBytes> out;
  for (const DecoderLayer* moe : impl_->moe_layers()) out.push_back(moe->moe_dispatch_bytes());
  return out;
}

void Model::force_routing(std::vector<const int32_t*> topk_per_layer) {
  const std::vector<DecoderLayer*> moes = impl_->moe_layers();
  FP4MOE_CHECK(topk_per_layer.empty() || topk_per_layer.size() == moes.size(),
               "Model force_routing: expected one top-k array per MoE layer ({}) or none, got {}", moes.size(),
               topk_per_layer.size());
  for (size_t i = 0; i < moes.size(); ++i)
    moes[i]->moe_force_routing(topk_per_layer.empty() ? nullptr : topk_per_layer[i]);
}

}  // namespace fp4moe
