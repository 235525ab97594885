// Recompute policies of the whole model (trainer/model/recompute.h, model.h) on configs/tiny.toml's shapes (2 layers:
// one dense, one MoE with 8 routed experts top-2 and a shared expert; B = 4 rows of T = 64 tokens, the micro-batch):
//   - one forward_backward from the same weights and batch gives bitwise the same loss, every parameter gradient and
//     (after end_step) the v3 router bias with and without each policy (mla_up_proj, core_attn, layernorm, moe_act,
//     moe, mlp, shared_experts, full) and the combinations {core_attn, layernorm, moe} and {moe_act, mla_up_proj};
//     the forward-only loss too; the v2 router (balance loss) under moe and full; the mxfp4 and fp8 routed recipes
//     under moe_act, moe, full and paper 1's heavy policy core_attn + layernorm + moe (the experts rerun from the
//     kept MXFP4 codes or FP8 row copy of their dispatched input, the router's input x from ffn_norm's rerun);
//   - the shared scratch is sized exactly: after a forward_backward at the full micro-batch its high-water mark
//     equals its capacity (the largest call the layers reported), under every policy;
//   - the activation category shrinks with each policy, strictly along the chain none > core_attn > + layernorm >
//     + mla_up_proj > + moe_act > + shared_experts > + moe > + mlp > full, on tiny and small, and each policy alone
//     keeps less than none; Model::layer_memory's kept bytes plus head_activation_bytes are the category exactly,
//     and the modules a policy names lose exactly their tensors (tiny; under moe and full the MoE block keeps its
//     routing, row_of and dispatched input); under moe the routed experts keep mxfp4 < bf16 < fp8 (fp8: its FP8 row
//     copy of xs, beside Group Linear's column copy counted in quantized_copies);
//   - fp8/mxfp4 projections: bitwise under every policy too; the layer keeps no BF16 copy of what their Linears keep
//     (a_in, n_q, n_kv, the dense f_in and a, the shared a), and after a step the category is the kept bytes plus
//     LayerMemory::quantized_copies;
//   - the workspace category does not grow with the layer count (one arena, sized to the largest layer).
// Run: fp4moe_tests_gpu --gtest_filter='Recompute*'
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "tests/common/gpu_test_util.h"
#include "kernels/nn/cross_entropy.h"
#include "kernels/quant/layouts.h"
#include "tests/common/trainer_test_util.h"
#include "trainer/config.h"
#include "trainer/memory/device_memory.h"
#include "trainer/memory/scratch.h"
#include "trainer/model/model.h"

namespace fp4moe {
namespace {

using Modules = std::vector<std::string>;

std::string label(const Modules& m) {
  std::string s;
  for (const auto& x : m) s += (s.empty() ? "" : " ") + x;
  return s.empty() ? "none" : s;
}

// configs/<name>.toml from this source tree, else from the working directory (the repository root).
std::string preset_path(const std::string& name) {
  const std::string p = test::preset(name);
  return std::filesystem::exists(p) ? p : "configs/" + name + ".toml";
}

TrainerConfig config_with(const std::string& preset, const Modules& modules, const Modules& extra = {}) {
  std::vector<std::string> args = {"--config", preset_path(preset)};
  args.insert(args.end(), extra.begin(), extra.end());
  TrainerConfig cfg = parse_config_args(args);
  cfg.recompute.modules = modules;
  validate_config(cfg);
  return cfg;
}

// What one forward_backward (and end_step) left, downloaded.
struct Outcome {
  float eval_loss = 0, loss = 0, aux = 0;
  std::vector<std::vector<float>> grads, states;
  std::vector<std::string> names;
  size_t scratch_high = 0, scratch_capacity = 0;
};

Outcome run_tiny(const TrainerConfig& cfg) {
  const int64_t B = cfg.train.micro_batch, T = cfg.train.seq_len, M = B * T;
  std::vector<int32_t> tokens(M), targets(M);
  std::mt19937 rng(5);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % 32);
  for (int64_t m = 0; m < M; ++m) targets[m] = (m + 1) % T == 0 ? kIgnoreIndex : tokens[m + 1];
  test::DeviceBuffer<int32_t> tok_d(M), tgt_d(M);
  tok_d.upload(tokens);
  tgt_d.upload(targets);

