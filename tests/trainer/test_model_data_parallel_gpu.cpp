// GPU test of expert and data parallelism in the model (trainer/model/model.h "Expert and data parallelism over real
// ranks"): N = 2, 4 and 8 simulated ranks (InProcessTransport, one host thread and one stream per rank on one device,
// tests/common/ep_ranks_test_util.h), each a Model of configs/tiny.toml's shapes over the transport with its own
// micro-batch of B = 2 rows of T = 64 tokens, against ONE single-GPU Model with micro_batch N B run on all ranks'
// rows at once (rank r's rows are the reference's rows [r B, (r + 1) B)). Every rank and the reference start from
// init_weights(seed): the ranks' experts are then the reference's slices (Param::init_index), which the test checks
// bit for bit. Every layer class runs the recipe under test (bf16, fp8, mxfp4).
//   - The routing is pinned: the reference's own top-k selection (or, in EmptyExpertsAndRanksMatchOneModel, a skewed
//     one forced on it: experts 0-2 only, so that other experts and over 4 or 8 ranks whole ranks receive no rows),
//     each rank forced to its slice (force_routing), so that no near-tie flips between the two (a rank's GEMMs run
//     over fewer rows than the reference's, which may change the router's FP32 logits in the last bits; the layer's
//     own selection is checked in test_moe_expert_parallel_gpu.cpp).
//   - Forward and backward, reduce_gradients, one optimizer step (GradNorm over the group with train.grad_clip 1,
//     AdamW of every Param), end_step (the v3 bias from the loads summed over the ranks).
// Checked:
//   - the loss: the mean of the ranks' losses (equal valid-target counts) against the reference's, relative 1e-3;
//   - every replicated gradient: the same bits on every rank (one all-reduce), and against the reference's; each
//     rank's routed experts' gradients against the reference's slice; the global gradient norm, relative 1e-2;
//   - after the step: every master weight against the reference's (replicated ones the same bits on every rank);
//     the v3 router bias bit for bit (the same integer loads move it).
// Tolerances (relative L2), per tensor. A rank's GEMMs run over its B T rows where the reference's run over N B T:
// the FP32 summation order of every Wgrad over tokens differs (the ranks' partial sums are then added by the
// all-reduce), and a BF16 rounding of an activation may flip here and there, a difference that grows through the
// backward (B T = 128 keeps the FP8 and MXFP4 blocks along tokens, 1x128 and 32, of the replicated Linears' Wgrad on
// the same tokens as the reference's). How much is the single GPU's own sensitivity to that: the test runs the
// reference's step once more as N micro-batches of B rows with gradient accumulation (the same routing forced, the
// same mathematics, the ranks' GEMM shapes and partial sums, no transport), and its deviation from the reference
// (the floor) sets the tolerance with the fixed bounds below it: max(base, min(3 x floor, cap)). Bases: gradients
// 1e-2 but the routed experts' under fp8 / mxfp4 0.15, since their Wgrad's dY columns are made from the FP8 rows
// that crossed the exchange (quantized twice, about 3-5% off: test_moe_expert_parallel_gpu.cpp), which the split
// run does not have; AdamW updates 0.1 (0.3 for the fp8 / mxfp4 routed experts, whose gradient signs flip where
// their 0.15 noise exceeds |g|): at step 1 an update is lr g / (|g| + eps) (|.| <= lr), so a gradient element whose
// sign is within the noise moves its update by 2 lr. Caps: gradients 0.1, updates 0.5, below the O(1) of a missing
// all-reduce, a factor W, a wrong expert slice or a wrong gradient (random update signs: about 1.4); a floor above
// its cap fails the test. Why 3: the ranks and the split run share the GEMM shapes and the order of the partial
// sums; they differ in the routed experts' GEMMs (all ranks' rows at once against one micro-batch's) and the
// quantizers' random bits (each rank its own), rounding of the same size. At N = 8 without the floor, the first
// layer's attention and norm gradients were 1.0-1.9% off and the norm weights' updates 0.11-0.35 in every recipe
// (reports/results/h200/quant-speed-ranks-20261202/README.md). Every case prints, per tensor, the largest error
// over the ranks, the floor and the tolerance of gradients and updates.
// Run: fp4moe_tests_gpu_trainer --gtest_filter='*ModelDataParallel*'
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/common/check.h"
#include "tests/common/ep_ranks_test_util.h"
#include "tests/common/gpu_test_util.h"
#include "tests/common/moe_test_util.h"
#include "trainer/comm/transport.h"
#include "trainer/config.h"
#include "trainer/memory/device_memory.h"
#include "trainer/model/model.h"
#include "trainer/train/batch.h"
#include "trainer/train/optimizer_step.h"
#include "trainer/train/schedule.h"

