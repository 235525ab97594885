#include "trainer/model/moe_router.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "kernels/common/check.h"
#include "kernels/nn/elementwise.h"
#include "kernels/nn/router_gates.h"
#include "trainer/model/layout_emulation.h"
#include "trainer/model/profile.h"

namespace fp4moe {

namespace {
constexpr float kRouterInitStd = 0.02f;
}  // namespace

int64_t local_routed_experts(const TrainerConfig& cfg) {
  FP4MOE_CHECK(cfg.parallel.ep >= 1, "parallel.ep must be >= 1, got {}", cfg.parallel.ep);
  return cfg.moe.routed_experts / cfg.parallel.ep;  // validate_layout: ep divides routed_experts (with MoE layers)
}

PinnedHost::PinnedHost(size_t bytes) {
  if (bytes) CUDA_CHECK(cudaMallocHost(&p_, bytes));
}

PinnedHost::~PinnedHost() {
  if (p_) cudaFreeHost(p_);
}

PinnedHost& PinnedHost::operator=(PinnedHost&& o) noexcept {
  if (this != &o) {
    if (p_) cudaFreeHost(p_);
    p_ = o.p_;
    o.p_ = nullptr;
  }
  return *this;
}

MoeRouter::MoeRouter(ParamStore& store, const std::string& prefix, const TrainerConfig& cfg, int64_t max_tokens,
                     DeviceMemory& mem)
    : prefix_(prefix),
      rcfg_{cfg.moe.router, cfg.moe.top_k, static_cast<float>(cfg.moe.routed_scale),
            static_cast<float>(cfg.moe.aux_alpha)},
      d_(cfg.model.hidden),
      E_(cfg.moe.routed_experts),
      El_(local_routed_experts(cfg)),
      max_tokens_(max_tokens),
      routed_load_(cfg.parallel.routed_load),
      max_rows_(0),
      gamma_(static_cast<float>(cfg.moe.bias_update_rate)),
      w_(nullptr),
      last_M_(mem.slots(), -1),
      last_counts_(mem.slots(), std::vector<int64_t>(static_cast<size_t>(E_), 0)),
      sync_free_(mem.slots(), 0),
      host_offsets_(mem.slots()) {
  const char* what = "MoeRouter";
  FP4MOE_CHECK(max_tokens >= 0, "{} {}: max_tokens must be >= 0, got {}", what, prefix, max_tokens);
  FP4MOE_CHECK(d_ >= 8 && d_ % 8 == 0, "{} {}: hidden must be a positive multiple of 8, got {}", what, prefix, d_);
  detail::check_router_shape(what, max_tokens, E_, rcfg_);  // E, top_k, scale, alpha, max_tokens * k in int32
  const int64_t k = rcfg_.top_k;
  max_rows_ = routed_row_count(max_tokens * k, routed_load_);
  FP4MOE_CHECK(max_rows_ <= (int64_t{1} << 31) - 1, "{} {}: {} tokens x top-{} x parallel.routed_load {} = {} routed "
               "rows, beyond int32 (row indices)", what, prefix, max_tokens, k, routed_load_, max_rows_);
  w_ = &store.add(prefix + ".router", {E_, d_}, ParamInit::normal, kRouterInitStd, /*decay=*/true);
  if (rcfg_.style == RouterStyle::v3_sigmoid) bias_ = &store.add_state(prefix + ".router_bias", {E_});
  const BufferPlan plan = buffers(max_tokens, E_, k, El_, max_rows_);
  const std::string owner = prefix + " router";
  probs_ = plan.allocate_kept<float>(mem, "probs", owner);
  topk_weight_ = plan.allocate_kept<float>(mem, "topk_weight", owner);
  topk_idx_ = plan.allocate_kept<int32_t>(mem, "topk_idx", owner);
  counts_ = plan.allocate_kept<int32_t>(mem, "counts", owner);
  offsets_ = plan.allocate_kept<int32_t>(mem, "offsets", owner);
  aux_ = plan.allocate_kept<float>(mem, "aux", owner);
  local_idx_ = plan.allocate_kept<int32_t>(mem, "local topk_idx", owner);
  local_counts_ = plan.allocate_kept<int32_t>(mem, "local counts", owner);
  local_offsets_ = plan.allocate_kept<int32_t>(mem, "local offsets", owner);
  for (PinnedHost& h : host_offsets_.all()) h = PinnedHost((E_ + 1) * sizeof(int32_t));
  if (El_ < E_)
    for (PinnedHost& h : host_local_offsets_.all()) h = PinnedHost((El_ + 1) * sizeof(int32_t));
  host_aux_ = PinnedHost(sizeof(float));
  tally_.assign(E_, 0);
  scratch_ = scratch(max_tokens, E_, k, El_);
}

PassScratch MoeRouter::scratch(int64_t tokens, int64_t E, int64_t k, int64_t E_local) {
  const BufferPlan plan = buffers(tokens, E, k, E_local, tokens * k);
  auto rounded = [&](const char* t) { return ScratchArena::rounded(static_cast<size_t>(plan.at(t).bytes())); };
  PassScratch s;
  s.forward = rounded("logits (FP32)");
  s.backward = rounded("dlogits (FP32)") + rounded("dlogits (BF16)");
  return s;
}

size_t MoeRouter::kept_bytes() const {
  return static_cast<size_t>(
      buffers(max_tokens_, E_, rcfg_.top_k, El_, max_rows_).counted_bytes(MemCategory::activations));
}

BufferPlan MoeRouter::buffers(int64_t tokens, int64_t E, int64_t k, int64_t E_local, int64_t rows) {
  FP4MOE_CHECK(tokens >= 0 && E >= 1 && k >= 1, "MoeRouter::buffers: expected tokens >= 0, E, k >= 1, got {} {} {}",
               tokens, E, k);
  FP4MOE_CHECK(E_local >= 1 && E_local <= E && E % E_local == 0,
               "MoeRouter::buffers: local experts {} must be in [1, E = {}] and divide E", E_local, E);
  FP4MOE_CHECK(rows >= 0, "MoeRouter::buffers: routed rows must be >= 0, got {}", rows);
  BufferPlan p("moe.router");
  p.add("probs", tokens * E, ElemType::fp32);
  p.add("topk_weight", tokens * k, ElemType::fp32);
  p.add("topk_idx", tokens * k, ElemType::int32);
  p.add("counts", E, ElemType::int32);
  p.add("offsets", E + 1, ElemType::int32);
  p.add("aux", 1, ElemType::fp32);
  const bool local = E_local < E;  // expert parallelism: the local routing (layout_emulation.h)
  p.add("local topk_idx", local ? rows : 0, ElemType::int32);
  p.add("local counts", local ? E_local : 0, ElemType::int32);
  p.add("local offsets", local ? E_local + 1 : 0, ElemType::int32);
  const MemCategory ws = MemCategory::workspace;
  p.add("logits (FP32)", tokens * E, ElemType::fp32, true, ws, Lifetime::forward_scratch);
  p.add("dlogits (FP32)", tokens * E, ElemType::fp32, true, ws, Lifetime::backward_scratch);
  p.add("dlogits (BF16)", tokens * E, ElemType::bf16, true, ws, Lifetime::backward_scratch);
  return p;
}

MoeRouting MoeRouter::routing() const {
  const int64_t M = std::max<int64_t>(last_M_.get(), 0), k = rcfg_.top_k;
  const bool host = sync_free_.get() == 0;  // without host synchronisation the device offsets alone
  if (El_ < E_)
    return MoeRouting{M, El_, k, routed_row_count(M * k, routed_load_), local_idx_.data(), topk_weight_.data(),
                      local_offsets_.data(),
                      host ? static_cast<const int32_t*>(host_local_offsets_.get().get()) : nullptr};
  return MoeRouting{M, E_, k, M * k, topk_idx_.data(), topk_weight_.data(), offsets_.data(),
                    host ? static_cast<const int32_t*>(host_offsets_.get().get()) : nullptr};
}

void MoeRouter::forward(ModelContext& ctx, const bf16* x, int64_t M) {
  FP4MOE_CHECK(M >= 0 && M <= max_tokens_, "MoeRouter {} forward: M must be in [0, {}] (max_tokens), got M={}",
               prefix_, max_tokens_, M);
  auto* host_offsets = static_cast<int32_t*>(host_offsets_.get().get());
  std::vector<int64_t>& last_counts = last_counts_.get();
  last_M_.get() = M;
  sync_free_.get() = 0;
  aux_host_ = 0.0f;
  if (M == 0) {
    std::fill(host_offsets, host_offsets + E_ + 1, 0);
    if (El_ < E_) {
      auto* host_local = static_cast<int32_t*>(host_local_offsets_.get().get());
      std::fill(host_local, host_local + El_ + 1, 0);
    }
    std::fill(last_counts.begin(), last_counts.end(), 0);
    return;
  }
  FP4MOE_CHECK(x != nullptr, "MoeRouter {} forward: null x (expected BF16 [M, {}])", prefix_, d_);
  ProfileScope profile(ctx, ProfileModule::router, ProfilePass::forward);  // with the host read of the counts
  const bool v2 = rcfg_.style == RouterStyle::v2_softmax;
  const int64_t k = rcfg_.top_k;
  ScratchArena& arena = scratch_of(ctx, "MoeRouter " + prefix_);  // the take stays in the caller's scope
  const BufferPlan plan = buffers(M, E_, k, El_, routed_row_count(M * k, routed_load_));
  float* logits = take_planned<float>(arena, plan.at("logits (FP32)"), "router logits");
  // logits^T [E, M] (column-major) = W_r (stored d x E column-major, transposed) * x^T (stored d x M)
  ctx.lt->matmul(E_, M, d_, LtOperand{w_->param, CUDA_R_16BF, true, d_}, LtOperand{x, CUDA_R_16BF, false, d_},
                 LtOutput{logits, CUDA_R_32F, E_, false}, RaggedDim::none, ctx.stream);
  router_forward(logits, bias_ ? bias_->data : nullptr, M, E_, rcfg_, probs_.data(), topk_idx_.data(),
                 topk_weight_.data(), counts_.data(), offsets_.data(), v2 ? aux_.data() : nullptr, ctx.stream);
  if (forced_) {
    CUDA_CHECK(cudaMemcpyAsync(topk_idx_.data(), forced_, static_cast<size_t>(M * k) * sizeof(int32_t),
                               cudaMemcpyDeviceToDevice, ctx.stream));
    expert_counts_and_offsets(topk_idx_.data(), M, k, E_, counts_.data(), offsets_.data(), ctx.stream);
    router_gates_for_indices(probs_.data(), topk_idx_.data(), counts_.data(), M, E_, rcfg_, topk_weight_.data(),
                             v2 ? aux_.data() : nullptr, ctx.stream);
  }
  if (El_ < E_)  // expert parallelism: this GPU's share of the rows, skewed or not (layout_emulation.h)
    local_expert_routing(topk_idx_.data(), M * k, routed_row_count(M * k, routed_load_), El_, local_idx_.data(),
                         local_counts_.data(), local_offsets_.data(), ctx.stream);
  if (ctx.host_sync_free) {  // the counts stay on the device (above)
    sync_free_.get() = 1;
    aux_host_ = std::numeric_limits<float>::quiet_NaN();
    return;
  }
  if (El_ < E_)
    CUDA_CHECK(cudaMemcpyAsync(host_local_offsets_.get().get(), local_offsets_.data(), (El_ + 1) * sizeof(int32_t),
                               cudaMemcpyDeviceToHost, ctx.stream));
  // The layer's one host synchronisation: the expert token counts (and the v2 loss) come to the host.
  CUDA_CHECK(cudaMemcpyAsync(host_offsets, offsets_.data(), (E_ + 1) * sizeof(int32_t), cudaMemcpyDeviceToHost,
                             ctx.stream));
  if (v2)
    CUDA_CHECK(cudaMemcpyAsync(host_aux_.get(), aux_.data(), sizeof(float), cudaMemcpyDeviceToHost, ctx.stream));
  CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
  FP4MOE_CHECK(host_offsets[0] == 0 && host_offsets[E_] == M * k,
               "MoeRouter {} forward: the offsets end at {} but {} tokens x top-{} were routed (a forced selection "
               "with an expert outside [0, {})?)",
               prefix_, host_offsets[E_], M, k, E_);
  for (int64_t e = 0; e < E_; ++e) last_counts[e] = host_offsets[e + 1] - host_offsets[e];
  if (v2) aux_host_ = *static_cast<const float*>(host_aux_.get());
}

void MoeRouter::backward(ModelContext& ctx, const float* dweights, const bf16* x, int64_t M, float aux_grad,
                         float* dx32) {
  FP4MOE_CHECK(M == last_M_.get(), "MoeRouter {} backward: expected the last forward's M={}, got M={}", prefix_,
               last_M_.get(), M);
  const std::vector<int64_t>& last_counts = last_counts_.get();  // the active slot's forward
  if (M == 0) {
    for (int64_t e = 0; e < E_; ++e) tally_[e] += last_counts[e];  // zeros: an empty micro-batch counts nothing
    return;
  }
  FP4MOE_CHECK(dweights && x && dx32, "MoeRouter {} backward: dweights [M, k], x [M, {}] and dx32 [M, {}] must not "
               "be null", prefix_, d_, d_);
  ScratchArena& arena = scratch_of(ctx, "MoeRouter " + prefix_);
  if (sync_free_.get() == 0) {
    for (int64_t e = 0; e < E_; ++e) tally_[e] += last_counts[e];
  } else if (bias_ != nullptr) {  // v3 without host synchronisation: the tally on the device
    if (step_tally_.data() == nullptr) {  // the mode's first backward, which must run eagerly
      cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
      CUDA_CHECK(cudaStreamIsCapturing(ctx.stream, &capturing));
      FP4MOE_CHECK(capturing == cudaStreamCaptureStatusNone,
                   "MoeRouter {} backward: the device tally is allocated by the first backward without host "
                   "synchronisation, which must run eagerly (run one step in the mode before capturing one)",
                   prefix_);
      FP4MOE_CHECK(ctx.mem != nullptr, "MoeRouter {} backward: the ModelContext has no DeviceMemory", prefix_);
      step_tally_ = DeviceArray<int32_t>(*ctx.mem, E_, MemCategory::workspace, prefix_ + " router step tally");
      CUDA_CHECK(cudaMemsetAsync(step_tally_.data(), 0, static_cast<size_t>(E_) * sizeof(int32_t), ctx.stream));
    }
    router_tally_counts(counts_.data(), E_, step_tally_.data(), ctx.stream);
  }
  ScratchScope scope(arena);
  ProfileScope profile(ctx, ProfileModule::router, ProfilePass::backward);
  const BufferPlan plan = buffers(M, E_, rcfg_.top_k, El_, routed_row_count(M * rcfg_.top_k, routed_load_));
  float* dlogits = take_planned<float>(arena, plan.at("dlogits (FP32)"), "router dlogits (FP32)");  // [M, E]
  bf16* dl = take_planned<bf16>(arena, plan.at("dlogits (BF16)"), "router dlogits (BF16)");
  router_backward(probs_.data(), topk_idx_.data(), counts_.data(), dweights, M, E_, rcfg_, aux_grad, dlogits,
                  ctx.stream);
  cast_f32_to_bf16(dlogits, M * E_, dl, ctx.stream);
  // Dgrad: dx^T [d, M] += (W_r stored d x E column-major) * (dlogits stored E x M)
  ctx.lt->matmul(d_, M, E_, LtOperand{w_->param, CUDA_R_16BF, false, d_}, LtOperand{dl, CUDA_R_16BF, false, E_},
                 LtOutput{dx32, CUDA_R_32F, d_, true}, RaggedDim::none, ctx.stream);
  // Wgrad: dW_r^T [d, E] += (x stored d x M) * (dlogits stored E x M)^T
  ctx.lt->matmul(d_, E_, M, LtOperand{x, CUDA_R_16BF, false, d_}, LtOperand{dl, CUDA_R_16BF, true, E_},
                 LtOutput{w_->grad, CUDA_R_32F, d_, true}, RaggedDim::none, ctx.stream);
}

void MoeRouter::set_step_counts(std::vector<int64_t> counts) {
  FP4MOE_CHECK(static_cast<int64_t>(counts.size()) == E_, "MoeRouter {} set_step_counts: {} counts for {} experts",
               prefix_, counts.size(), E_);
  for (size_t e = 0; e < counts.size(); ++e)
    FP4MOE_CHECK(counts[e] >= 0, "MoeRouter {} set_step_counts: expert {} has a negative count {}", prefix_, e,
                 counts[e]);
  tally_ = std::move(counts);
}

void MoeRouter::end_step(ModelContext& ctx) {
  if (rcfg_.style != RouterStyle::v3_sigmoid) return;
  if (ctx.host_sync_free) {  // the device tally and its device total (replays count there too); no host wait
    if (!std::all_of(tally_.begin(), tally_.end(), [](int64_t c) { return c == 0; })) {
      std::fill(tally_.begin(), tally_.end(), 0);
      fail(__FILE__, __LINE__,
           fmt::format("MoeRouter {} end_step: the step has micro-batches counted with host synchronisation, but "
                       "ends without it (switch the mode between optimizer steps, after end_step); their counts "
                       "were dropped",
                       prefix_));
    }
    if (step_tally_.data() == nullptr) return;  // no backward in the mode yet: nothing counted
    ProfileScope profile(ctx, ProfileModule::router, ProfilePass::update);
    // A zero tally leaves the bias unchanged (every load equals the total, 0), as the host path's early return.
    router_bias_update_from_tally(step_tally_.data(), E_, gamma_, bias_->data, ctx.stream);  // zeroes the tally
    return;
  }
  int64_t total = 0;
  std::vector<int32_t> counts(E_);
  for (int64_t e = 0; e < E_; ++e) {
    FP4MOE_CHECK(tally_[e] <= std::numeric_limits<int32_t>::max(),
                 "MoeRouter {} end_step: expert {} received {} tokens this step, beyond int32", prefix_, e, tally_[e]);
    counts[e] = static_cast<int32_t>(tally_[e]);
    total += tally_[e];
  }
  std::fill(tally_.begin(), tally_.end(), 0);
  if (total == 0) return;
  ProfileScope profile(ctx, ProfileModule::router, ProfilePass::update);
  // Every forward's counts are dead after its backward: the active slot's counts_ carries the step's tally.
  CUDA_CHECK(cudaMemcpyAsync(counts_.data(), counts.data(), E_ * sizeof(int32_t), cudaMemcpyHostToDevice,
                             ctx.stream));
  router_bias_update(counts_.data(), E_, total, gamma_, bias_->data, ctx.stream);
  CUDA_CHECK(cudaStreamSynchronize(ctx.stream));  // `counts` (host) must outlive the copy; once per step
}

}  // namespace fp4moe