  Outcome out;
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreate(&stream));
  {
    DeviceMemory mem;
    Model model(cfg, mem, stream);
    model.init_weights(cfg.train.seed);
    out.eval_loss = model.forward(tok_d.ptr, tgt_d.ptr, B).loss;
    model.params().zero_grads(stream);
    const StepStats s = model.forward_backward(tok_d.ptr, tgt_d.ptr, B, 1.0f);
    out.loss = s.loss;
    out.aux = s.aux_loss;
    model.end_step();
    CUDA_CHECK(cudaStreamSynchronize(stream));
    for (const Param& p : model.params().params()) {
      out.names.push_back(p.name);
      out.grads.emplace_back(p.n);
      CUDA_CHECK(cudaMemcpy(out.grads.back().data(), p.grad, p.n * sizeof(float), cudaMemcpyDeviceToHost));
    }
    for (const StateTensor& st : model.params().states()) {
      out.states.emplace_back(st.n);
      CUDA_CHECK(cudaMemcpy(out.states.back().data(), st.data, st.n * sizeof(float), cudaMemcpyDeviceToHost));
    }
    out.scratch_high = model.scratch().high_water();
    out.scratch_capacity = model.scratch().capacity();
  }
  cudaStreamDestroy(stream);
  return out;
}

void expect_same(const Outcome& ref, const Outcome& got) {
  EXPECT_EQ(std::memcmp(&ref.eval_loss, &got.eval_loss, sizeof(float)), 0) << ref.eval_loss << " vs " << got.eval_loss;
  EXPECT_EQ(std::memcmp(&ref.loss, &got.loss, sizeof(float)), 0) << ref.loss << " vs " << got.loss;
  EXPECT_EQ(std::memcmp(&ref.aux, &got.aux, sizeof(float)), 0) << ref.aux << " vs " << got.aux;
  ASSERT_EQ(ref.grads.size(), got.grads.size());
  for (size_t i = 0; i < ref.grads.size(); ++i) {
    SCOPED_TRACE(ref.names[i]);
    ASSERT_EQ(ref.grads[i].size(), got.grads[i].size());
    size_t differ = 0, first = 0;
    for (size_t j = 0; j < ref.grads[i].size(); ++j)
      if (std::memcmp(&ref.grads[i][j], &got.grads[i][j], sizeof(float)) != 0 && differ++ == 0) first = j;
    EXPECT_EQ(differ, 0u) << differ << " gradient elements differ, first at " << first << ": "
                          << (differ ? ref.grads[i][first] : 0.0f) << " vs " << (differ ? got.grads[i][first] : 0.0f);
  }
  ASSERT_EQ(ref.states.size(), got.states.size());
  for (size_t i = 0; i < ref.states.size(); ++i)
    EXPECT_EQ(std::memcmp(ref.states[i].data(), got.states[i].data(), ref.states[i].size() * sizeof(float)), 0)
        << "state tensor " << i << " (router bias after end_step)";
  EXPECT_EQ(got.scratch_high, got.scratch_capacity) << "the arena is sized to the largest call, which must run";
}

// Every policy in `policies` against none, on tiny with `extra` options.
void check_policies(const Modules& extra, const std::vector<Modules>& policies) {
  const Outcome ref = run_tiny(config_with("tiny", {}, extra));
  EXPECT_EQ(ref.scratch_high, ref.scratch_capacity);
  for (const Modules& p : policies) {
    SCOPED_TRACE("recompute: " + label(p));
    expect_same(ref, run_tiny(config_with("tiny", p, extra)));
  }
}

const std::vector<Modules> kEveryPolicy = {
    {"mla_up_proj"}, {"core_attn"},      {"layernorm"}, {"moe_act"},
    {"moe"},         {"mlp"},            {"shared_experts"},
    {"full"},        {"core_attn", "layernorm", "moe"}, {"moe_act", "mla_up_proj"}};

