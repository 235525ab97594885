#include "trainer/model/moe_expert_parallel.h"

#include <algorithm>

#include "kernels/common/check.h"
#include "kernels/nn/elementwise.h"
#include "kernels/nn/permute.h"
#include "kernels/quant/bf16_to_fp8.h"
#include "kernels/quant/bf16_to_mxfp4_row.h"
#include "kernels/quant/layouts.h"
#include "trainer/comm/ep_payload.h"
#include "trainer/model/moe.h"
#include "trainer/model/profile.h"

namespace fp4moe {
namespace {

// The layer's checks before anything is registered or allocated (the constructor's list); returns the prefix.
const std::string& checked(const std::string& prefix, const TrainerConfig& cfg, int64_t max_tokens,
                           const DeviceMemory& mem, const EpTransport& t) {
  check_moe_layer_config(cfg, max_tokens, prefix);
  const int ep = t.world_size();
  FP4MOE_CHECK(cfg.moe.routed_experts % ep == 0,
               "ExpertParallelMoeLayer {}: moe.routed_experts = {} must split evenly over the {} expert-parallel ranks",
               prefix, cfg.moe.routed_experts, ep);
  const int64_t rows = ExpertParallelMoeLayer::max_received_rows(cfg, max_tokens, ep);
  FP4MOE_CHECK(rows <= (int64_t{1} << 31) - 1,
               "ExpertParallelMoeLayer {}: the {} rows this rank's experts may receive ({} ranks x max_tokens {} x "
               "min(top_k, local experts)) exceed int32 row indices",
               prefix, rows, ep, max_tokens);
  ep_dispatch_format(cfg.recipe.routed_experts);  // a preset (the exchange's formats)
  const MoeRecompute rc = layer_recompute(cfg.recompute).moe;
  FP4MOE_CHECK(!rc.whole && !rc.act,
               "ExpertParallelMoeLayer {}: recompute of the routed experts (moe, full, moe_act) is not built with "
               "expert parallelism; use another policy",
               prefix);
  FP4MOE_CHECK(mem.slots().count() == 1,
               "ExpertParallelMoeLayer {}: {} in-flight micro-batches; the exchange holds one layer routing from "
               "forward to backward, so one is built",
               prefix, mem.slots().count());
  return prefix;
}

// The router as on one GPU, over all E experts: no emulated layout (its local mapping of cfg.parallel), the
// exchange routes.
TrainerConfig router_config(const TrainerConfig& cfg) {
  TrainerConfig c = cfg;
  c.parallel = ParallelConfig{};
  return c;
}

// The mutable Param named `name` of `store` (registered by this layer's parts).
Param& param_named(ParamStore& store, const std::string& name) {
  for (Param& p : store.params())
    if (p.name == name) return p;
  fail(__FILE__, __LINE__, "ExpertParallelMoeLayer: parameter " + name + " is not registered");
}

}  // namespace

int64_t ExpertParallelMoeLayer::max_received_rows(const TrainerConfig& cfg, int64_t max_tokens, int ranks) {
  const int64_t E_l = cfg.moe.routed_experts / ranks;
  return ranks * max_tokens * std::min<int64_t>(cfg.moe.top_k, E_l);  // every rank's tokens, min(k, E_l) times each
}

ExpertParallelMoeLayer::ExpertParallelMoeLayer(ParamStore& store, const std::string& prefix, const TrainerConfig& cfg,
                                               int64_t max_tokens, DeviceMemory& mem, EpTransport& transport)
    : prefix_(checked(prefix, cfg, max_tokens, mem, transport)),
      transport_(&transport),
      d_(cfg.model.hidden),
      k_(cfg.moe.top_k),
      max_tokens_(max_tokens),
      E_l_(cfg.moe.routed_experts / transport.world_size()),
      max_rows_(max_received_rows(cfg, max_tokens, transport.world_size())),
      recipe_(cfg.recipe.routed_experts),
      exchange_(transport, cfg.moe.routed_experts, cfg.model.hidden, &mem),
      router_(store, prefix, router_config(cfg), max_tokens, mem),
      // The experts' own top-k is min(k, E_l): their rows entry reads only R_max = max_tokens' k' rows of buffers.
      experts_(store, prefix, E_l_, d_, cfg.moe.expert_ffn, std::min(k_, E_l_), cfg.recipe.routed_experts,
               moe_fc2_init_std(cfg), transport.world_size() * max_tokens, mem,
               layer_recompute(cfg.recompute).moe),
      local_offsets_(mem, E_l_ + 1, MemCategory::workspace, prefix + " local expert offsets"),
      host_local_offsets_(static_cast<size_t>(4 * (E_l_ + 1))) {
  const MoeRecompute rc = layer_recompute(cfg.recompute).moe;
  if (cfg.moe.shared_experts > 0)
    shared_ = std::make_unique<SwigluMlp>(store, prefix + ".shared", d_, cfg.moe.shared_experts * cfg.moe.expert_ffn,
                                          cfg.recipe.shared_experts, max_tokens, mem, moe_fc2_init_std(cfg),
                                          rc.shared_experts);
  ys_ = exchange_buffers(max_tokens, 0, d_, k_, recipe_).allocate_kept<bf16>(mem, "combined ys", prefix + " ep");
  scratch_ = scratch(cfg, max_tokens, max_rows_, E_l_);
  if (router_.bias())
    step_loads_ = DeviceArray<float>(mem, cfg.moe.routed_experts, MemCategory::workspace, prefix + " step loads");
  // This rank's experts are experts [r E_l, (r + 1) E_l) of the single-GPU layer: their initial values too.
  const int64_t r = transport.rank();
  for (const char* w : {".experts.fc1", ".experts.fc2"}) {
    Param& p = param_named(store, prefix + w);
    p.init_index = r * p.n;  // p.n = E_l experts' elements
  }
}

size_t ExpertParallelMoeLayer::kept_bytes() const {
  return router_.kept_bytes() + experts_.kept_bytes() + (shared_ ? shared_->kept_bytes() : 0) + counted_bytes(ys_);
}

std::vector<BufferPlan> ExpertParallelMoeLayer::buffers(const TrainerConfig& cfg, int64_t seq_share,
                                                        int64_t routed_rows, int64_t local_experts) {
  const MoeConfig& e = cfg.moe;
  const int64_t d = cfg.model.hidden, shared_ffn = e.shared_experts * e.expert_ffn;
  const MoeRecompute rc = layer_recompute(cfg.recompute).moe;
  std::vector<BufferPlan> plans;
  plans.push_back(MoeLayer::block_buffers(seq_share, d, e.top_k, shared_ffn > 0));
  plans.push_back(MoeRouter::buffers(seq_share, e.routed_experts, e.top_k, e.routed_experts, seq_share * e.top_k));
  plans.push_back(
      MoeRoutedExperts::buffers(routed_rows, local_experts, d, e.expert_ffn, cfg.recipe.routed_experts, rc));
  if (shared_ffn > 0)
    plans.push_back(SwigluMlp::buffers("moe.shared", seq_share, seq_share, d, shared_ffn, cfg.recipe.shared_experts,
                                       rc.shared_experts, true));
  plans.push_back(exchange_buffers(seq_share, routed_rows, d, e.top_k, cfg.recipe.routed_experts));
  return plans;
}

void ExpertParallelMoeLayer::end_step(ModelContext& ctx) {
  if (router_.bias()) {  // v3: the loads of every rank's tokens
    const std::vector<int64_t>& tally = router_.step_counts();
    std::vector<float> loads(tally.begin(), tally.end());
    CUDA_CHECK(cudaMemcpyAsync(step_loads_.data(), loads.data(), loads.size() * sizeof(float), cudaMemcpyHostToDevice,
                               ctx.stream));
    transport_->all_reduce_sum(step_loads_.data(), static_cast<int64_t>(loads.size()), ctx.stream);
    CUDA_CHECK(cudaMemcpyAsync(loads.data(), step_loads_.data(), loads.size() * sizeof(float), cudaMemcpyDeviceToHost,
                               ctx.stream));
    transport_->wait(ctx.stream);
    std::vector<int64_t> summed(loads.size());
    for (size_t e = 0; e < loads.size(); ++e) {
      // Sums of non-negative integers stay exact in FP32 while every partial sum, so the total, is below 2^24.
      FP4MOE_CHECK(loads[e] < 16777216.0f, "ExpertParallelMoeLayer {} end_step: expert {} received {} tokens over "
                   "the ranks this step; the FP32 sum of the loads is exact below 2^24", prefix_, e, loads[e]);
      summed[e] = static_cast<int64_t>(loads[e]);
    }
    router_.set_step_counts(std::move(summed));
  }
  router_.end_step(ctx);
}

BufferPlan ExpertParallelMoeLayer::exchange_buffers(int64_t M, int64_t R, int64_t d, int64_t k, const Recipe& routed) {
  FP4MOE_CHECK(M >= 0 && R >= 0, "ExpertParallelMoeLayer::exchange_buffers: need M >= 0 and R >= 0, got M={} R={}", M,
               R);
  const EpRowFormat fwd = ep_dispatch_format(routed), bwd = ep_backward_dispatch_format(routed);
  const bool f8 = fwd == EpRowFormat::fp8, mx = fwd == EpRowFormat::mxfp4, b8 = bwd == EpRowFormat::fp8;
  const MemCategory ws = MemCategory::workspace;
  const Lifetime fs = Lifetime::forward_scratch, bs = Lifetime::backward_scratch;
  auto n = [](bool on, int64_t elems) { return on ? elems : int64_t{0}; };
  BufferPlan p("moe.ep");
  p.add("combined ys", M * k * d, ElemType::bf16);
  p.add("tokens FP8 codes", n(f8, M * d), ElemType::e4m3, true, ws, fs);
  p.add("tokens FP8 scales", n(f8, fp8_row_scale_count(M, d)), ElemType::fp32, true, ws, fs);
  p.add("tokens MXFP4 codes", n(mx, M * d / 2), ElemType::e2m1x2, true, ws, fs);
  p.add("tokens MXFP4 scales", n(mx, M * d / kMxBlock), ElemType::ue8m0, true, ws, fs);
  p.add("received FP8 codes", n(f8, R * d), ElemType::e4m3, true, ws, fs);
  p.add("received FP8 scales", n(f8, fp8_row_scale_count(R, d)), ElemType::fp32, true, ws, fs);
  p.add("received rows (BF16)", n(f8, R * d), ElemType::bf16, true, ws, fs);
  p.add("d rows", M * k * d, ElemType::bf16, true, ws, bs);
  p.add("d rows FP8 codes", n(b8, M * k * d), ElemType::e4m3, true, ws, bs);
  p.add("d rows FP8 scales", n(b8, fp8_row_scale_count(M * k, d)), ElemType::fp32, true, ws, bs);
  p.add("received d rows FP8 codes", n(b8, R * d), ElemType::e4m3, true, ws, bs);
  p.add("received d rows FP8 scales", n(b8, fp8_row_scale_count(R, d)), ElemType::fp32, true, ws, bs);
  p.add("expert d rows", R * d, ElemType::bf16, true, ws, bs);
  return p;
}

PassScratch ExpertParallelMoeLayer::scratch(const TrainerConfig& cfg, int64_t M, int64_t R, int64_t E_l) {
  const MoeConfig& e = cfg.moe;
  const int64_t d = cfg.model.hidden;
  const MoeRecompute rc = layer_recompute(cfg.recompute).moe;
  const bool shared = e.shared_experts > 0;
  const int64_t shared_ffn = e.shared_experts * e.expert_ffn;
  const PassScratch router = MoeRouter::scratch(M, e.routed_experts, e.top_k, e.routed_experts);
  const PassScratch experts = MoeRoutedExperts::scratch(R, E_l, d, e.expert_ffn, cfg.recipe.routed_experts, rc);
  const PassScratch shared_mlp =
      shared ? SwigluMlp::scratch(M, d, shared_ffn, cfg.recipe.shared_experts, rc.shared_experts) : PassScratch{};
  const BufferPlan own = exchange_buffers(M, R, d, e.top_k, cfg.recipe.routed_experts);
  const BufferPlan block = MoeLayer::block_buffers(M, d, e.top_k, shared);
  auto sum = [](const BufferPlan& p, Lifetime l) {
    size_t s = 0;
    for (const PlannedBuffer& b : p.buffers())
      if (b.lifetime == l) s += ScratchArena::rounded(static_cast<size_t>(b.bytes()));
    return s;
  };
  PassScratch out;
  out.forward = router.forward + sum(own, Lifetime::forward_scratch) + experts.forward +
                sum(block, Lifetime::forward_scratch) + shared_mlp.forward;
  out.backward = sum(own, Lifetime::backward_scratch) + sum(block, Lifetime::backward_scratch) +
                 std::max({experts.backward, shared_mlp.backward, router.backward});
  return out;
}

GroupSplit ExpertParallelMoeLayer::local_split() const {
  return GroupSplit{local_offsets_.data(), static_cast<const int32_t*>(host_local_offsets_.get()), E_l_};
}

void ExpertParallelMoeLayer::forward(ModelContext& ctx, const bf16* x, int64_t M, bf16* y) {
  FP4MOE_CHECK(M >= 0 && M <= max_tokens_, "ExpertParallelMoeLayer {} forward: M must be in [0, {}] (max_tokens), got "
               "M={}", prefix_, max_tokens_, M);
  FP4MOE_CHECK(M == 0 || (x && y), "ExpertParallelMoeLayer {} forward: null x or y (expected BF16 [M, {}])", prefix_,
               d_);
  last_M_ = -1;
  ScratchArena& arena = scratch_of(ctx, "ExpertParallelMoeLayer " + prefix_);
  ScratchScope scope(arena);
  cudaStream_t s = ctx.stream;
  router_.forward(ctx, x, M);  // all E experts; its host synchronisation
  const MoeRouting r = router_.routing();
  ProfileScope comm(ctx, ProfileModule::ep_comm, ProfilePass::forward);  // the counts, the payload, the dispatch
  const EpCounts& c = exchange_.route(r.topk_idx, M, k_, s);  // the exchange's host synchronisation
  const int64_t R = c.recv_total();
  FP4MOE_CHECK(R <= max_rows_, "ExpertParallelMoeLayer {} forward: {} rows received, more than the {} the layer holds",
               prefix_, R, max_rows_);
  const std::vector<int32_t> lo = c.local_offsets();
  std::copy(lo.begin(), lo.end(), static_cast<int32_t*>(host_local_offsets_.get()));
  CUDA_CHECK(cudaMemcpyAsync(local_offsets_.data(), host_local_offsets_.get(), 4 * lo.size(), cudaMemcpyHostToDevice,
                             s));

  // Dispatch: the tokens in the recipe's format, quantized per row before they leave.
  const BufferPlan p = exchange_buffers(M, R, d_, k_, recipe_);
  const EpRowFormat fmt = ep_dispatch_format(recipe_);
  EpRows tokens{fmt, M, d_, const_cast<bf16*>(x), nullptr};
  if (fmt == EpRowFormat::fp8) {
    tokens.codes = take_planned<uint8_t>(arena, p.at("tokens FP8 codes"), "EP tokens FP8 codes");
    tokens.scales = take_planned<float>(arena, p.at("tokens FP8 scales"), "EP tokens FP8 scales");
    if (M > 0)
      bf16_to_fp8_row(x, M, d_, Fp8ScaleMode::pow2, static_cast<uint8_t*>(tokens.codes),
                      static_cast<float*>(tokens.scales), nullptr, s);
  } else if (fmt == EpRowFormat::mxfp4) {
    tokens.codes = take_planned<uint8_t>(arena, p.at("tokens MXFP4 codes"), "EP tokens MXFP4 codes");
    tokens.scales = take_planned<uint8_t>(arena, p.at("tokens MXFP4 scales"), "EP tokens MXFP4 scales");
    bf16_to_mxfp4_row(x, M, d_, static_cast<uint8_t*>(tokens.codes), static_cast<uint8_t*>(tokens.scales),
                      MxQuantConfig{}, nullptr, s);
  }
  const GroupLinearInput kept = experts_.kept_input();
  GroupLinearInput in = kept;
  EpRows received{fmt, R, d_, const_cast<bf16*>(kept.x), nullptr};
  if (fmt == EpRowFormat::mxfp4) {
    received.codes = const_cast<uint8_t*>(kept.mx_codes);
    received.scales = const_cast<uint8_t*>(kept.mx_scales);
  } else if (fmt == EpRowFormat::fp8) {
    received.codes = take_planned<uint8_t>(arena, p.at("received FP8 codes"), "EP received FP8 codes");
    received.scales = take_planned<float>(arena, p.at("received FP8 scales"), "EP received FP8 scales");
    in.x = take_planned<bf16>(arena, p.at("received rows (BF16)"), "EP received rows (BF16)");
  }
  exchange_.dispatch(tokens, received, s);
  if (fmt == EpRowFormat::fp8) ep_fp8_rows_to_bf16(received, const_cast<bf16*>(in.x), s);
  comm.end();

  // The local experts on every rank's rows, then the combine into this rank's permute order.
  const bf16* ys_grouped = nullptr;
  {
    ProfileScope experts(ctx, ProfileModule::routed_experts, ProfilePass::forward);
    ys_grouped = experts_.forward_rows(ctx, in, local_split());
  }
  {
    ProfileScope combine(ctx, ProfileModule::ep_comm, ProfilePass::forward);
    exchange_.combine(ys_grouped, ys_.data(), s);
  }
  if (M > 0) {
    {
      ProfileScope unpermute(ctx, ProfileModule::moe_permute, ProfilePass::forward);
      unpermute_forward(ys_.data(), r.topk_weight, exchange_.row_of(), M, k_, d_, y, s);  // y = y_routed [M, d]
    }
    if (shared_) {
      ProfileScope shared(ctx, ProfileModule::shared_experts, ProfilePass::forward);
      bf16* y_shared = take_planned<bf16>(arena, MoeLayer::block_buffers(M, d_, k_, true).at("shared experts output"),
                                          "MoE shared experts output");
      shared_->forward(ctx, x, M, y_shared);
      add_bf16(y, y_shared, M * d_, y, s);  // y = y_routed + y_shared
    }
  }
  last_M_ = M;
}

void ExpertParallelMoeLayer::backward(ModelContext& ctx, const bf16* dy, const bf16* x, int64_t M, bf16* dx) {
  FP4MOE_CHECK(M == last_M_, "ExpertParallelMoeLayer {} backward: expected the last forward's M={}, got M={}", prefix_,
               last_M_, M);
  FP4MOE_CHECK(M == 0 || (dy && x && dx), "ExpertParallelMoeLayer {} backward: dy, x and dx [M, {}] must not be null",
               prefix_, d_);
  ScratchArena& arena = scratch_of(ctx, "ExpertParallelMoeLayer " + prefix_);
  ScratchScope scope(arena);
  cudaStream_t s = ctx.stream;
  const MoeRouting r = router_.routing();
  const int64_t R = exchange_.counts().recv_total(), n = M * k_;
  const BufferPlan p = exchange_buffers(M, R, d_, k_, recipe_);
  const BufferPlan block = MoeLayer::block_buffers(M, d_, k_, shared_ != nullptr);
  bf16* drows = take_planned<bf16>(arena, p.at("d rows"), "EP d rows");
  float* dweights = take_planned<float>(arena, block.at("top-k weights grad"), "MoE top-k weights grad");
  if (M > 0) {
    ProfileScope unpermute(ctx, ProfileModule::moe_permute, ProfilePass::backward);
    unpermute_backward(dy, ys_.data(), r.topk_weight, exchange_.row_of(), M, k_, d_, drows, dweights, s);
  }
  ProfileScope comm(ctx, ProfileModule::ep_comm, ProfilePass::backward);  // the payload and dispatch_gradient

  // dispatch_gradient: the experts' dY in the backward format; back in BF16 for Group Linear.
  const EpRowFormat fmt = ep_backward_dispatch_format(recipe_);
  bf16* edrows = take_planned<bf16>(arena, p.at("expert d rows"), "EP expert d rows");
  EpRows sent{fmt, n, d_, drows, nullptr}, received{fmt, R, d_, edrows, nullptr};
  if (fmt == EpRowFormat::fp8) {
    sent.codes = take_planned<uint8_t>(arena, p.at("d rows FP8 codes"), "EP d rows FP8 codes");
    sent.scales = take_planned<float>(arena, p.at("d rows FP8 scales"), "EP d rows FP8 scales");
    if (n > 0)
      bf16_to_fp8_row(drows, n, d_, Fp8ScaleMode::pow2, static_cast<uint8_t*>(sent.codes),
                      static_cast<float*>(sent.scales), nullptr, s);
    received.codes = take_planned<uint8_t>(arena, p.at("received d rows FP8 codes"), "EP received d rows FP8 codes");
    received.scales = take_planned<float>(arena, p.at("received d rows FP8 scales"), "EP received d rows FP8 scales");
  }
  exchange_.dispatch_gradient(sent, received, s);
  if (fmt == EpRowFormat::fp8) ep_fp8_rows_to_bf16(received, edrows, s);
  comm.end();

  // The experts' Dgrad and Wgrad on the received rows (fp8: Group Linear reads its own FP8 column copy of X), then
  // their input gradient back to this rank's permute order, summed over the k slots.
  {
    ProfileScope experts(ctx, ProfileModule::routed_experts, ProfilePass::backward);
    experts_.backward_rows(ctx, experts_.kept_input(), edrows, local_split(), edrows);
  }
  {
    ProfileScope combine(ctx, ProfileModule::ep_comm, ProfilePass::backward);
    exchange_.combine_gradient(edrows, drows, s);
  }
  if (M == 0) {
    router_.backward(ctx, nullptr, x, 0, aux_grad_scale_, nullptr);  // an empty micro-batch counts no tokens
    return;
  }
  bf16* dx_routed = take_planned<bf16>(arena, block.at("routed experts dx"), "MoE routed experts dx");
  float* dx32 = take_planned<float>(arena, block.at("dx (FP32)"), "MoE dx (FP32)");
  {
    ProfileScope permute(ctx, ProfileModule::moe_permute, ProfilePass::backward);
    permute_backward(drows, exchange_.row_of(), M, k_, d_, dx_routed, s);
  }
  cast_bf16_to_f32(dx_routed, M * d_, dx32, s);  // dx32 = dx_routed
  if (shared_) {
    ProfileScope shared(ctx, ProfileModule::shared_experts, ProfilePass::backward);
    shared_->backward(ctx, dy, x, M, LinearGradOut{dx32, true, true});  // dx32 += shared
  }
  router_.backward(ctx, dweights, x, M, aux_grad_scale_, dx32);                    // dx32 += router
  cast_f32_to_bf16(dx32, M * d_, dx, s);
}

}  // namespace fp4moe
