// Linear in its three recipes (trainer/model/linear.h) on the GPU:
//   - Fprop, Dgrad and Wgrad against the CPU reference on the recipe's own quantized operands (linear_ref.h:
//     the quantizer references, dequantized, GEMMs in double): relative L2 < 1e-2 for the BF16 outputs Y and dX,
//     < 1e-3 for dW accumulated into a random FP32 grad; and against the unquantized bf16 reference within the
//     recipe's error band (fp8 [0.02, 0.06] everywhere; mxfp4 [0.08, 0.2] in Fprop and Wgrad, fp8's band in
//     Dgrad; bf16 below 1e-2), the bands tests/gemm/test_linear_recipe_ref.cpp checks on the references alone.
//     M = 301 (not a multiple of 4: Group Linear's ragged tail) and 256; N = 192, K = 320 (a short 1x128 block);
//   - FP32 Dgrad: overwrite and accumulate (dx += dX) give float(BF16 dX) and u + float(BF16 dX) bit for bit in
//     the fp8/mxfp4 recipes (add_bf16_into_f32 after a BF16 scratch), the FP32 GEMM result in bf16;
//   - fp8 and mxfp4 read only their own copy of X: backward with the caller's X overwritten by NaN and x = null
//     gives bitwise the same dX and dW;
//   - misuse is rejected (backward without or after another forward, null x for bf16, no ctx.mem, another
//     DeviceMemory); M = 0 is a no-op;
//   - the buffers are counted by DeviceMemory (weights: the FP8 weight copies; activations: exactly what backward
//     reads, Linear::held_activation_bytes; workspace: the rest) and all given back when the layer goes;
//   - the tiny model (configs/tiny.toml) trains with each recipe on every class (attention, dense_mlp,
//     shared_experts, routed_experts) and with paper 1's mix (routed mxfp4, the rest fp8): loss at init ln V within
//     0.1, eight AdamW steps on a fixed batch lower it by more than 0.1 nats, and the dense Linear weights'
//     gradients at init point where the bf16 model's do (cosine > 0.9 for an fp8 class, > 0.6 for mxfp4).
// All outputs are poisoned (NaN) before each run. Instantiation prefixes start with LinearRecipe so that
// --gtest_filter='LinearRecipe*' runs every test of this file.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "tests/common/gpu_test_util.h"
#include "tests/common/param_printers.h"
#include "kernels/common/check.h"
#include "kernels/formats/formats.h"
#include "kernels/gemm/cublaslt_matmul.h"
#include "kernels/gemm/grouped_gemm_ref.h"
#include "kernels/nn/adamw.h"
#include "kernels/nn/cross_entropy.h"
#include "trainer/config.h"
#include "trainer/memory/device_memory.h"
#include "trainer/model/context.h"
#include "trainer/model/linear.h"
#include "trainer/model/linear_ref.h"
#include "trainer/model/model.h"
#include "trainer/model/params.h"