TEST(Recompute, GradientsAreBitwiseTheSameUnderEveryPolicy) {
  FP4MOE_REQUIRE_DEVICE();
  check_policies({}, kEveryPolicy);
}

TEST(Recompute, V2RouterBalanceLossUnderMoeAndFull) {
  FP4MOE_REQUIRE_DEVICE();
  check_policies({"--moe.router", "v2", "--moe.aux_alpha", "0.01"},
                 {{"moe"}, {"full"}, {"moe_act"}, {"layernorm", "moe"}});
}

TEST(Recompute, Mxfp4RoutedExpertsRecomputeTheSameCodes) {
  FP4MOE_REQUIRE_DEVICE();
  check_policies({"--recipe.routed_experts", "mxfp4"}, {{"moe_act"},
                                                        {"moe"},
                                                        {"full"},
                                                        {"moe_act", "mla_up_proj"},
                                                        {"core_attn", "layernorm", "moe"},
                                                        {"moe", "moe_act"}});
}

TEST(Recompute, Fp8RoutedExperts) {
  FP4MOE_REQUIRE_DEVICE();
  check_policies({"--recipe.routed_experts", "fp8"},
                 {{"moe_act"}, {"moe"}, {"full"}, {"core_attn", "layernorm", "moe"}, {"moe", "moe_act"}});
}

// Dense projections through Group Linear (fp8 attention and dense FFN, mxfp4 shared and routed experts): their
// own FP8/MXFP4 copies of X are made again by a recomputed forward, bit for bit.
TEST(Recompute, QuantizedDenseRecipes) {
  FP4MOE_REQUIRE_DEVICE();
  check_policies({"--recipe.attention", "fp8", "--recipe.dense_mlp", "fp8", "--recipe.shared_experts", "mxfp4",
                  "--recipe.routed_experts", "mxfp4"},
                 {{"mla_up_proj"}, {"core_attn"}, {"layernorm"}, {"mlp"}, {"shared_experts"}, {"moe"}, {"full"},
                  {"core_attn", "layernorm", "moe"}});
}

// ---- memory ------------------------------------------------------------------------------------------------------

struct Measured {
  size_t activations = 0, workspace = 0, head = 0;
  std::vector<LayerMemory> layers;
};

Measured measure(const TrainerConfig& cfg) {
  Measured m;
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreate(&stream));
  {
    DeviceMemory mem;
    Model model(cfg, mem, stream);
    m.activations = mem.current(MemCategory::activations);
    m.workspace = mem.current(MemCategory::workspace);
    m.layers = model.layer_memory();
    m.head = model.head_activation_bytes();
  }
  cudaStreamDestroy(stream);
  return m;
}

size_t kept_sum(const Measured& m) {
  size_t s = m.head;
  for (const LayerMemory& l : m.layers) s += l.kept();
  return s;
}

void check_order(const std::string& preset) {
  const std::vector<Modules> chain = {
      {},
      {"core_attn"},
      {"core_attn", "layernorm"},
      {"core_attn", "layernorm", "mla_up_proj"},
      {"core_attn", "layernorm", "mla_up_proj", "moe_act"},
      {"core_attn", "layernorm", "mla_up_proj", "moe_act", "shared_experts"},
      {"core_attn", "layernorm", "mla_up_proj", "moe_act", "shared_experts", "moe"},
      {"core_attn", "layernorm", "mla_up_proj", "moe_act", "shared_experts", "moe", "mlp"},
      {"full"}};
  size_t previous = 0;
  for (size_t i = 0; i < chain.size(); ++i) {
    SCOPED_TRACE(preset + ", recompute: " + label(chain[i]));
    const Measured m = measure(config_with(preset, chain[i]));
    EXPECT_EQ(kept_sum(m), m.activations) << "layer_memory + head_activation_bytes must be the category";
    std::printf("  %-6s %-70s activations %10.3f MiB  workspace %9.3f MiB\n", preset.c_str(), label(chain[i]).c_str(),
                m.activations / 1048576.0, m.workspace / 1048576.0);
    if (i > 0) {
      EXPECT_LT(m.activations, previous) << "each step of the chain must keep less";
    }
    previous = m.activations;
  }
  const size_t none = measure(config_with(preset, {})).activations;
  for (const char* single : {"mla_up_proj", "core_attn", "layernorm", "moe_act", "moe", "mlp", "shared_experts"}) {
    SCOPED_TRACE(preset + ", recompute: " + std::string(single));
    EXPECT_LT(measure(config_with(preset, {single})).activations, none);
  }
}

