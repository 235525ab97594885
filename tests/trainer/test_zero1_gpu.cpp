// ZeRO-1 on the device (trainer/model/param_shard.h, ParamStore::set_shard, trainer/train/optimizer_step.h): this GPU
// as rank 0 of its data-parallel group holds the shard of the FP32 masters and AdamW moments, the BF16 params and
// the FP32 grads whole.
//   - Stores of configs/tiny.toml's and a 2-layer configs/small.toml's tensors (parameter_tensors: names and
//     element counts; norms ones without decay, the rest N(0, 0.02^2) with decay), one whole and one sharded over
//     uneven parts: init gives the same BF16 params bit for bit and the shard's masters; three AdamW steps on the
//     same gradients (uniform in +-0.01, clip scale 0.7 from the device) give, bit for bit, the whole store's
//     masters, m, v and BF16 params on every shard, and leave the BF16 params outside the shard as init wrote
//     them; refresh_bf16_from_master rewrites the shard's BF16 params only. The cases cover tensors wholly in the
//     shard, straddling its end, and outside it.
//   - The Model of tiny under [parallel] dp = 3, zero1 (parts 3 and 3) against the plain model: one
//     forward_backward each (the sharded model runs with its partial masters), the plain model's grads copied into
//     the sharded one, one step on each: the same shard values bit for bit, the rest of the BF16 params as init.
//   - The same store comparison with BF16 moments (ParamStore::set_moments, train.moments = "bf16"): the shard's
//     BF16 m and v bit for bit as the whole store's.
//   - DeviceMemory's weights, grads and optimizer after the Model's construction equal the estimate's (trainer/
//     memory/estimate.h, the layout of the config's [parallel]) under zero1, to the byte (ep = 1: the model holds
//     every expert here), with FP32 and with BF16 moments.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tests/common/gpu_test_util.h"
#include "kernels/nn/adamw.h"
#include "kernels/nn/cross_entropy.h"
#include "trainer/config.h"
#include "trainer/memory/device_memory.h"
#include "trainer/memory/estimate.h"
#include "trainer/model/model.h"
#include "trainer/model/params.h"
#include "trainer/train/optimizer_step.h"