namespace fp4moe {
namespace {

using test::DeviceBuffer;
using test::Vec;

constexpr int64_t kRowsPerRank = 2;
constexpr uint64_t kDataSeed = 77;

TrainerConfig tiny(const Recipe& recipe, int64_t micro_batch) {
  const auto path = std::filesystem::path(FP4MOE_SOURCE_DIR) / "configs" / "tiny.toml";
  TrainerConfig c = parse_config_args({"--config", path.string()});
  c.recipe = RecipeConfig{recipe, recipe, recipe, recipe};
  c.train.micro_batch = micro_batch;
  c.train.grad_accum = 1;
  return c;
}

// What one model (a rank or the reference) produced in the step.
struct StepResult {
  double loss = 0, norm = 0;
  uint64_t quant_seed = 0;  // ModelContext::quant_seed after begin_step(1)
  std::vector<std::string> names;
  std::vector<Vec> init, grads, masters;  // per Param in store order: the initial and stepped masters, the grads
  std::vector<float> bias;                // the v3 router bias of the MoE layer after end_step
  std::vector<std::vector<int32_t>> topk;  // per MoE layer: the top-k ids of the forward [M, k]
};

Vec download(const float* p, int64_t n) {
  std::vector<float> h(static_cast<size_t>(n));
  CUDA_CHECK(cudaMemcpy(h.data(), p, h.size() * sizeof(float), cudaMemcpyDeviceToHost));
  return Vec(h.begin(), h.end());
}

// One seeded draw of N B rows of T + 1 tokens, split as the trainer splits them (batch.h): rank r's tokens and
// targets are elements [r B T, (r + 1) B T) of the returned arrays.
std::pair<std::vector<int32_t>, std::vector<int32_t>> draw_batch(const TrainerConfig& c, int64_t rows) {
  const int64_t T = c.train.seq_len;
  std::mt19937_64 rng(kDataSeed);
  std::vector<int32_t> raw(static_cast<size_t>(rows * (T + 1)));
  for (int32_t& t : raw) t = static_cast<int32_t>(rng() % static_cast<uint64_t>(c.model.vocab_size));
  std::vector<int32_t> tokens(static_cast<size_t>(rows * T)), targets(tokens.size());
  split_rows(raw, rows, T, tokens, targets);
  return {tokens, targets};
}

// Init, forward and backward on the rows of `tokens` (forced routing per MoE layer when given) as `micro_batches`
// equal micro-batches with gradient accumulation (grad_scale 1 / micro_batches; the loss their mean),
// reduce_gradients, the group's gradient norm, one AdamW step, end_step.
StepResult run_step(const TrainerConfig& c, EpTransport* transport, const std::vector<int32_t>& tokens,
                    const std::vector<int32_t>& targets, const std::vector<std::vector<int32_t>>& forced,
                    int micro_batches = 1) {
  DeviceMemory mem;
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreate(&stream));
  StepResult out;
  {
    Model model(c, mem, stream, transport);
    ParamStore& store = model.params();
    model.init_weights(c.train.seed);
    for (const Param& p : store.params()) {
      out.names.push_back(p.name);
      out.init.push_back(download(p.master, p.n));
    }
    DeviceBuffer<int32_t> tok(tokens.size()), tgt(targets.size());
    tok.upload(tokens);
    tgt.upload(targets);
    std::vector<std::unique_ptr<DeviceBuffer<int32_t>>> pinned;
    for (const std::vector<int32_t>& f : forced) {
      pinned.push_back(std::make_unique<DeviceBuffer<int32_t>>(f.size()));
      pinned.back()->upload(f);
    }
    model.begin_step(1);
    out.quant_seed = model.context().quant_seed;
    const int64_t B = static_cast<int64_t>(tokens.size()) / c.train.seq_len / micro_batches;
    const int64_t n = B * c.train.seq_len;  // tokens per micro-batch
    for (int m = 0; m < micro_batches; ++m) {
      std::vector<const int32_t*> pins;
      for (const auto& p : pinned) pins.push_back(p->ptr + m * n * c.moe.top_k);
      model.force_routing(pins);
      out.loss += model.forward_backward(tok.ptr + m * n, tgt.ptr + m * n, B, 1.0f / micro_batches).loss /
                  micro_batches;
    }
    model.reduce_gradients();
    CUDA_CHECK(cudaStreamSynchronize(stream));
    for (const int32_t* idx : model.last_topk_indices()) {  // the last micro-batch's
      out.topk.emplace_back(static_cast<size_t>(n * c.moe.top_k));
      CUDA_CHECK(cudaMemcpy(out.topk.back().data(), idx, out.topk.back().size() * 4, cudaMemcpyDeviceToHost));
    }
    for (const Param& p : store.params()) out.grads.push_back(download(p.grad, p.n));
    GradNorm norm(store, mem, transport);
    out.norm = norm.compute(static_cast<float>(c.train.grad_clip), stream);
    AdamWConfig ac;
    ac.lr = static_cast<float>(learning_rate(c.train, 1));
    ac.beta1 = static_cast<float>(c.train.beta1);
    ac.beta2 = static_cast<float>(c.train.beta2);
    ac.eps = static_cast<float>(c.train.eps);
    ac.step = 1;
    adamw_step_shards(store, ac, static_cast<float>(c.train.weight_decay), norm.clip_scale(), stream);
    model.end_step();
    CUDA_CHECK(cudaStreamSynchronize(stream));
    for (const Param& p : store.params()) out.masters.push_back(download(p.master, p.n));
    for (const StateTensor& s : store.states()) {
      const Vec b = download(s.data, s.n);
      out.bias.assign(b.begin(), b.end());
    }
  }
  CUDA_CHECK(cudaStreamDestroy(stream));
  return out;
}

Vec slice(const Vec& v, size_t begin, size_t n) {
  return Vec(v.begin() + static_cast<std::ptrdiff_t>(begin), v.begin() + static_cast<std::ptrdiff_t>(begin + n));
}

Vec minus(const Vec& a, const Vec& b) {
  Vec d(a.size());
  for (size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return d;
}

void expect_same(const Vec& got, const Vec& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) bad += !(got[i] == want[i]);
  EXPECT_EQ(bad, 0u) << what << ": elements that differ";
}

bool is_routed_expert(const std::string& name) { return name.find(".moe.experts.") != std::string::npos; }

// A skewed routing of every MoE layer for M tokens of top-k: token i chooses experts (i + j) mod 3, j < k (k <= 3):
// only experts 0-2 receive rows, unevenly once M is not a multiple of 3; the others, and over 4 ranks whole ranks,
// receive none.
std::vector<std::vector<int32_t>> skewed_routing(size_t layers, int64_t M, int64_t k) {
  std::vector<int32_t> ids(static_cast<size_t>(M * k));
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < k; ++j) ids[static_cast<size_t>(i * k + j)] = static_cast<int32_t>((i + j) % 3);
  return std::vector<std::vector<int32_t>>(layers, ids);
}