TEST(Recompute, ActivationsShrinkWithEachPolicyTiny) {
  FP4MOE_REQUIRE_DEVICE();
  check_order("tiny");
}

TEST(Recompute, ActivationsShrinkWithEachPolicySmall) {
  FP4MOE_REQUIRE_DEVICE();
  check_order("small");
}

// tiny: d 64, H 4, dv 16, dqk 32, E 8, top-2, expert FFN 32, 1 shared expert, dense FFN 128; M = 4 x 64 tokens.
TEST(Recompute, EachPolicyDropsExactlyItsTensorsTiny) {
  FP4MOE_REQUIRE_DEVICE();
  const TrainerConfig base = config_with("tiny", {});
  const int64_t M = base.train.micro_batch * base.train.seq_len, d = base.model.hidden, H = base.model.heads;
  const int64_t dv = base.model.v_head_dim, f = base.moe.expert_ffn, k = base.moe.top_k, E = base.moe.routed_experts;
  const int64_t fs = base.moe.shared_experts * f;
  auto r = [](int64_t bytes) { return ScratchArena::rounded(static_cast<size_t>(bytes)); };
  const Measured none = measure(base);
  ASSERT_EQ(none.layers.size(), 2u);
  ASSERT_FALSE(none.layers[0].moe);
  ASSERT_TRUE(none.layers[1].moe);
  for (const LayerMemory& l : none.layers) {
    EXPECT_EQ(l.residual, 2 * r(2 * M * d)) << "h[l] and h_mid";
    EXPECT_GT(l.norms, 0u);
    EXPECT_GT(l.attn, 0u);
    EXPECT_GT(l.ffn, 0u);
  }

  const Measured core = measure(config_with("tiny", {"core_attn"}));
  for (size_t l = 0; l < 2; ++l)
    EXPECT_EQ(none.layers[l].attn - core.layers[l].attn, r(2 * M * H * dv) + r(4 * M * H)) << "o and lse";

  const Measured ln = measure(config_with("tiny", {"layernorm"}));
  for (size_t l = 0; l < 2; ++l) {
    EXPECT_EQ(ln.layers[l].norms, 0u);
    EXPECT_EQ(ln.layers[l].attn, none.layers[l].attn);
    EXPECT_EQ(ln.layers[l].ffn, none.layers[l].ffn);
  }

  const Measured act = measure(config_with("tiny", {"moe_act"}));
  EXPECT_EQ(none.layers[1].routed_experts - act.layers[1].routed_experts, r(2 * M * k * f)) << "a (BF16)";
  EXPECT_EQ(act.layers[0].ffn, none.layers[0].ffn) << "the dense FFN keeps its own";

  const Measured shared = measure(config_with("tiny", {"shared_experts"}));
  EXPECT_EQ(none.layers[1].ffn - shared.layers[1].ffn, r(2 * M * 2 * fs) + r(2 * M * fs)) << "shared h and a";

  const Measured mlp = measure(config_with("tiny", {"mlp"}));
  EXPECT_EQ(mlp.layers[0].ffn, 0u);
  EXPECT_EQ(mlp.layers[1].ffn, none.layers[1].ffn);

  // moe: the router keeps all (probs, topk_idx, topk_weight, counts, offsets, aux), the routed experts row_of and
  // the BF16 dispatched input xs, the shared experts nothing.
  const Measured moe = measure(config_with("tiny", {"moe"}));
  const size_t router = r(4 * M * E) + 2 * r(4 * M * k) + r(4 * E) + r(4 * (E + 1)) + r(4);
  const size_t dispatched = r(4 * M * k) + r(2 * M * k * d);  // row_of, xs
  EXPECT_EQ(moe.layers[1].routed_experts, dispatched);
  EXPECT_EQ(moe.layers[1].ffn, router + dispatched);
  EXPECT_EQ(none.layers[1].ffn - moe.layers[1].ffn,
            r(2 * M * k * 2 * f) + r(2 * M * k * f) + r(2 * M * k * d) + r(2 * M * 2 * fs) + r(2 * M * fs))
      << "the routed experts' h, a, ys and the shared experts' h, a";
  EXPECT_EQ(moe.layers[1].norms, none.layers[1].norms) << "the block input f_in stays (no layernorm)";

  const Measured full = measure(config_with("tiny", {"full"}));
  for (size_t l = 0; l < 2; ++l) {
    SCOPED_TRACE("layer " + std::to_string(l));
    EXPECT_EQ(full.layers[l].residual, r(2 * M * d)) << "only the layer input";
    EXPECT_EQ(full.layers[l].norms, 0u);
    EXPECT_EQ(full.layers[l].attn, 0u);
    EXPECT_EQ(full.layers[l].ffn, l == 0 ? 0u : router + dispatched) << "the MoE block keeps what it keeps under moe";
    EXPECT_GT(full.layers[l].scratch_backward, none.layers[l].scratch_backward) << "full rebuilds the layer there";
  }
  EXPECT_EQ(full.head, none.head);
}

