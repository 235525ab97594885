// Recompute inside single layers (trainer/model/mla.h, moe.h, swiglu_mlp.h, rms_norm.h), so that a difference found
// by the model's test (test_recompute_gpu.cpp) points at one layer. Each layer is built twice from the same seeded
// weights (ParamStore::init keys every tensor by its name) and run on the same x and dy, with and without a policy:
//   - MlaAttention (tiny shape: hidden 64, 4 heads, qk 16 + 16, v 16, latents 32; B = 2 rows of T = 64; q_lora 32
//     and 0) under mla_up_proj, core_attn, layernorm (q/kv norms), all three, and full, by itself and after a
//     recompute_forward in an outer scratch scope: y, dx and every grad bitwise equal;
//   - MoeLayer (d 64, E 8, top-2, expert FFN 32, one shared expert, M 256) under moe_act, moe, shared_experts, full
//     and moe + moe_act for the bf16, fp8 and mxfp4 routed recipes and both routers: y, dx, top-k, aux loss and every
//     grad bitwise (under moe the experts rerun from the kept dispatched input: BF16 xs, the FP8 row copy of xs, or
//     its MXFP4 codes and scales);
//   - what MoeLayer keeps under moe and full: the router all it keeps without a policy, the routed experts row_of
//     and the dispatched input in the recipe's format only, the shared experts nothing;
//   - MlaAttention with fp8 projections the same way (backward without x where they do not read it), and what it
//     keeps then (no n_q, n_kv unless mla_up_proj needs them);
//   - SwigluMlp with recompute, bf16, fp8 and mxfp4: bitwise; a kept only with a bf16 fc2;
//   - each layer's scratch high-water mark is exactly what it reports (forward_bytes, backward_bytes, ...);
//   - a backward whose tensors were not kept nor recomputed is rejected (RmsNorm without recompute(), the routed
//     experts under moe out of their recompute's scope), while the router's backward, whose routing is kept, runs
//     outside its forward's scope.
// Run: fp4moe_tests_gpu --gtest_filter='Recompute*'
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tests/common/gpu_test_util.h"
#include "tests/common/nn_test_util.h"
#include "kernels/common/check.h"
#include "kernels/gemm/cublaslt_matmul.h"
#include "kernels/quant/layouts.h"
#include "trainer/config.h"
#include "trainer/memory/device_memory.h"
#include "trainer/memory/scratch.h"
#include "trainer/model/context.h"
#include "trainer/model/mla.h"
#include "trainer/model/moe.h"
#include "trainer/model/params.h"
#include "trainer/model/recompute.h"
#include "trainer/model/rms_norm.h"
#include "trainer/model/swiglu_mlp.h"