namespace fp4moe {
namespace {

using test::DeviceBuffer;

// Seeded BF16 values: normal(0, stddev), each row times a power of two in 2^[-row_spread, row_spread].
std::vector<bf16> random_rows(int64_t rows, int64_t cols, float stddev, int row_spread, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  std::uniform_int_distribution<int> row_exp(-row_spread, row_spread);
  std::vector<bf16> v(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const float s = exp2_exact(row_exp(rng));
    for (int64_t c = 0; c < cols; ++c) v[r * cols + c] = bf16_from_bits(f32_to_bf16_bits(normal(rng) * s));
  }
  return v;
}

std::vector<float> random_uniform(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& e : v) e = u(rng);
  return v;
}

std::vector<float> to_float(const std::vector<bf16>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = bf16_bits_to_f32(bf16_bits(v[i]));
  return f;
}

double rel(const std::vector<float>& got, const std::vector<float>& want) {
  return relative_l2_error(got.data(), want.data(), static_cast<int64_t>(want.size()));
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// One Linear with its parameter store, allocator and cuBLASLt handle; the default stream.
struct LinearOnDevice {
  LinearOnDevice(Recipe r, int64_t n, int64_t k) : N(n), K(k), linear(store, "lin", k, n, r, 0.02f) {
    store.allocate(mem);
    ctx = ModelContext{nullptr, &lt, &mem};
  }
  void set_weight(const std::vector<bf16>& w) {
    CUDA_CHECK(cudaMemcpy(linear.weight().param, w.data(), w.size() * sizeof(bf16), cudaMemcpyHostToDevice));
  }
  void set_grad(const std::vector<float>& g) {
    CUDA_CHECK(cudaMemcpy(linear.weight().grad, g.data(), g.size() * sizeof(float), cudaMemcpyHostToDevice));
  }
  std::vector<float> grad() const {
    std::vector<float> g(static_cast<size_t>(N * K));
    CUDA_CHECK(cudaMemcpy(g.data(), linear.weight().grad, g.size() * sizeof(float), cudaMemcpyDeviceToHost));
    return g;
  }

  int64_t N, K;
  DeviceMemory mem;  // first: outlives the layer's buffers
  CublasLtMatmul lt;
  ParamStore store;
  Linear linear;
  ModelContext ctx;
};

struct Bands {
  double lo, hi;
};

// The recipe's error against the unquantized bf16 reference (tests/gemm/test_linear_recipe_ref.cpp): Fprop,
// Dgrad, Wgrad.
void recipe_bands(Recipe r, Bands& fprop, Bands& dgrad, Bands& wgrad) {
  const Bands fp8{0.02, 0.06}, mx{0.08, 0.2}, bf{0.0, 1e-2};
  fprop = r == Recipe::bf16 ? bf : r == Recipe::fp8 ? fp8 : mx;
  dgrad = r == Recipe::bf16 ? bf : fp8;
  wgrad = fprop;
}

class LinearRecipe : public ::testing::TestWithParam<Recipe> {};

std::string recipe_param_name(const ::testing::TestParamInfo<Recipe>& info) { return recipe_name(info.param); }

TEST_P(LinearRecipe, MatchesItsQuantizedReferenceWithinTheRecipesErrorOfBf16) {
  FP4MOE_REQUIRE_DEVICE();
  const Recipe recipe = GetParam();
  const int64_t N = 192, K = 320;
  for (const int64_t M : {int64_t{301}, int64_t{256}}) {
    SCOPED_TRACE(std::string(recipe_name(recipe)) + " M=" + std::to_string(M));
    const std::vector<bf16> x = random_rows(M, K, 1.0f, 3, 1), w = random_rows(N, K, 0.02f, 0, 2),
                            dy = random_rows(M, N, 1.0f, 3, 3);
    const std::vector<float> grad0 = random_uniform(N * K, 4);
    std::vector<float> y_ref, dx_ref, dw_ref, y_bf, dx_bf, dw_bf;
    linear_recipe_ref(linear_recipe_operands(recipe, x.data(), w.data(), dy.data(), M, N, K), M, N, K, y_ref, dx_ref,
                      dw_ref);
    linear_recipe_ref(linear_recipe_operands(Recipe::bf16, x.data(), w.data(), dy.data(), M, N, K), M, N, K, y_bf,
                      dx_bf, dw_bf);

    LinearOnDevice d(recipe, N, K);
    d.set_weight(w);
    d.set_grad(grad0);
    DeviceBuffer<bf16> d_x(M * K), d_dy(M * N), d_y(M * N), d_dx(M * K);
    d_x.upload(x);
    d_dy.upload(dy);
    d_y.poison(0xFF);
    d_dx.poison(0xFF);
    try {
      d.linear.forward(d.ctx, d_x.ptr, M, d_y.ptr);
      d.linear.backward(d.ctx, d_dy.ptr, d_x.ptr, M, LinearGradOut{d_dx.ptr, false, false});
      CUDA_CHECK(cudaDeviceSynchronize());
    } catch (const std::exception& e) {
      FAIL() << "Linear threw: " << e.what();
    }
    const std::vector<float> y = to_float(d_y.download()), dx = to_float(d_dx.download()), g = d.grad();
    std::vector<float> dw(g.size());
    for (size_t i = 0; i < g.size(); ++i) dw[i] = g[i] - grad0[i];

    EXPECT_LT(rel(y, y_ref), 1e-2) << "Fprop vs the reference on the recipe's operands (NaN: unwritten)";
    EXPECT_LT(rel(dx, dx_ref), 1e-2) << "Dgrad vs the reference on the recipe's operands";
    std::vector<float> g_ref(g.size());
    for (size_t i = 0; i < g.size(); ++i) g_ref[i] = grad0[i] + dw_ref[i];
    EXPECT_LT(rel(g, g_ref), 1e-3) << "Wgrad accumulated into the FP32 grad";

    Bands bf, bd, bw;
    recipe_bands(recipe, bf, bd, bw);
    const double ef = rel(y, y_bf), ed = rel(dx, dx_bf), ew = rel(dw, dw_bf);
    std::printf("[ %s M=%lld ] relative L2 error vs bf16: Fprop %.4f Dgrad %.4f Wgrad %.4f\n",
                recipe_name(recipe).c_str(), static_cast<long long>(M), ef, ed, ew);
    EXPECT_GE(ef, bf.lo);
    EXPECT_LT(ef, bf.hi);
    EXPECT_GE(ed, bd.lo);
    EXPECT_LT(ed, bd.hi);
    EXPECT_GE(ew, bw.lo);
    EXPECT_LT(ew, bw.hi);
  }
}

TEST_P(LinearRecipe, Fp32DgradOverwritesAndAccumulates) {
  FP4MOE_REQUIRE_DEVICE();
  const Recipe recipe = GetParam();
  const int64_t M = 130, N = 64, K = 96;
  SCOPED_TRACE(recipe_name(recipe));
  const std::vector<bf16> x = random_rows(M, K, 1.0f, 2, 11), w = random_rows(N, K, 0.05f, 0, 12),
                          dy = random_rows(M, N, 1.0f, 2, 13);
  std::vector<float> y_ref, dx_ref, dw_ref;
  linear_recipe_ref(linear_recipe_operands(recipe, x.data(), w.data(), dy.data(), M, N, K), M, N, K, y_ref, dx_ref,
                    dw_ref);
  LinearOnDevice d(recipe, N, K);
  d.set_weight(w);
  DeviceBuffer<bf16> d_x(M * K), d_dy(M * N), d_y(M * N), d_dx(M * K);
  DeviceBuffer<float> d_dx32(M * K);
  d_x.upload(x);
  d_dy.upload(dy);
  d.linear.forward(d.ctx, d_x.ptr, M, d_y.ptr);
  d_dx.poison(0xFF);
  d.linear.backward(d.ctx, d_dy.ptr, d_x.ptr, M, LinearGradOut{d_dx.ptr, false, false});
  d_dx32.poison(0xFF);
  d.linear.backward(d.ctx, d_dy.ptr, d_x.ptr, M, LinearGradOut{d_dx32.ptr, true, false});
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> dx16 = to_float(d_dx.download()), dx32 = d_dx32.download();

  const std::vector<float> u = random_uniform(M * K, 14);
  d_dx32.upload(u);
  d.linear.backward(d.ctx, d_dy.ptr, d_x.ptr, M, LinearGradOut{d_dx32.ptr, true, true});
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> acc = d_dx32.download();
  std::vector<float> acc_want(u.size());
  if (recipe == Recipe::bf16) {
    // cuBLASLt writes FP32 directly (beta = 1 when accumulating): no BF16 rounding.
    EXPECT_LT(rel(dx32, dx_ref), 1e-4);
    for (size_t i = 0; i < u.size(); ++i) acc_want[i] = u[i] + dx_ref[i];
    EXPECT_LT(rel(acc, acc_want), 1e-4);
  } else {
    // Group Linear's BF16 dX, then cast_bf16_to_f32 / add_bf16_into_f32 (one FP32 rounding, as on the host).
    EXPECT_TRUE(same_bits(dx32, dx16)) << "FP32 overwrite must be float(BF16 dX)";
    for (size_t i = 0; i < u.size(); ++i) acc_want[i] = u[i] + dx16[i];
    EXPECT_TRUE(same_bits(acc, acc_want)) << "FP32 accumulation must be u + float(BF16 dX)";
    EXPECT_LT(rel(dx32, dx_ref), 1e-2);
  }
}

TEST_P(LinearRecipe, EmptyBatchIsANoOp) {
  FP4MOE_REQUIRE_DEVICE();
  const Recipe recipe = GetParam();
  LinearOnDevice d(recipe, 64, 64);
  d.set_grad(std::vector<float>(64 * 64, 0.0f));
  EXPECT_NO_THROW(d.linear.forward(d.ctx, nullptr, 0, nullptr));
  EXPECT_NO_THROW(d.linear.backward(d.ctx, nullptr, nullptr, 0, LinearGradOut{nullptr, true, true}));
  CUDA_CHECK(cudaDeviceSynchronize());
  for (float v : d.grad()) ASSERT_EQ(v, 0.0f);
  EXPECT_EQ(d.mem.current(MemCategory::activations), 0u) << "M = 0 allocates nothing";
}

INSTANTIATE_TEST_SUITE_P(LinearRecipeAll, LinearRecipe, ::testing::Values(Recipe::bf16, Recipe::fp8, Recipe::mxfp4),
                         recipe_param_name);

class LinearRecipeQuantized : public ::testing::TestWithParam<Recipe> {};

TEST_P(LinearRecipeQuantized, BackwardReadsOnlyTheLayersOwnCopyOfX) {
  FP4MOE_REQUIRE_DEVICE();
  const Recipe recipe = GetParam();
  const int64_t M = 200, N = 128, K = 256;
  const std::vector<bf16> x = random_rows(M, K, 1.0f, 2, 21), w = random_rows(N, K, 0.05f, 0, 22),
                          dy = random_rows(M, N, 1.0f, 2, 23);
  LinearOnDevice d(recipe, N, K);
  EXPECT_FALSE(d.linear.backward_reads_input());
  d.set_weight(w);
  DeviceBuffer<bf16> d_x(M * K), d_dy(M * N), d_y(M * N), d_dx(M * K);
  d_dy.upload(dy);
  const auto run = [&](bool destroy_x) {
    d.set_grad(std::vector<float>(N * K, 0.0f));
    d_x.upload(x);
    d.linear.forward(d.ctx, d_x.ptr, M, d_y.ptr);
    if (destroy_x) d_x.poison(0xFF);  // NaN: a read of the caller's X would show in dW and dX
    d_dx.poison(0xFF);
    d.linear.backward(d.ctx, d_dy.ptr, destroy_x ? nullptr : d_x.ptr, M, LinearGradOut{d_dx.ptr, false, false});
    CUDA_CHECK(cudaDeviceSynchronize());
    return std::pair{to_float(d_dx.download()), d.grad()};
  };
  const auto [dx_kept, dw_kept] = run(false);
  const auto [dx_gone, dw_gone] = run(true);
  EXPECT_TRUE(same_bits(dx_kept, dx_gone));
  EXPECT_TRUE(same_bits(dw_kept, dw_gone));
  bool finite = true;
  for (float v : dw_gone) finite = finite && std::isfinite(v);
  EXPECT_TRUE(finite);
}

TEST_P(LinearRecipeQuantized, BuffersAreCountedByDeviceMemoryAndGivenBack) {
  FP4MOE_REQUIRE_DEVICE();
  const Recipe recipe = GetParam();
  const int64_t M = 300, N = 192, K = 320;
  DeviceMemory mem;
  CublasLtMatmul lt;
  ParamStore store;
  auto linear = std::make_unique<Linear>(store, "lin", K, N, recipe, 0.02f);
  store.allocate(mem);
  ModelContext ctx{nullptr, &lt, &mem};
  size_t base[kMemCategories];
  for (int c = 0; c < kMemCategories; ++c) base[c] = mem.current(static_cast<MemCategory>(c));
  const auto grew = [&](MemCategory c) { return mem.current(c) - base[static_cast<int>(c)]; };

  DeviceBuffer<bf16> x(M * K), dy(M * N), y(M * N);
  DeviceBuffer<float> dx32(M * K);
  x.upload(random_rows(M, K, 1.0f, 0, 31));
  dy.upload(random_rows(M, N, 1.0f, 0, 32));
  linear->forward(ctx, x.ptr, M, y.ptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  // Two buffers each (codes and scales; W and W^T twice), each rounded up to DeviceMemory's 256 bytes.
  const size_t held = Linear::held_activation_bytes(recipe, M, K), wcopy = Linear::weight_copy_bytes(recipe, N, K);
  EXPECT_GE(grew(MemCategory::activations), held);
  EXPECT_LT(grew(MemCategory::activations), held + 2 * 256);
  EXPECT_GE(grew(MemCategory::weights), wcopy);
  EXPECT_LT(grew(MemCategory::weights), wcopy + 4 * 256);
  EXPECT_GT(grew(MemCategory::workspace), 0u) << "the FP8 row copy of X and the device offsets";
  EXPECT_EQ(grew(MemCategory::grads) + grew(MemCategory::optimizer) + grew(MemCategory::comm), 0u);

  linear->backward(ctx, dy.ptr, nullptr, M, LinearGradOut{dx32.ptr, true, false});
  CUDA_CHECK(cudaDeviceSynchronize());
  const size_t total = mem.current_total();
  EXPECT_GT(grew(MemCategory::workspace), static_cast<size_t>(2 * M * K)) << "the BF16 dX scratch";
  // The same batch again allocates nothing more; a smaller one reuses the buffers.
  linear->forward(ctx, x.ptr, M, y.ptr);
  linear->backward(ctx, dy.ptr, nullptr, M, LinearGradOut{dx32.ptr, true, true});
  linear->forward(ctx, x.ptr, M / 2, y.ptr);
  linear->backward(ctx, dy.ptr, nullptr, M / 2, LinearGradOut{dx32.ptr, true, false});
  CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(mem.current_total(), total);

  linear.reset();
  for (int c = 0; c < kMemCategories; ++c)
    EXPECT_EQ(mem.current(static_cast<MemCategory>(c)), base[c]) << mem_category_name(static_cast<MemCategory>(c));
}

TEST_P(LinearRecipeQuantized, RejectsMisuse) {
  FP4MOE_REQUIRE_DEVICE();
  const Recipe recipe = GetParam();
  const int64_t N = 64, K = 64;
  LinearOnDevice d(recipe, N, K);
  DeviceBuffer<bf16> x(64 * K), y(64 * N), dy(64 * N), dx(64 * K);
  x.upload(random_rows(64, K, 1.0f, 0, 41));
  dy.upload(random_rows(64, N, 1.0f, 0, 42));
  const LinearGradOut to_dx{dx.ptr, false, false};
  EXPECT_THROW(d.linear.backward(d.ctx, dy.ptr, x.ptr, 64, to_dx), Error) << "backward before any forward";
  ModelContext no_mem{nullptr, &d.lt, nullptr};
  EXPECT_THROW(d.linear.forward(no_mem, x.ptr, 64, y.ptr), Error) << "fp8/mxfp4 need ctx.mem";
  d.linear.forward(d.ctx, x.ptr, 64, y.ptr);
  EXPECT_THROW(d.linear.backward(d.ctx, dy.ptr, x.ptr, 32, to_dx), Error) << "M other than the last forward's";
  EXPECT_THROW(d.linear.backward(d.ctx, nullptr, x.ptr, 64, to_dx), Error) << "null dy";
  EXPECT_THROW(d.linear.backward(d.ctx, dy.ptr, x.ptr, 64, LinearGradOut{dx.ptr, false, true}), Error)
      << "accumulation into BF16";
  DeviceMemory other;
  ModelContext other_mem{nullptr, &d.lt, &other};
  EXPECT_THROW(d.linear.forward(other_mem, x.ptr, 64, y.ptr), Error) << "another DeviceMemory";
  CublasLtMatmul other_lt;
  ModelContext other_matmul{nullptr, &other_lt, &d.mem};
  EXPECT_THROW(d.linear.forward(other_matmul, x.ptr, 64, y.ptr), Error) << "another cuBLASLt object";
  EXPECT_THROW(d.linear.forward(d.ctx, nullptr, 64, y.ptr), Error);
  EXPECT_NO_THROW(d.linear.backward(d.ctx, dy.ptr, nullptr, 64, to_dx));
  CUDA_CHECK(cudaDeviceSynchronize());
}

INSTANTIATE_TEST_SUITE_P(LinearRecipeFp8AndMxfp4, LinearRecipeQuantized,
                         ::testing::Values(Recipe::fp8, Recipe::mxfp4), recipe_param_name);

TEST(LinearRecipeBf16, BackwardNeedsTheCallersX) {
  FP4MOE_REQUIRE_DEVICE();
  LinearOnDevice d(Recipe::bf16, 64, 64);
  EXPECT_TRUE(d.linear.backward_reads_input());
  DeviceBuffer<bf16> x(16 * 64), y(16 * 64), dy(16 * 64);
  x.upload(random_rows(16, 64, 1.0f, 0, 51));
  dy.upload(random_rows(16, 64, 1.0f, 0, 52));
  d.linear.forward(d.ctx, x.ptr, 16, y.ptr);
  EXPECT_THROW(d.linear.backward(d.ctx, dy.ptr, nullptr, 16, LinearGradOut{}), Error);
}

// ---- the tiny model with each recipe ----

std::string tiny_config_path() {
  const auto p = std::filesystem::path(FP4MOE_SOURCE_DIR) / "configs" / "tiny.toml";
  return std::filesystem::exists(p) ? p.string() : std::string("configs/tiny.toml");
}

// Recipes of the four classes: attention, dense_mlp, shared_experts, routed_experts.
struct RecipeMix {
  const char* name;
  const char* attention;
  const char* dense_mlp;
  const char* shared_experts;
  const char* routed_experts;
};

// GetParam() in GoogleTest's output: "paper1: attention fp8, dense_mlp fp8, shared_experts fp8, routed_experts mxfp4".
void PrintTo(const RecipeMix& m, std::ostream* os) {
  *os << m.name << ": attention " << m.attention << ", dense_mlp " << m.dense_mlp << ", shared_experts "
      << m.shared_experts << ", routed_experts " << m.routed_experts;
}

struct TinyModel {
  explicit TinyModel(const RecipeMix& mix)
      : cfg(parse_config_args({"--config", tiny_config_path(), "--recipe.attention", mix.attention,
                               "--recipe.dense_mlp", mix.dense_mlp, "--recipe.shared_experts", mix.shared_experts,
                               "--recipe.routed_experts", mix.routed_experts})),
        B(cfg.train.micro_batch),
        T(cfg.train.seq_len),
        M(B * T),
        tokens(static_cast<size_t>(M)),
        targets(static_cast<size_t>(M)) {
    CUDA_CHECK(cudaStreamCreate(&stream));
    model = std::make_unique<Model>(cfg, mem, stream);
    model->init_weights(cfg.train.seed);
    // A fixed batch: tokens drawn from 32 ids, targets the next token (the last of each row ignored).
    std::mt19937 rng(5);
    std::vector<int32_t> tok(M), tgt(M);
    for (auto& t : tok) t = static_cast<int32_t>(rng() % 32);
    for (int64_t m = 0; m < M; ++m) tgt[m] = (m + 1) % T == 0 ? kIgnoreIndex : tok[m + 1];
    tokens.upload(tok);
    targets.upload(tgt);
  }
  ~TinyModel() {
    model.reset();
    cudaStreamDestroy(stream);
  }
  StepStats forward() { return model->forward(tokens.ptr, targets.ptr, B); }
  StepStats forward_backward() { return model->forward_backward(tokens.ptr, targets.ptr, B, 1.0f); }
  std::vector<float> grad_of(const std::string& name) {
    const Param* p = model->params().find(name);
    EXPECT_NE(p, nullptr) << name;
    if (!p) return {};
    std::vector<float> g(static_cast<size_t>(p->n));
    CUDA_CHECK(cudaMemcpy(g.data(), p->grad, g.size() * sizeof(float), cudaMemcpyDeviceToHost));
    return g;
  }

  TrainerConfig cfg;
  int64_t B, T, M;
  DeviceMemory mem;
  cudaStream_t stream = nullptr;
  std::unique_ptr<Model> model;
  DeviceBuffer<int32_t> tokens, targets;
};

double cosine(const std::vector<float>& a, const std::vector<float>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ab += static_cast<double>(a[i]) * b[i];
    aa += static_cast<double>(a[i]) * a[i];
    bb += static_cast<double>(b[i]) * b[i];
  }
  return aa > 0 && bb > 0 ? ab / std::sqrt(aa * bb) : 0.0;
}

class LinearRecipeModel : public ::testing::TestWithParam<RecipeMix> {};

TEST_P(LinearRecipeModel, TinyTrainsAndItsLossFalls) {
  FP4MOE_REQUIRE_DEVICE();
  const RecipeMix mix = GetParam();
  std::unique_ptr<TinyModel> t;
  try {
    t = std::make_unique<TinyModel>(mix);
  } catch (const std::exception& e) {
    FAIL() << "the tiny model with recipes " << mix.name << " was refused: " << e.what();
  }
  const StepStats init = t->forward();
  EXPECT_NEAR(init.loss, std::log(static_cast<double>(t->cfg.model.vocab_size)), 0.1);

  // The dense Linear weights' gradients at init against the bf16 model's on the same batch.
  if (std::string(mix.name) != "bf16") {
    TinyModel bf(RecipeMix{"bf16", "bf16", "bf16", "bf16", "bf16"});
    bf.model->params().zero_grads(bf.stream);
    bf.forward_backward();
    t->model->params().zero_grads(t->stream);
    t->forward_backward();
    const struct {
      const char* name;
      const char* recipe;
    } checked[] = {{"layers.1.attn.out", mix.attention}, {"layers.0.attn.out", mix.attention},
                   {"layers.0.mlp.fc1", mix.dense_mlp},  {"layers.0.mlp.fc2", mix.dense_mlp},
                   {"layers.1.moe.shared.fc1", mix.shared_experts}, {"layers.1.moe.shared.fc2", mix.shared_experts}};
    for (const auto& c : checked) {
      const double cs = cosine(t->grad_of(c.name), bf.grad_of(c.name));
      std::printf("[ %s ] %s (%s): cosine of the gradient with bf16's %.4f\n", mix.name, c.name, c.recipe, cs);
      EXPECT_GT(cs, std::string(c.recipe) == "mxfp4" ? 0.6 : 0.9) << c.name;
    }
  }

  std::vector<float> losses;
  ParamStore& store = t->model->params();
  for (int64_t step = 1; step <= 8; ++step) {
    store.zero_grads(t->stream);
    losses.push_back(t->forward_backward().loss);
    for (Param& p : store.params()) {
      const AdamWConfig opt{2e-3f, 0.9f, 0.95f, 1e-8f, p.decay ? 0.1f : 0.0f, step};
      adamw_step(AdamWTensor{p.master, p.param, p.grad, p.m, p.v, p.n}, opt, nullptr, t->stream);
    }
    t->model->end_step();
  }
  const float final_loss = t->forward().loss;
  for (float l : losses) EXPECT_TRUE(std::isfinite(l));
  std::printf("[ %s ] losses %s, after 8 steps %.4f; peak activations %.2f MiB, total %.2f MiB\n", mix.name,
              ::testing::PrintToString(losses).c_str(), final_loss,
              static_cast<double>(t->mem.peak(MemCategory::activations)) / (1 << 20),
              static_cast<double>(t->mem.peak_total()) / (1 << 20));
  EXPECT_LT(final_loss, losses[0] - 0.1f) << "losses of the 8 steps: " << ::testing::PrintToString(losses);
}

INSTANTIATE_TEST_SUITE_P(LinearRecipeMixes, LinearRecipeModel,
                         ::testing::Values(RecipeMix{"bf16", "bf16", "bf16", "bf16", "bf16"},
                                           RecipeMix{"fp8", "fp8", "fp8", "fp8", "fp8"},
                                           RecipeMix{"mxfp4", "mxfp4", "mxfp4", "mxfp4", "mxfp4"},
                                           RecipeMix{"paper1", "fp8", "fp8", "fp8", "mxfp4"}),
                         [](const ::testing::TestParamInfo<RecipeMix>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace fp4moe