// Under moe the routed experts keep their dispatched input in the routed recipe's format (tiny: R = 512 rows of
// d = 64): MXFP4 codes + scales < BF16 xs < the FP8 row copy plus, in Group Linear (quantized_copies), fc1's FP8
// column copy that its Wgrad reads; the other layers' bytes do not depend on the routed recipe.
TEST(Recompute, MoePolicyKeepsTheDispatchedInputInTheRoutedRecipesFormat) {
  FP4MOE_REQUIRE_DEVICE();
  const TrainerConfig base = config_with("tiny", {});
  const int64_t R = base.train.micro_batch * base.train.seq_len * base.moe.top_k, d = base.model.hidden;
  auto r = [](int64_t bytes) { return ScratchArena::rounded(static_cast<size_t>(bytes)); };
  const Measured bf = measure(config_with("tiny", {"moe"}));
  const Measured f8 = measure(config_with("tiny", {"moe"}, {"--recipe.routed_experts", "fp8"}));
  const Measured mx = measure(config_with("tiny", {"moe"}, {"--recipe.routed_experts", "mxfp4"}));
  EXPECT_EQ(bf.layers[1].routed_experts, r(4 * R) + r(2 * R * d));
  EXPECT_EQ(f8.layers[1].routed_experts, r(4 * R) + r(R * d) + r(4 * fp8_row_scale_count(R, d)));
  EXPECT_EQ(mx.layers[1].routed_experts, r(4 * R) + r(R * d / 2) + r(R * d / kMxBlock));
  EXPECT_LT(mx.layers[1].routed_experts, bf.layers[1].routed_experts);
  EXPECT_LT(bf.layers[1].routed_experts, f8.layers[1].routed_experts + f8.layers[1].quantized_copies);
  for (const Measured* m : {&f8, &mx}) {
    EXPECT_EQ(m->layers[1].ffn - m->layers[1].routed_experts, bf.layers[1].ffn - bf.layers[1].routed_experts);
    EXPECT_EQ(m->layers[0].kept(), bf.layers[0].kept());
    EXPECT_EQ(kept_sum(*m), m->activations);
  }
}