// The tolerance of one comparison (this file's header): the fixed bound `base`, or kFloorFactor times `floor` (the
// one GPU's own deviation from the reference when its batch is split as the ranks split it) when that is larger,
// the floor's part capped at `cap`, past which a comparison could no longer tell rounding from a defect (a floor
// above the cap fails the test by itself).
constexpr double kFloorFactor = 3.0, kGradCap = 0.1, kUpdateCap = 0.5;
double calibrated_tolerance(double base, double floor, double cap) {
  return std::max(base, std::min(kFloorFactor * floor, cap));
}

// One tensor's comparisons over the ranks: the largest error, its floor and tolerance (printed), and the last rank's.
struct Comparison {
  double error = 0, floor = 0, tol = 0, last = 0, last_tol = 0;
  void add(double err, double fl, double base, double cap) {
    last = err;
    last_tol = calibrated_tolerance(base, fl, cap);
    if (err >= error) {
      error = err;
      floor = fl;
      tol = last_tol;
    }
  }
};
struct Observed {
  Comparison grad, update;
};

// N ranks against the reference (the checks in this file's header); skewed: the reference's routing forced to
// skewed_routing (empty experts and ranks) instead of its own selection.
void check_ranks_against_one_model(int N, const Recipe& recipe, bool skewed) {
  const bool quantized = !(recipe == Recipe::bf16);
  const TrainerConfig ref_cfg = tiny(recipe, N * kRowsPerRank), rank_cfg = tiny(recipe, kRowsPerRank);
  const auto [tokens, targets] = draw_batch(ref_cfg, N * kRowsPerRank);
  StepResult ref = run_step(ref_cfg, nullptr, tokens, targets, {});
  ASSERT_FALSE(ref.topk.empty()) << "tiny has a MoE layer";
  if (skewed) {
    ASSERT_LE(ref_cfg.moe.top_k, 3);
    const int64_t M = N * kRowsPerRank * ref_cfg.train.seq_len;
    ref = run_step(ref_cfg, nullptr, tokens, targets, skewed_routing(ref.topk.size(), M, ref_cfg.moe.top_k));
    ASSERT_EQ(ref.topk.front(), skewed_routing(1, M, ref_cfg.moe.top_k).front()) << "the forced routing was taken";
  }

  const int64_t per_rank = kRowsPerRank * rank_cfg.train.seq_len;
  const std::vector<StepResult> ranks = test::run_simulated_ranks<StepResult>(N, [&](EpTransport& t) {
    const size_t r = static_cast<size_t>(t.rank()), n = static_cast<size_t>(per_rank);
    std::vector<std::vector<int32_t>> forced;
    for (const std::vector<int32_t>& layer : ref.topk) {
      const size_t k = static_cast<size_t>(rank_cfg.moe.top_k);
      forced.emplace_back(layer.begin() + static_cast<std::ptrdiff_t>(r * n * k),
                          layer.begin() + static_cast<std::ptrdiff_t>((r + 1) * n * k));
    }
    const std::vector<int32_t> tok(tokens.begin() + static_cast<std::ptrdiff_t>(r * n),
                                   tokens.begin() + static_cast<std::ptrdiff_t>((r + 1) * n));
    const std::vector<int32_t> tgt(targets.begin() + static_cast<std::ptrdiff_t>(r * n),
                                   targets.begin() + static_cast<std::ptrdiff_t>((r + 1) * n));
    return run_step(rank_cfg, &t, tok, tgt, forced);
  });
  ASSERT_FALSE(testing::Test::HasFailure());

  // The single GPU's own sensitivity to how its batch is summed (the tolerances below): the reference's step again as
  // N micro-batches of a rank's B rows with gradient accumulation, the same routing forced: the same mathematics
  // with the ranks' GEMM shapes and Wgrad partial sums, no transport.
  const StepResult split = run_step(rank_cfg, nullptr, tokens, targets, ref.topk, N);
  ASSERT_EQ(split.names, ref.names);

  double loss = 0;
  for (const StepResult& r : ranks) loss += r.loss / N;
  EXPECT_NEAR(loss, ref.loss, 1e-3 * ref.loss) << "the mean of the ranks' losses against the reference's";
  const double grad_tol = 1e-2, expert_tol = quantized ? 0.15 : 1e-2;
  const double update_tol = 0.1, expert_update_tol = quantized ? 0.3 : 0.1;
  std::vector<Observed> observed(ref.names.size());
  for (int r = 0; r < N; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const StepResult& g = ranks[static_cast<size_t>(r)];
    ASSERT_EQ(g.names, ref.names) << "the ranks register the reference's parameters in its order";
    EXPECT_NEAR(g.norm, ref.norm, 1e-2 * ref.norm) << "the global gradient norm";
    EXPECT_EQ(g.bias, ref.bias) << "the v3 router bias after end_step (the loads summed over the ranks)";
    // Each rank its own quantizer bits (model.h begin_step), none the one GPU's.
    EXPECT_NE(g.quant_seed, ref.quant_seed) << "rank " << r;
    for (int q = 0; q < r; ++q) EXPECT_NE(g.quant_seed, ranks[static_cast<size_t>(q)].quant_seed) << r << " " << q;
    for (size_t i = 0; i < g.names.size(); ++i) {
      SCOPED_TRACE(g.names[i]);
      const bool expert = is_routed_expert(g.names[i]);
      const size_t n = g.grads[i].size(), begin = expert ? static_cast<size_t>(r) * n : 0;
      ASSERT_EQ(n * (expert ? static_cast<size_t>(N) : 1), ref.grads[i].size());
      expect_same(g.init[i], slice(ref.init[i], begin, n), "initial master");
      const Vec ref_grad = slice(ref.grads[i], begin, n);
      const Vec ref_update = minus(slice(ref.masters[i], begin, n), g.init[i]);
      Observed& o = observed[i];
      o.grad.add(test::relative_l2(g.grads[i], ref_grad), test::relative_l2(slice(split.grads[i], begin, n), ref_grad),
                 expert ? expert_tol : grad_tol, kGradCap);
      o.update.add(test::relative_l2(minus(g.masters[i], g.init[i]), ref_update),
                   test::relative_l2(minus(slice(split.masters[i], begin, n), g.init[i]), ref_update),
                   expert ? expert_update_tol : update_tol, kUpdateCap);
      EXPECT_LE(o.grad.floor, kGradCap) << "grad: the one GPU's own deviation leaves no room to tell a defect";
      EXPECT_LE(o.update.floor, kUpdateCap) << "AdamW update: the one GPU's own deviation leaves no room";
      EXPECT_LE(o.grad.last, o.grad.last_tol) << "grad: relative L2 error against the reference";
      EXPECT_LE(o.update.last, o.update.last_tol) << "AdamW update: relative L2 error against the reference";
      if (!expert && r > 0) {
        expect_same(g.grads[i], ranks[0].grads[i], "grad against rank 0's");
        expect_same(g.masters[i], ranks[0].masters[i], "master after the step against rank 0's");
      }
    }
  }
  std::printf("N = %d, %s%s: relative L2 error against the one-GPU reference (the largest over the ranks), the one "
              "GPU's own deviation as %d micro-batches (floor), the tolerance\n",
              N, recipe_name(recipe).c_str(), skewed ? ", skewed routing" : "", N);
  std::printf("  %-34s %9s %9s %9s | %9s %9s %9s\n", "parameter", "grad", "floor", "tol", "update", "floor", "tol");
  for (size_t i = 0; i < ref.names.size(); ++i) {
    const Observed& o = observed[i];
    std::printf("  %-34s %9.2e %9.2e %9.2e | %9.2e %9.2e %9.2e\n", ref.names[i].c_str(), o.grad.error, o.grad.floor,
                o.grad.tol, o.update.error, o.update.floor, o.update.tol);
  }
}

class ModelDataParallelGpu : public testing::TestWithParam<std::tuple<int, std::string>> {};

TEST_P(ModelDataParallelGpu, RanksMatchOneModelOnAllTheirRows) {
  FP4MOE_REQUIRE_DEVICE();
  check_ranks_against_one_model(std::get<0>(GetParam()), parse_recipe(std::get<1>(GetParam()), "the test's recipe"),
                                false);
}

TEST_P(ModelDataParallelGpu, EmptyExpertsAndRanksMatchOneModel) {
  FP4MOE_REQUIRE_DEVICE();
  check_ranks_against_one_model(std::get<0>(GetParam()), parse_recipe(std::get<1>(GetParam()), "the test's recipe"),
                                true);
}

INSTANTIATE_TEST_SUITE_P(RanksRecipes, ModelDataParallelGpu,
                         testing::Combine(testing::Values(2, 4, 8), testing::Values("bf16", "fp8", "mxfp4")),
                         [](const testing::TestParamInfo<std::tuple<int, std::string>>& i) {
                           return "N" + std::to_string(std::get<0>(i.param)) + "_" + std::get<1>(i.param);
                         });

}  // namespace
}  // namespace fp4moe
