// The step profile of `fp4moe train --profile` (DESIGN.md "Trainer", "Step profile"): the GPU time of one optimizer
// step split by module (the attention core, the MLA projections, the router, ...) and pass (forward, backward,
// recompute, the optimizer's update), measured with CUDA events on the training stream.
//
// How time is attributed. A step is a sequence of boundaries on the stream: the step's start, then one per scope
// opened or closed (ProfileScope below), then the step's end. The time between two consecutive boundaries belongs to
// the innermost scope open between them, so a scope's time is its exclusive time (its nested scopes' time is theirs:
// the MLA scope keeps RoPE, the k assembly and the latent copies, its projections and its core are counted apart);
// time inside no scope belongs to (other, none). Every interval belongs to exactly one (module, pass), so the rows
// of a step sum to its total (first to last boundary) by construction. A boundary is a cudaEventRecord on the stream:
// the time between two is the stream's time, kernels and idle gaps alike (a host synchronisation inside a scope, such
// as the router's read of the expert counts, counts to that scope with the host's work until its next launch).
// Every module runs on the one stream (Group Linear's side streams join it before returning).
//
// Cost. Off (ModelContext::profiler null, or no step open): a ProfileScope tests one pointer; nothing is recorded
// and nothing synchronises. On: two cudaEventRecord per scope; the events are read back once per step, after the
// stream synchronisation that ends the step anyway (StepProfiler::collect), never per module.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace fp4moe {

struct ModelContext;  // trainer/model/context.h

// What is timed, with the field's terms. The names (profile_module_name) are the `module` column of the table.
enum class ProfileModule : uint8_t {
  embedding,       // token embedding gather and its backward (scatter-add of the rows' gradients)
  rmsnorm,         // every RMSNorm: attn_norm, ffn_norm, MLA's q_norm and kv_norm, the final norm
  mla_proj,        // MLA's projections q_down, q_up (or q_proj), kv_down, kv_up, out (Linear: Fprop, Dgrad, Wgrad)
  core_attn,       // the attention core (flash attention forward and backward)
  mla_other,       // the rest of MLA: RoPE, the k assembly, the latent copies, dk split, the FP32 dx cast
  router,          // router GEMM, scores, top-k, expert counts (with the host read of the counts); the v3 bias update
  moe_permute,     // permute (tokens -> expert-ordered rows) and unpermute (weighted top-k sum), both passes
  routed_experts,  // the routed experts' Group Linears fc1, fc2 and their SwiGLU (without permute/unpermute)
  shared_experts,  // the shared experts' SwiGLU MLP
  dense_mlp,       // the dense SwiGLU FFN of the first n_dense_layers layers
  lm_head_loss,    // LM head GEMM with the vocabulary-chunked cross-entropy, forward and backward
  optimizer,       // gradient zeroing, global gradient norm and clip, AdamW
  ep_comm,         // expert-parallel counts, payload quantization, dispatch and combine (over ranks)
  dp_comm,         // the replicated gradients' all-reduce (Model::reduce_gradients, over ranks)
  other,           // what no scope above covers: residual adds, casts between modules, batch uploads, host gaps
  count,
  inherit = 0xFF,  // ProfileScope: the enclosing scope's module
};

enum class ProfilePass : uint8_t {
  forward,
  backward,
  recompute,  // a forward rerun inside backward (trainer/model/recompute.h)
  update,     // the optimizer step
  none,       // outside any pass (only module other)
  count,
  inherit = 0xFF,  // ProfileScope: the enclosing scope's pass (none outside every scope)
};

constexpr size_t kProfileModules = static_cast<size_t>(ProfileModule::count);
constexpr size_t kProfilePasses = static_cast<size_t>(ProfilePass::count);
constexpr size_t kProfileKeys = kProfileModules * kProfilePasses;

// "embedding", "rmsnorm", ..., "other"; "forward", "backward", "recompute", "update", "-". Reject (fp4moe::Error)
// count and inherit.
std::string_view profile_module_name(ProfileModule m);
std::string_view profile_pass_name(ProfilePass p);