// fp8 projections keep their own FP8 copy of X: the layer does not keep the BF16 one as well (a_in, n_q, n_kv; the
// dense FFN's f_in and a; the shared experts' a), and what the Linears and Group Linears hold after a step is what
// LayerMemory::quantized_copies says (up to DeviceMemory's 256-byte rounding per buffer).
TEST(Recompute, QuantizedRecipesKeepNoBf16CopyOfWhatTheirLinearsHold) {
  FP4MOE_REQUIRE_DEVICE();
  const Modules fp8 = {"--recipe.attention", "fp8", "--recipe.dense_mlp", "fp8", "--recipe.shared_experts", "fp8",
                       "--recipe.routed_experts", "fp8"};
  const TrainerConfig cfg = config_with("tiny", {}, fp8);
  const int64_t M = cfg.train.micro_batch * cfg.train.seq_len, d = cfg.model.hidden;
  const int64_t fs = cfg.moe.shared_experts * cfg.moe.expert_ffn;
  auto r = [](int64_t bytes) { return ScratchArena::rounded(static_cast<size_t>(bytes)); };
  const Measured bf = measure(config_with("tiny", {}));
  const Measured q = measure(cfg);
  const size_t n_q = r(2 * M * cfg.model.q_lora_rank), n_kv = r(2 * M * cfg.model.kv_lora_rank);
  EXPECT_EQ(bf.layers[0].norms - q.layers[0].norms, 2 * r(2 * M * d) + n_q + n_kv) << "a_in, f_in, n_q, n_kv";
  EXPECT_EQ(bf.layers[1].norms - q.layers[1].norms, r(2 * M * d) + n_q + n_kv)
      << "a_in, n_q, n_kv (the router reads f_in)";
  EXPECT_EQ(bf.layers[0].ffn - q.layers[0].ffn, r(2 * M * cfg.model.dense_ffn)) << "the dense FFN's a";
  EXPECT_EQ(bf.layers[1].ffn - q.layers[1].ffn,
            r(2 * M * fs) + (bf.layers[1].routed_experts - q.layers[1].routed_experts))
      << "the shared experts' a, and the routed experts' xs and a";
  for (const LayerMemory& l : q.layers) EXPECT_GT(l.quantized_copies, 0u);
  for (const LayerMemory& l : bf.layers) EXPECT_EQ(l.quantized_copies, 0u);

  // After a step the category holds the layers' kept bytes plus the quantized copies.
  const int64_t B = cfg.train.micro_batch, T = cfg.train.seq_len;
  std::vector<int32_t> tokens(M), targets(M);
  for (int64_t m = 0; m < M; ++m) {
    tokens[m] = static_cast<int32_t>((m * 7) % 32);
    targets[m] = (m + 1) % T == 0 ? kIgnoreIndex : static_cast<int32_t>(((m + 1) * 7) % 32);
  }
  test::DeviceBuffer<int32_t> tok_d(M), tgt_d(M);
  tok_d.upload(tokens);
  tgt_d.upload(targets);
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreate(&stream));
  {
    DeviceMemory mem;
    Model model(cfg, mem, stream);
    model.init_weights(1);
    model.params().zero_grads(stream);
    model.forward_backward(tok_d.ptr, tgt_d.ptr, B, 1.0f);
    size_t kept = model.head_activation_bytes(), copies = 0;
    for (const LayerMemory& l : model.layer_memory()) {
      kept += l.kept();
      copies += l.quantized_copies;
    }
    const size_t now = mem.current(MemCategory::activations);
    EXPECT_GE(now, kept + copies);
    EXPECT_LE(now, kept + copies + 64 * 256) << "kept " << kept << " + copies " << copies;
  }
  cudaStreamDestroy(stream);
}

TEST(Recompute, WorkspaceDoesNotGrowWithTheLayerCount) {
  FP4MOE_REQUIRE_DEVICE();
  for (const Modules& p : std::vector<Modules>{{}, {"full"}, {"core_attn", "moe_act"}}) {
    SCOPED_TRACE(label(p));
    const Measured two = measure(config_with("tiny", p));
    const Measured five = measure(config_with("tiny", p, {"--model.layers", "5"}));
    EXPECT_EQ(two.workspace, five.workspace) << "one arena, sized to the largest layer, whatever the depth";
    EXPECT_GT(five.activations, two.activations);
  }
}

}  // namespace
}  // namespace fp4moe