namespace fp4moe {
namespace {

// A device, a store and a scratch for one layer; members in destruction-safe order (layer before the memory).
struct Bench {
  DeviceMemory mem;
  CublasLtMatmul lt;
  ParamStore store;
  cudaStream_t stream = nullptr;
  std::unique_ptr<ScratchArena> arena;
  ModelContext ctx;
  Bench() { CUDA_CHECK(cudaStreamCreate(&stream)); }
  ~Bench() {
    cudaStreamSynchronize(stream);
    arena.reset();
    cudaStreamDestroy(stream);
  }
  // After the layer is registered: parameters allocated and seeded, scratch of `bytes`, grads zero.
  void ready(size_t scratch_bytes) {
    store.allocate(mem);
    store.init(7, stream);
    arena = std::make_unique<ScratchArena>(mem, scratch_bytes, "test scratch");
    ctx = ModelContext{stream, &lt, &mem, arena.get()};
    store.zero_grads(stream);
  }
  std::map<std::string, std::vector<float>> grads() {
    CUDA_CHECK(cudaStreamSynchronize(stream));
    std::map<std::string, std::vector<float>> out;
    for (const Param& p : store.params()) {
      auto& g = out[p.name];
      g.resize(p.n);
      CUDA_CHECK(cudaMemcpy(g.data(), p.grad, p.n * sizeof(float), cudaMemcpyDeviceToHost));
    }
    return out;
  }
};

struct Result {
  std::vector<bf16> y, dx;
  std::map<std::string, std::vector<float>> grads;
  std::vector<int32_t> topk;
  float aux = 0;
  size_t high_water = 0;
};

void expect_same(const Result& a, const Result& b) {
  test::expect_bitwise_equal(a.y, b.y, "y");
  test::expect_bitwise_equal(a.dx, b.dx, "dx");
  test::expect_bitwise_equal(a.topk, b.topk, "top-k ids");
  EXPECT_EQ(std::memcmp(&a.aux, &b.aux, sizeof(float)), 0) << "aux loss " << a.aux << " vs " << b.aux;
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (const auto& [name, g] : a.grads) test::expect_bitwise_equal(g, b.grads.at(name), name + " grad");
}

// ---- MlaAttention ------------------------------------------------------------------------------------------------

ModelConfig tiny_mla(int64_t q_lora) {
  ModelConfig c;
  c.hidden = 64;
  c.layers = 2;
  c.heads = 4;
  c.q_lora_rank = q_lora;
  c.kv_lora_rank = 32;
  c.qk_nope_head_dim = 16;
  c.qk_rope_head_dim = 16;
  c.v_head_dim = 16;
  c.rope_theta = 10000.0;
  c.norm_eps = 1e-6;
  return c;
}

Result run_mla(int64_t q_lora, MlaRecompute policy, bool outer_recompute, Recipe recipe = Recipe::bf16) {
  constexpr int64_t T = 64, M = 128;
  const ModelConfig cfg = tiny_mla(q_lora);
  const int64_t d = cfg.hidden;
  Bench b;
  MlaAttention mla(b.store, "attn", cfg, recipe, T, M, b.mem, policy);
  EXPECT_EQ(mla.backward_reads_input(), recipe == Recipe::bf16 || policy.whole || (policy.up_proj && q_lora == 0));
  const bool x_in_backward = mla.backward_reads_input();  // else backward takes x = null
  b.ready(mla.scratch_bytes());
  test::DeviceBuffer<bf16> x(M * d), dy(M * d), y(M * d), dx(M * d);
  x.upload(test::random_bf16(M * d, 21));
  dy.upload(test::random_bf16(M * d, 22));
  y.poison(0xFF);
  dx.poison(0xFF);
  mla.forward(b.ctx, x.ptr, M, y.ptr);
  EXPECT_EQ(b.arena->used(), 0u) << "forward gives back its scratch";
  EXPECT_EQ(b.arena->high_water(), mla.forward_bytes());
  b.arena->reset_high_water();
  if (outer_recompute) {
    ScratchScope outer(*b.arena);
    mla.recompute_forward(b.ctx, x.ptr, M, nullptr);
    EXPECT_EQ(b.arena->used(), mla.recompute_bytes()) << "recompute_forward leaves its tensors in the caller's scope";
    mla.backward(b.ctx, dy.ptr, x_in_backward ? x.ptr : nullptr, M, dx.ptr);
    EXPECT_EQ(b.arena->high_water(), mla.recompute_bytes() + mla.backward_after_recompute_bytes());
  } else {
    mla.backward(b.ctx, dy.ptr, x_in_backward ? x.ptr : nullptr, M, dx.ptr);
    EXPECT_EQ(b.arena->high_water(), mla.backward_bytes());
  }
  EXPECT_EQ(b.arena->used(), 0u);
  Result r;
  r.grads = b.grads();
  r.y = y.download();
  r.dx = dx.download();
  return r;
}

TEST(RecomputeMla, EveryPolicyGivesBitwiseTheSameOutputAndGradients) {
  FP4MOE_REQUIRE_DEVICE();
  const std::vector<std::pair<std::string, MlaRecompute>> policies = {
      {"mla_up_proj", {true, false, false, false}},
      {"core_attn", {false, true, false, false}},
      {"layernorm", {false, false, true, false}},
      {"mla_up_proj core_attn layernorm", {true, true, true, false}},
      {"full", {true, true, true, true}}};
  for (const int64_t q_lora : {int64_t{32}, int64_t{0}}) {
    const Result ref = run_mla(q_lora, {}, false);
    for (const auto& [name, p] : policies)
      for (const bool outer : {false, true}) {
        SCOPED_TRACE(name + (outer ? ", after recompute_forward" : "") + ", q_lora " + std::to_string(q_lora));
        expect_same(ref, run_mla(q_lora, p, outer));
      }
  }
}

// fp8 projections (Linear through Group Linear): the same rebuilt tensors, bitwise, and backward without x where the
// projections do not read it.
TEST(RecomputeMla, Fp8ProjectionsEveryPolicyGivesBitwiseTheSameOutputAndGradients) {
  FP4MOE_REQUIRE_DEVICE();
  const std::vector<std::pair<std::string, MlaRecompute>> policies = {
      {"mla_up_proj", {true, false, false, false}},
      {"core_attn", {false, true, false, false}},
      {"layernorm", {false, false, true, false}},
      {"full", {true, true, true, true}}};
  for (const int64_t q_lora : {int64_t{32}, int64_t{0}}) {
    const Result ref = run_mla(q_lora, {}, false, Recipe::fp8);
    for (const auto& [name, p] : policies)
      for (const bool outer : {false, true}) {
        SCOPED_TRACE(name + (outer ? ", after recompute_forward" : "") + ", q_lora " + std::to_string(q_lora));
        expect_same(ref, run_mla(q_lora, p, outer, Recipe::fp8));
      }
  }
}

TEST(RecomputeMla, KeepsLessUnderEachPolicy) {
  FP4MOE_REQUIRE_DEVICE();
  auto kept = [](MlaRecompute p) {
    Bench b;
    MlaAttention mla(b.store, "attn", tiny_mla(32), Recipe::bf16, 64, 128, b.mem, p);
    EXPECT_EQ(mla.kept_bytes(), b.mem.current(MemCategory::activations));
    return mla.kept_bytes();
  };
  const size_t none = kept({});
  {  // fp8 q_up and kv_up read their own copies: n_q and n_kv are not kept (unless a q/kv recompute needs them)
    Bench b;
    MlaAttention bf(b.store, "bf", tiny_mla(32), Recipe::bf16, 64, 128, b.mem, {});
    MlaAttention f8(b.store, "f8", tiny_mla(32), Recipe::fp8, 64, 128, b.mem, {});
    MlaAttention f8_up(b.store, "f8_up", tiny_mla(32), Recipe::fp8, 64, 128, b.mem, {true, false, false, false});
    MlaAttention bf_up(b.store, "bf_up", tiny_mla(32), Recipe::bf16, 64, 128, b.mem, {true, false, false, false});
    const size_t n = ScratchArena::rounded(128 * 32 * sizeof(bf16));  // n_q or n_kv: 128 tokens x 32
    EXPECT_EQ(bf.kept_bytes() - f8.kept_bytes(), 2 * n);
    EXPECT_EQ(bf.kept_norm_bytes() - f8.kept_norm_bytes(), 2 * n);
    EXPECT_EQ(f8_up.kept_bytes(), bf_up.kept_bytes());
  }
  EXPECT_LT(kept({true, false, false, false}), none);
  EXPECT_LT(kept({false, true, false, false}), none);
  EXPECT_LT(kept({false, false, true, false}), none);
  EXPECT_EQ(kept({true, true, true, true}), 0u);
}

// ---- MoeLayer ----------------------------------------------------------------------------------------------------

constexpr int64_t kD = 64, kE = 8, kK = 2, kF = 32, kMaxTokens = 256;

TrainerConfig tiny_moe(RouterStyle style, Recipe routed, std::vector<std::string> modules) {
  TrainerConfig c;
  c.model.hidden = kD;
  c.model.layers = 2;
  c.moe.routed_experts = kE;
  c.moe.shared_experts = 1;
  c.moe.top_k = kK;
  c.moe.expert_ffn = kF;
  c.moe.router = style;
  c.moe.routed_scale = 2.5;
  c.moe.aux_alpha = style == RouterStyle::v2_softmax ? 0.01 : 0.0;
  c.recipe.routed_experts = routed;
  c.recompute.modules = std::move(modules);
  return c;
}

Result run_moe(const TrainerConfig& cfg) {
  const int64_t M = kMaxTokens;
  Bench b;
  MoeLayer layer(b.store, "layers.1.moe", cfg, kMaxTokens, b.mem);
  b.ready(layer.scratch_bytes());
  test::DeviceBuffer<bf16> x(M * kD), dy(M * kD), y(M * kD), dx(M * kD);
  x.upload(test::random_bf16(M * kD, 31));
  dy.upload(test::random_bf16(M * kD, 32));
  y.poison(0xFF);
  dx.poison(0xFF);
  layer.forward(b.ctx, x.ptr, M, y.ptr);
  Result r;
  r.aux = layer.aux_loss_host();
  EXPECT_EQ(b.arena->high_water(), layer.forward_bytes());
  b.arena->reset_high_water();
  layer.backward(b.ctx, dy.ptr, x.ptr, M, dx.ptr);
  EXPECT_EQ(b.arena->high_water(), layer.backward_bytes());
  EXPECT_EQ(b.arena->used(), 0u);
  r.grads = b.grads();
  r.y = y.download();
  r.dx = dx.download();
  r.topk.resize(M * kK);
  CUDA_CHECK(cudaMemcpy(r.topk.data(), layer.topk_idx(), r.topk.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
  return r;
}

TEST(RecomputeMoe, EveryPolicyGivesBitwiseTheSameOutputAndGradients) {
  FP4MOE_REQUIRE_DEVICE();
  const std::vector<std::vector<std::string>> policies = {
      {"moe_act"}, {"moe"}, {"shared_experts"}, {"full"}, {"moe_act", "shared_experts"}, {"moe", "moe_act"}};
  for (const RouterStyle style : {RouterStyle::v3_sigmoid, RouterStyle::v2_softmax})
    for (const Recipe routed : {Recipe::bf16, Recipe::fp8, Recipe::mxfp4}) {
      const Result ref = run_moe(tiny_moe(style, routed, {}));
      for (const auto& p : policies) {
        std::string name;
        for (const auto& m : p) name += m + " ";
        SCOPED_TRACE(name + "| " + router_style_name(style) + " | routed " + recipe_name(routed));
        expect_same(ref, run_moe(tiny_moe(style, routed, p)));
      }
    }
}

TEST(RecomputeMoe, KeptBytesAreTheActivationCategory) {
  FP4MOE_REQUIRE_DEVICE();
  for (const Recipe routed : {Recipe::bf16, Recipe::fp8, Recipe::mxfp4})
    for (const auto& p :
         std::vector<std::vector<std::string>>{{}, {"moe_act"}, {"moe"}, {"shared_experts"}, {"full"}}) {
      SCOPED_TRACE(std::string(recipe_name(routed)) + " " + (p.empty() ? "none" : p[0]));
      Bench b;
      MoeLayer layer(b.store, "layers.1.moe", tiny_moe(RouterStyle::v3_sigmoid, routed, p), kMaxTokens, b.mem);
      EXPECT_EQ(layer.kept_bytes(), b.mem.current(MemCategory::activations));
      EXPECT_EQ(b.mem.current(MemCategory::workspace), 0u) << "no per-layer scratch: it all comes from the arena";
    }
}

// Under moe (and full) the block keeps the routing and the routed experts' permutation and dispatched input, in the
// routed recipe's storage format, and nothing else (R = 512 rows of d = 64, each buffer rounded to 256 bytes).
TEST(RecomputeMoe, MoeKeepsTheRoutingAndTheDispatchedInputInTheRecipesFormat) {
  FP4MOE_REQUIRE_DEVICE();
  constexpr int64_t R = kMaxTokens * kK;
  auto r = [](int64_t bytes) { return ScratchArena::rounded(static_cast<size_t>(bytes)); };
  const size_t row_of = r(4 * R);
  const struct {
    Recipe recipe;
    size_t experts;
  } cases[] = {{Recipe::bf16, row_of + r(2 * R * kD)},
               {Recipe::fp8, row_of + r(R * kD) + r(4 * fp8_row_scale_count(R, kD))},
               {Recipe::mxfp4, row_of + r(R * kD / 2) + r(R * kD / kMxBlock)}};
  for (const auto& c : cases)
    for (const auto& policy : std::vector<std::vector<std::string>>{{"moe"}, {"full"}}) {
      SCOPED_TRACE(std::string(recipe_name(c.recipe)) + " " + policy[0]);
      Bench b;
      MoeLayer none(b.store, "layers.1.moe", tiny_moe(RouterStyle::v3_sigmoid, c.recipe, {}), kMaxTokens, b.mem);
      MoeLayer moe(b.store, "layers.2.moe", tiny_moe(RouterStyle::v3_sigmoid, c.recipe, policy), kMaxTokens, b.mem);
      EXPECT_TRUE(moe.recompute().whole);
      EXPECT_EQ(moe.router().kept_bytes(), none.router().kept_bytes()) << "the router does not rerun";
      EXPECT_EQ(moe.experts().kept_bytes(), c.experts);
      EXPECT_LT(moe.experts().kept_bytes(), none.experts().kept_bytes());
      ASSERT_NE(moe.shared(), nullptr);
      EXPECT_EQ(moe.shared()->kept_bytes(), 0u) << "the shared experts rerun under moe";
      EXPECT_EQ(moe.kept_bytes(), moe.router().kept_bytes() + c.experts);
      EXPECT_GT(moe.experts().recompute_bytes(), 0u) << "h, a and ys are rebuilt in the scratch";
    }
}

// ---- SwigluMlp and RmsNorm ---------------------------------------------------------------------------------------

Result run_mlp(bool recompute, Recipe recipe = Recipe::bf16) {
  const int64_t M = kMaxTokens;
  Bench b;
  SwigluMlp mlp(b.store, "layers.0.mlp", kD, 128, recipe, kMaxTokens, b.mem, 0.01f, recompute);
  b.ready(mlp.scratch_bytes());
  EXPECT_EQ(b.mem.current(MemCategory::activations), mlp.kept_bytes());
  EXPECT_EQ(mlp.kept_bytes() == 0, recompute);
  const size_t h_bytes = ScratchArena::rounded(M * 2 * 128 * sizeof(bf16));
  if (!recompute) {
    EXPECT_EQ(mlp.kept_bytes(), h_bytes + (recipe == Recipe::bf16 ? h_bytes / 2 : 0)) << "h (and a)";
  }
  EXPECT_EQ(mlp.backward_reads_input(), recompute || recipe == Recipe::bf16);
  test::DeviceBuffer<bf16> x(M * kD), dy(M * kD), y(M * kD), dx(M * kD);
  x.upload(test::random_bf16(M * kD, 41));
  dy.upload(test::random_bf16(M * kD, 42));
  y.poison(0xFF);
  dx.poison(0xFF);
  mlp.forward(b.ctx, x.ptr, M, y.ptr);
  EXPECT_EQ(b.arena->high_water(), mlp.forward_bytes());
  mlp.backward(b.ctx, dy.ptr, mlp.backward_reads_input() ? x.ptr : nullptr, M, dx.ptr);
  EXPECT_EQ(b.arena->high_water(), mlp.backward_bytes());
  Result r;
  r.grads = b.grads();
  r.y = y.download();
  r.dx = dx.download();
  return r;
}

TEST(RecomputeMlp, RecomputeGivesBitwiseTheSameOutputAndGradients) {
  FP4MOE_REQUIRE_DEVICE();
  for (const Recipe recipe : {Recipe::bf16, Recipe::fp8, Recipe::mxfp4}) {
    SCOPED_TRACE(recipe_name(recipe));
    expect_same(run_mlp(false, recipe), run_mlp(true, recipe));
  }
}

TEST(RecomputeNorm, BackwardNeedsARecomputeInAnOpenScopeWithoutKeptRstd) {
  FP4MOE_REQUIRE_DEVICE();
  constexpr int64_t M = 64, C = 32;
  Bench b;
  RmsNorm kept(b.store, "kept", C, 1e-6f, M, b.mem, true);
  RmsNorm dropped(b.store, "dropped", C, 1e-6f, M, b.mem, false);
  EXPECT_EQ(kept.kept_bytes(), ScratchArena::rounded(M * sizeof(float)));
  EXPECT_EQ(dropped.kept_bytes(), 0u);
  b.ready(dropped.recompute_bytes() + dropped.backward_bytes());
  test::DeviceBuffer<bf16> x(M * C), dy(M * C), y1(M * C), y2(M * C), dx1(M * C), dx2(M * C);
  x.upload(test::random_bf16(M * C, 51));
  dy.upload(test::random_bf16(M * C, 52));
  kept.forward(b.ctx, x.ptr, M, y1.ptr);
  dropped.forward(b.ctx, x.ptr, M, y2.ptr);
  EXPECT_THROW(dropped.backward(b.ctx, dy.ptr, x.ptr, M, dx2.ptr), Error) << "no rstd: a recompute must come first";
  {
    ScratchScope scope(*b.arena);
    dropped.recompute(b.ctx, x.ptr, M, y2.ptr);
    dropped.backward(b.ctx, dy.ptr, x.ptr, M, dx2.ptr);
  }
  EXPECT_THROW(dropped.backward(b.ctx, dy.ptr, x.ptr, M, dx2.ptr), Error) << "the recompute's scope has ended";
  kept.backward(b.ctx, dy.ptr, x.ptr, M, dx1.ptr);
  test::expect_bitwise_equal(y1.download(), y2.download(), "y");
  test::expect_bitwise_equal(dx1.download(), dx2.download(), "dx");
  const auto g = b.grads();
  test::expect_bitwise_equal(g.at("kept"), g.at("dropped"), "weight grad");
}

// The parts of MoeLayer under moe: the routed experts need their recompute in the backward's scope (after the
// forward's scope has ended, their h, a and ys are gone), the router none (its routing is kept).
TEST(RecomputeMoe, BackwardOutsideTheForwardsScopeIsRejectedByTheExperts) {
  FP4MOE_REQUIRE_DEVICE();
  const int64_t M = 64;
  for (const Recipe recipe : {Recipe::bf16, Recipe::fp8, Recipe::mxfp4}) {
    SCOPED_TRACE(recipe_name(recipe));
    Bench b;
    const TrainerConfig cfg = tiny_moe(RouterStyle::v3_sigmoid, recipe, {"moe"});
    const MoeRecompute policy = layer_recompute(cfg.recompute).moe;
    ASSERT_TRUE(policy.whole);
    MoeRouter router(b.store, "r", cfg, M, b.mem);
    MoeRoutedExperts experts(b.store, "r", kE, kD, kF, kK, recipe, 0.01f, M, b.mem, policy);
    b.ready(router.forward_bytes() + experts.forward_bytes() + experts.recompute_bytes() + experts.backward_bytes() +
            router.backward_bytes());
    test::DeviceBuffer<bf16> x(M * kD), dy(M * kD), y(M * kD), dx(M * kD);
    test::DeviceBuffer<float> dweights(M * kK), dx32(M * kD);
    x.upload(test::random_bf16(M * kD, 61));
    dy.upload(test::random_bf16(M * kD, 62));
    CUDA_CHECK(cudaMemset(dx32.ptr, 0, dx32.n * sizeof(float)));
    {
      ScratchScope scope(*b.arena);
      router.forward(b.ctx, x.ptr, M);
      experts.forward(b.ctx, x.ptr, router.routing(), y.ptr);
      EXPECT_TRUE(experts.ready(*b.arena));
    }
    EXPECT_FALSE(experts.ready(*b.arena));
    EXPECT_THROW(experts.backward(b.ctx, dy.ptr, router.routing(), dx.ptr, dweights.ptr), Error);
    {
      ScratchScope scope(*b.arena);
      experts.recompute(b.ctx, router.routing());
      EXPECT_EQ(b.arena->used(), experts.recompute_bytes()) << "the recompute leaves h, a and ys in the caller's scope";
      experts.backward(b.ctx, dy.ptr, router.routing(), dx.ptr, dweights.ptr);  // accepted in the recompute's scope
    }
    router.backward(b.ctx, dweights.ptr, x.ptr, M, 1.0f, dx32.ptr);  // no scope needed: the routing is kept
    CUDA_CHECK(cudaStreamSynchronize(b.stream));
  }
}

}  // namespace
}  // namespace fp4moe