namespace fp4moe {
namespace {

using test::DeviceBuffer;

TrainerConfig load(const std::string& name, std::vector<std::string> extra = {}) {
  const auto p = std::filesystem::path(FP4MOE_SOURCE_DIR) / "configs" / (name + ".toml");
  std::vector<std::string> args = {"--config",
                                   std::filesystem::exists(p) ? p.string() : "configs/" + name + ".toml"};
  args.insert(args.end(), extra.begin(), extra.end());
  return parse_config_args(args);
}

template <typename T>
std::vector<T> download(const T* device, int64_t n) {
  std::vector<T> h(static_cast<size_t>(n));
  if (n > 0) CUDA_CHECK(cudaMemcpy(h.data(), device, static_cast<size_t>(n) * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

// Bitwise equality of n elements (FP32 or BF16), reporting the first difference.
template <typename T>
::testing::AssertionResult same_bits(const std::vector<T>& a, size_t a0, const std::vector<T>& b, size_t b0,
                                     size_t n) {
  if (a0 + n > a.size() || b0 + n > b.size()) return ::testing::AssertionFailure() << "range out of bounds";
  for (size_t i = 0; i < n; ++i)
    if (std::memcmp(&a[a0 + i], &b[b0 + i], sizeof(T)) != 0)
      return ::testing::AssertionFailure() << "first difference at element " << i << " of " << n;
  return ::testing::AssertionSuccess();
}

// A ParamStore with `cfg`'s parameter tensors (one GPU's), flat shapes.
void add_tensors(ParamStore& store, const TrainerConfig& cfg) {
  for (const ParamTensor& t : parameter_tensors(cfg, single_gpu_layout(cfg), 0)) {
    if (t.state) continue;
    const bool norm = t.name.find("norm") != std::string::npos;
    store.add(t.name, {t.n}, norm ? ParamInit::ones : ParamInit::normal, norm ? 0.0f : 0.02f, /*decay=*/!norm);
  }
}

// The whole store's values on b's shard equal b's: masters, m, v and BF16 params; b's BF16 params outside its
// shard equal `outside` (the full BF16 tensors b had before the steps).
void expect_shard_equal(ParamStore& whole, ParamStore& sharded, const std::vector<std::vector<bf16>>& outside) {
  size_t i = 0;
  for (const Param& b : sharded.params()) {
    const Param& a = *whole.find(b.name);
    SCOPED_TRACE(b.name + " shard [" + std::to_string(b.shard_begin) + ", " + std::to_string(b.shard_end) + ")");
    const size_t lo = static_cast<size_t>(b.shard_begin), n = static_cast<size_t>(b.shard_size());
    EXPECT_TRUE(same_bits(download(a.master, a.n), lo, download(b.master, b.shard_size()), 0, n)) << "master";
    if (sharded.moments() == MomentDtype::bf16) {
      EXPECT_EQ(a.m, nullptr);
      EXPECT_TRUE(same_bits(download(a.m_bf16, a.n), lo, download(b.m_bf16, b.shard_size()), 0, n)) << "m (BF16)";
      EXPECT_TRUE(same_bits(download(a.v_bf16, a.n), lo, download(b.v_bf16, b.shard_size()), 0, n)) << "v (BF16)";
    } else {
      EXPECT_EQ(a.m_bf16, nullptr);
      EXPECT_TRUE(same_bits(download(a.m, a.n), lo, download(b.m, b.shard_size()), 0, n)) << "m";
      EXPECT_TRUE(same_bits(download(a.v, a.n), lo, download(b.v, b.shard_size()), 0, n)) << "v";
    }
    const std::vector<bf16> pa = download(a.param, a.n), pb = download(b.param, b.n);
    EXPECT_TRUE(same_bits(pa, lo, pb, lo, n)) << "BF16 params on the shard";
    EXPECT_TRUE(same_bits(outside[i], 0, pb, 0, lo)) << "BF16 params before the shard";
    EXPECT_TRUE(same_bits(outside[i], lo + n, pb, lo + n, static_cast<size_t>(b.n) - lo - n))
        << "BF16 params after the shard";
    ++i;
  }
}

std::vector<std::vector<bf16>> bf16_params(ParamStore& store) {
  std::vector<std::vector<bf16>> out;
  for (const Param& p : store.params()) out.push_back(download(p.param, p.n));
  return out;
}

void sharded_steps_equal_the_whole_steps(const std::string& what, const TrainerConfig& cfg, Zero1Parts parts,
                                         MomentDtype moments = MomentDtype::fp32) {
  SCOPED_TRACE(what);
  DeviceMemory mem;
  ParamStore whole, sharded;
  add_tensors(whole, cfg);
  add_tensors(sharded, cfg);
  sharded.set_shard(parts);
  whole.set_moments(moments);
  sharded.set_moments(moments);
  whole.allocate(mem);
  sharded.allocate(mem);
  whole.init(cfg.train.seed, nullptr);
  sharded.init(cfg.train.seed, nullptr);

  // The cases the rule makes: tensors wholly in rank 0's shard, straddling its end, outside it.
  int whole_in = 0, straddling = 0, outside = 0;
  for (const Param& p : sharded.params()) {
    if (p.shard_size() == p.n) ++whole_in;
    else if (p.shard_size() > 0) ++straddling;
    else ++outside;
    EXPECT_EQ(p.shard_begin, 0) << p.name << ": rank 0's shard starts a tensor or is empty";
  }
  EXPECT_GT(whole_in, 0);
  EXPECT_GT(straddling, 0);
  EXPECT_GT(outside, 0);
  EXPECT_LT(sharded.shard_elements(), whole.shard_elements());
  EXPECT_EQ(whole.shard_elements(), whole.total_elements());

  // init: the same BF16 params everywhere, the shard's masters; m and v zero.
  const std::vector<std::vector<bf16>> initial = bf16_params(sharded);
  {
    const std::vector<std::vector<bf16>> a = bf16_params(whole);
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(same_bits(a[i], 0, initial[i], 0, a[i].size())) << i;
  }
  expect_shard_equal(whole, sharded, initial);

  DeviceBuffer<float> scale(1);
  scale.upload({0.7f});
  std::mt19937 rng(20261202);
  std::uniform_real_distribution<float> uniform(-1e-2f, 1e-2f);
  AdamWConfig ac;
  ac.lr = 1e-3f;
  for (int64_t step = 1; step <= 3; ++step) {
    auto a = whole.params().begin();
    for (Param& b : sharded.params()) {  // the same gradients in both stores (same registration order)
      Param& p = *a++;
      ASSERT_EQ(p.name, b.name);
      std::vector<float> g(static_cast<size_t>(p.n));
      for (float& x : g) x = uniform(rng);
      CUDA_CHECK(cudaMemcpy(p.grad, g.data(), g.size() * 4, cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMemcpy(b.grad, g.data(), g.size() * 4, cudaMemcpyHostToDevice));
    }
    ac.step = step;
    adamw_step_shards(whole, ac, 0.1f, scale.ptr, nullptr);
    adamw_step_shards(sharded, ac, 0.1f, scale.ptr, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
  }
  expect_shard_equal(whole, sharded, initial);
  // The steps moved most of the shard's BF16 params (the comparison is not of untouched memory).
  int64_t changed = 0;
  size_t i = 0;
  for (const Param& p : sharded.params()) {
    const std::vector<bf16> now = download(p.param, p.n);
    for (int64_t j = p.shard_begin; j < p.shard_end; ++j) changed += bf16_bits(now[j]) != bf16_bits(initial[i][j]);
    ++i;
  }
  EXPECT_GT(changed, sharded.shard_elements() / 2);

  // refresh_bf16_from_master: the shard's BF16 params from the masters again, the rest untouched.
  for (Param& p : sharded.params())
    if (p.shard_size() > 0) CUDA_CHECK(cudaMemset(p.param + p.shard_begin, 0xFF, p.shard_size() * 2));
  sharded.refresh_bf16_from_master(nullptr);
  expect_shard_equal(whole, sharded, initial);
}

TEST(Zero1Gpu, ShardedStepsEqualTheWholeStepsOnTheShardTiny) {
  FP4MOE_REQUIRE_DEVICE();
  sharded_steps_equal_the_whole_steps("tiny, parts 2 and 3", load("tiny"), Zero1Parts{2, 3});
}

TEST(Zero1Gpu, ShardedBf16MomentsEqualTheWholeStepsOnTheShardTiny) {
  FP4MOE_REQUIRE_DEVICE();
  sharded_steps_equal_the_whole_steps("tiny, parts 2 and 3, BF16 moments", load("tiny"), Zero1Parts{2, 3},
                                      MomentDtype::bf16);
}

TEST(Zero1Gpu, ShardedStepsEqualTheWholeStepsOnTheShardSmallMoe) {
  FP4MOE_REQUIRE_DEVICE();
  sharded_steps_equal_the_whole_steps("small 2 layers, parts 2 and 5", load("small", {"--model.layers", "2"}),
                                      Zero1Parts{2, 5});
}

// A model on its own stream and allocator (the allocator outlives the model).
struct BuiltModel {
  explicit BuiltModel(const TrainerConfig& cfg) {
    CUDA_CHECK(cudaStreamCreate(&stream));
    model = std::make_unique<Model>(cfg, mem, stream);
    model->init_weights(cfg.train.seed);
  }
  ~BuiltModel() {
    model.reset();
    cudaStreamDestroy(stream);
  }
  DeviceMemory mem;
  cudaStream_t stream = nullptr;
  std::unique_ptr<Model> model;
};

TEST(Zero1Gpu, ModelUnderZero1StepsItsShardAsTheWholeModel) {
  FP4MOE_REQUIRE_DEVICE();
  const TrainerConfig plain = load("tiny");
  const TrainerConfig zero1 = load("tiny", {"--parallel.dp", "3", "--parallel.zero1", "true"});
  BuiltModel a(plain), b(zero1);
  ParamStore &whole = a.model->params(), &sharded = b.model->params();
  ASSERT_FALSE(whole.sharded());
  ASSERT_TRUE(sharded.sharded());
  EXPECT_EQ(sharded.shard_parts().dense, 3);
  EXPECT_EQ(sharded.shard_parts().expert, 3);  // expert_dp = dp x tp / ep = 3
  const std::vector<std::vector<bf16>> initial = bf16_params(sharded);

  const int64_t B = plain.train.micro_batch, T = plain.train.seq_len, M = B * T;
  std::mt19937 rng(7);
  std::vector<int32_t> tokens(static_cast<size_t>(M)), targets(static_cast<size_t>(M));
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % 512);
  for (int64_t m = 0; m < M; ++m) targets[m] = (m + 1) % T == 0 ? kIgnoreIndex : tokens[m + 1];
  DeviceBuffer<int32_t> d_tokens(tokens.size()), d_targets(targets.size());
  d_tokens.upload(tokens);
  d_targets.upload(targets);
  for (BuiltModel* x : {&a, &b}) {
    x->model->params().zero_grads(x->stream);
    x->model->forward_backward(d_tokens.ptr, d_targets.ptr, B, 1.0f);
    CUDA_CHECK(cudaStreamSynchronize(x->stream));
  }
  {  // the step's input: the same grads in both (the plain model's, copied: the comparison is of the step alone)
    auto p = whole.params().begin();
    for (Param& q : sharded.params()) {
      ASSERT_EQ(p->name, q.name);
      CUDA_CHECK(cudaMemcpy(q.grad, p->grad, static_cast<size_t>(q.n) * 4, cudaMemcpyDeviceToDevice));
      ++p;
    }
  }
  AdamWConfig ac;
  ac.lr = 1e-3f;
  adamw_step_shards(whole, ac, 0.1f, nullptr, a.stream);
  adamw_step_shards(sharded, ac, 0.1f, nullptr, b.stream);
  CUDA_CHECK(cudaDeviceSynchronize());
  expect_shard_equal(whole, sharded, initial);
}

// DeviceMemory's weights (without the first forward's FP8 copies), grads and optimizer after construction against
// the estimate of the configuration's own layout.
void expect_memory_matches_estimate(const TrainerConfig& cfg) {
  const MemoryEstimate e = estimate_memory(cfg);
  SCOPED_TRACE(e.layout.name + (e.layout.zero1 ? ", zero1" : ""));
  ASSERT_TRUE(e.layout.zero1);
  BuiltModel b(cfg);
  int64_t expected[kMemCategories] = {};
  for (const MemoryTerm& t : e.terms)
    if (t.kept && t.device_memory && !t.first_forward)
      expected[static_cast<int>(t.category)] += (t.bytes + 255) / 256 * 256 * t.instances;
  for (MemCategory c : {MemCategory::weights, MemCategory::grads, MemCategory::optimizer}) {
    EXPECT_EQ(static_cast<int64_t>(b.mem.current(c)), expected[static_cast<int>(c)]) << mem_category_name(c);
    std::printf("  %-10s estimate %12lld B  DeviceMemory %12zu B\n", mem_category_name(c),
                static_cast<long long>(expected[static_cast<int>(c)]), b.mem.current(c));
  }
  // The optimizer holds the shard: less than the whole store's 8 B (BF16 moments: 4 B) per (padded) element,
  // twice (once) the FP32 grads.
  const size_t moment_share = cfg.train.moments == MomentDtype::bf16 ? 1 : 2;
  EXPECT_LT(b.mem.current(MemCategory::optimizer), moment_share * b.mem.current(MemCategory::grads));
}

TEST(Zero1Gpu, DeviceMemoryEqualsTheEstimateUnderZero1) {
  FP4MOE_REQUIRE_DEVICE();
  expect_memory_matches_estimate(load("tiny", {"--parallel.dp", "3", "--parallel.zero1", "true"}));
  expect_memory_matches_estimate(load("tiny", {"--parallel.dp", "4", "--parallel.zero1", "true",
                                               "--recipe.routed_experts", "mxfp4"}));
  expect_memory_matches_estimate(load("small", {"--model.layers", "2", "--parallel.dp", "8", "--parallel.zero1",
                                                "true"}));
  expect_memory_matches_estimate(load("tiny", {"--parallel.dp", "3", "--parallel.zero1", "true", "--train.moments",
                                               "bf16"}));
}

}  // namespace
}  // namespace fp4moe
