#include "trainer/model/profile.h"

#include "kernels/common/check.h"
#include "trainer/model/context.h"

namespace fp4moe {

std::string_view profile_module_name(ProfileModule m) {
  switch (m) {
    case ProfileModule::embedding: return "embedding";
    case ProfileModule::rmsnorm: return "rmsnorm";
    case ProfileModule::mla_proj: return "mla_proj";
    case ProfileModule::core_attn: return "core_attn";
    case ProfileModule::mla_other: return "mla_other";
    case ProfileModule::router: return "router";
    case ProfileModule::moe_permute: return "moe_permute";
    case ProfileModule::routed_experts: return "routed_experts";
    case ProfileModule::shared_experts: return "shared_experts";
    case ProfileModule::dense_mlp: return "dense_mlp";
    case ProfileModule::lm_head_loss: return "lm_head_loss";
    case ProfileModule::optimizer: return "optimizer";
    case ProfileModule::ep_comm: return "ep_comm";
    case ProfileModule::dp_comm: return "dp_comm";
    case ProfileModule::other: return "other";
    default: break;
  }
  fail(__FILE__, __LINE__, fmt::format("profile_module_name: {} is not a module", static_cast<int>(m)));
}

std::string_view profile_pass_name(ProfilePass p) {
  switch (p) {
    case ProfilePass::forward: return "forward";
    case ProfilePass::backward: return "backward";
    case ProfilePass::recompute: return "recompute";
    case ProfilePass::update: return "update";
    case ProfilePass::none: return "-";
    default: break;
  }
  fail(__FILE__, __LINE__, fmt::format("profile_pass_name: {} is not a pass", static_cast<int>(p)));
}

// ---- ProfileTimeline ---------------------------------------------------------------------------------------------

void ProfileTimeline::begin(bool restart) {
  FP4MOE_CHECK(!in_step_ || restart, "ProfileTimeline begin: a step is open (end it first)");
  stack_.clear();
  owner_.assign(1, static_cast<uint16_t>(profile_key(ProfileModule::other, ProfilePass::none)));
  calls_.fill(0);
  in_step_ = true;
  ended_ = false;
}

void ProfileTimeline::open(ProfileModule m, ProfilePass p) {
  FP4MOE_CHECK(in_step_, "ProfileTimeline open: no step is open (begin first)");
  const size_t parent = stack_.empty() ? profile_key(ProfileModule::other, ProfilePass::none) : stack_.back();
  if (m == ProfileModule::inherit) m = profile_key_module(parent);
  if (p == ProfilePass::inherit) p = profile_key_pass(parent);
  FP4MOE_CHECK(m < ProfileModule::count && p < ProfilePass::count,
               "ProfileTimeline open: module {} / pass {} out of range", static_cast<int>(m), static_cast<int>(p));
  const auto key = static_cast<uint16_t>(profile_key(m, p));
  stack_.push_back(key);
  owner_.push_back(key);
  ++calls_[key];
}

void ProfileTimeline::close() {
  FP4MOE_CHECK(in_step_ && !stack_.empty(), "ProfileTimeline close: no scope is open");
  stack_.pop_back();
  owner_.push_back(stack_.empty() ? static_cast<uint16_t>(profile_key(ProfileModule::other, ProfilePass::none))
                                  : stack_.back());
}

void ProfileTimeline::end() {
  FP4MOE_CHECK(in_step_, "ProfileTimeline end: no step is open");
  FP4MOE_CHECK(stack_.empty(), "ProfileTimeline end: {} scope(s) still open (the innermost: {} / {})", stack_.size(),
               stack_.empty() ? "" : profile_module_name(profile_key_module(stack_.back())),
               stack_.empty() ? "" : profile_pass_name(profile_key_pass(stack_.back())));
  owner_.push_back(owner_.back());  // the last boundary owns nothing after it
  in_step_ = false;
  ended_ = true;
}

StepTimes ProfileTimeline::attribute(std::span<const double> times_ms) const {
  FP4MOE_CHECK(ended_, "ProfileTimeline attribute: the step has not ended");
  FP4MOE_CHECK(times_ms.size() == owner_.size(), "ProfileTimeline attribute: {} times for {} boundaries",
               times_ms.size(), owner_.size());
  StepTimes t;
  t.calls = calls_;
  for (size_t i = 0; i + 1 < times_ms.size(); ++i) {
    const double dt = times_ms[i + 1] - times_ms[i];
    FP4MOE_CHECK(dt >= 0, "ProfileTimeline attribute: boundary {} at {} ms precedes boundary {} at {} ms", i + 1,
                 times_ms[i + 1], i, times_ms[i]);
    t.ms[owner_[i]] += dt;
  }
  t.total_ms = times_ms.empty() ? 0.0 : times_ms.back() - times_ms.front();
  return t;
}

// ---- StepProfiler ------------------------------------------------------------------------------------------------

StepProfiler::StepProfiler(cudaStream_t stream) : stream_(stream) {}

StepProfiler::~StepProfiler() {
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
}

void StepProfiler::record() {
  const size_t i = timeline_.boundaries() - 1;  // the boundary the timeline just added
  const bool failed_before = failed_;
  failed_ = true;  // until this boundary's event is recorded: one without its event spoils the step's times
  while (events_.size() <= i) {
    cudaEvent_t e = nullptr;
    CUDA_CHECK(cudaEventCreate(&e));
    events_.push_back(e);
  }
  CUDA_CHECK(cudaEventRecord(events_[i], stream_));
  failed_ = failed_before;
}

void StepProfiler::begin_step() {
  timeline_.begin(/*restart=*/true);
  failed_ = false;
  record();
}

void StepProfiler::end_step() {
  timeline_.end();
  record();
}

void StepProfiler::open(ProfileModule m, ProfilePass p) {
  timeline_.open(m, p);
  record();
}

void StepProfiler::close() {
  timeline_.close();
  record();
}

StepTimes StepProfiler::collect() {
  const size_t n = timeline_.boundaries();
  FP4MOE_CHECK(!timeline_.in_step() && n >= 2, "StepProfiler collect: no step has ended (begin_step, end_step)");
  FP4MOE_CHECK(!failed_, "StepProfiler collect: an event of this step could not be recorded");
  CUDA_CHECK(cudaEventSynchronize(events_[n - 1]));  // complete already: the caller synchronised the stream
  times_.assign(n, 0.0);
  for (size_t i = 1; i < n; ++i) {
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, events_[0], events_[i]));
    times_[i] = ms;
  }
  return timeline_.attribute(times_);
}

// ---- ProfileScope ------------------------------------------------------------------------------------------------

ProfileScope::ProfileScope(const ModelContext& ctx, ProfileModule m, ProfilePass p) {
  if (ctx.profiler == nullptr || !ctx.profiler->in_step()) return;
  if (m == ProfileModule::inherit && p == ProfilePass::inherit) return;  // the enclosing scope itself
  ctx.profiler->open(m, p);
  profiler_ = ctx.profiler;
}

void ProfileScope::end() noexcept {
  if (profiler_ == nullptr) return;
  StepProfiler* p = profiler_;
  profiler_ = nullptr;
  try {
    p->close();
  } catch (...) {  // a failed record is remembered: collect() refuses the step
  }
}

}  // namespace fp4moe