// One (module, pass) as an index into a step's arrays: module * kProfilePasses + pass.
constexpr size_t profile_key(ProfileModule m, ProfilePass p) {
  return static_cast<size_t>(m) * kProfilePasses + static_cast<size_t>(p);
}
constexpr ProfileModule profile_key_module(size_t key) { return static_cast<ProfileModule>(key / kProfilePasses); }
constexpr ProfilePass profile_key_pass(size_t key) { return static_cast<ProfilePass>(key % kProfilePasses); }

// One step's times, in milliseconds of the stream, per (module, pass) key.
struct StepTimes {
  std::array<double, kProfileKeys> ms{};     // exclusive time
  std::array<int64_t, kProfileKeys> calls{};  // scopes opened (0 for (other, none): no scope)
  double total_ms = 0;                        // the step: first to last boundary; the sum of ms
};

// The host side of a step's boundaries (no CUDA): which (module, pass) owns the interval after each boundary.
// begin, then open and close in nested order, then end; the boundaries are numbered 0 .. boundaries() - 1 in call
// order. Rejects (fp4moe::Error) open, close or end outside a step, close without an open scope, end with scopes
// open, and begin inside a step unless restart.
class ProfileTimeline {
 public:
  void begin(bool restart = false);
  // Resolves inherit from the enclosing scope (module other and pass none outside every scope).
  void open(ProfileModule m, ProfilePass p);
  void close();
  void end();

  bool in_step() const { return in_step_; }
  size_t depth() const { return stack_.size(); }
  size_t boundaries() const { return owner_.size(); }

  // The step's times from each boundary's time: times_ms[i] in ms since boundary 0, for i < boundaries() (after
  // end). Rejects another count of times and times that decrease (fp4moe::Error naming the boundary).
  StepTimes attribute(std::span<const double> times_ms) const;

 private:
  std::vector<uint16_t> stack_;  // keys of the open scopes, innermost last
  std::vector<uint16_t> owner_;  // per boundary: the key owning the interval after it
  std::array<int64_t, kProfileKeys> calls_{};
  bool in_step_ = false, ended_ = false;
};

// The device side: one cudaEvent per boundary on `stream` (a pool grown at the first steps, kept), around the
// ProfileTimeline. ModelContext::profiler points at one when the run is profiled (Trainer, --profile).
class StepProfiler {
 public:
  explicit StepProfiler(cudaStream_t stream);
  ~StepProfiler();
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  // The step's first boundary. A step left open by an exception is restarted.
  void begin_step();
  // The step's last boundary; rejects (fp4moe::Error) scopes still open.
  void end_step();
  bool in_step() const { return timeline_.in_step(); }
  // After the stream has passed end_step's boundary (the caller's own stream synchronisation; the events are then
  // complete and no wait happens): the step's times from the events. Rejects a step not ended.
  StepTimes collect();

  // ProfileScope's boundaries (inside a step only).
  void open(ProfileModule m, ProfilePass p);
  void close();

 private:
  void record();  // the next boundary's event on the stream

  cudaStream_t stream_;
  ProfileTimeline timeline_;
  std::vector<cudaEvent_t> events_;  // events_[i]: boundary i (the pool; boundaries() of them used this step)
  std::vector<double> times_;
  bool failed_ = false;  // a boundary of this step has no recorded event (collect refuses the step)
};

// RAII: a scope of (module, pass) on ctx's profiler while a step is open; nothing otherwise (one pointer test).
// Usage: ProfileScope s(ctx, ProfileModule::router, ProfilePass::forward); the scope ends with the block. A scope of
// (inherit, inherit) would be its enclosing scope again and records nothing (a Linear that its owner did not tag,
// Linear::set_profile_module). The destructor (or end()) records its boundary and never throws (a CUDA error there
// makes collect() refuse the step).
class ProfileScope {
 public:
  ProfileScope(const ModelContext& ctx, ProfileModule m, ProfilePass p = ProfilePass::inherit);
  ~ProfileScope() { end(); }
  // Ends the scope before the block does (its boundary is recorded now); nothing after the first call.
  void end() noexcept;
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  StepProfiler* profiler_ = nullptr;  // null: off
};

}  // namespace fp4moe
