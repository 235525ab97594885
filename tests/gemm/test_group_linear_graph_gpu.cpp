// Group Linear without a host copy of the routing offsets (trainer/model/group_linear.h, kernels/gemm/grouped_gemm.h
// "Without a host copy"): the bf16, fp8 and mxfp4 recipes' forward and backward read the expert token counts on the
// device only, so both fit in one CUDA graph, at a shape the Hopper kernels take (fp8, mxfp4) and at the tiny
// model's expert shape (N 32, K 64: every recipe on the CUDA-core kernels). The graph is captured once (global
// capture mode: a stream or device synchronisation, a synchronous copy or an allocation inside would fail the
// capture), then replayed after the device offsets change to another split of the same tokens: every output must
// equal, bit for bit, an eager run of the same split, and each eager run must agree with the layer given the host
// copy (which may take cuBLASLt); paper 2's MXFP4 Fprop and Dgrad (1x128 weights) run the same way. Outputs are
// poisoned before each run. Paper 2's MXFP4 Wgrad, which needs the counts on the host, must refuse such a split with
// the reason, before launching anything.
#include <gtest/gtest.h>

#include <cctype>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/common/check.h"
#include "kernels/common/types.h"
#include "kernels/formats/formats.h"
#include "kernels/gemm/grouped_gemm.h"
#include "kernels/gemm/grouped_gemm_ref.h"
#include "kernels/gemm/grouped_gemm_sm90.h"
#include "kernels/quant/bf16_to_mxfp4_row.h"
#include "kernels/quant/layouts.h"
#include "tests/common/gpu_test_util.h"
#include "tests/common/param_printers.h"
#include "trainer/model/group_linear.h"

namespace fp4moe {
namespace {

using test::DeviceBuffer;

constexpr int64_t kG = 8;
// Two splits of the same 1024 tokens: empty groups, one token, groups not multiples of 16 or 128.
const std::vector<int32_t> kSplitA = {0, 130, 130, 131, 600, 601, 777, 1000, 1024};
const std::vector<int32_t> kSplitB = {0, 0, 512, 512, 513, 700, 700, 1023, 1024};
constexpr int64_t kM = 1024;

std::vector<bf16> random_bf16(int64_t n, float stddev, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<bf16> v(static_cast<size_t>(n));
  for (auto& x : v) x = bf16_from_bits(f32_to_bf16_bits(normal(rng)));
  return v;
}

// Y, dX (BF16 bits) and the FP32 master gradient after one forward and backward.
struct Outputs {
  std::vector<bf16> y, dx;
  std::vector<float> dw;
};

bool same_bits(const std::vector<bf16>& a, const std::vector<bf16>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(bf16)) == 0;
}
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

double rel_l2(const std::vector<bf16>& a, const std::vector<bf16>& b) {
  std::vector<float> fa(a.size()), fb(b.size());
  for (size_t i = 0; i < a.size(); ++i) fa[i] = bf16_bits_to_f32(bf16_bits(a[i]));
  for (size_t i = 0; i < b.size(); ++i) fb[i] = bf16_bits_to_f32(bf16_bits(b[i]));
  return relative_l2_error(fa.data(), fb.data(), static_cast<int64_t>(fa.size()));
}

size_t count(int64_t n) { return static_cast<size_t>(n); }

// The tensors of one layer's forward and backward (N outputs, K inputs per expert), on the device.
struct Operands {
  int64_t N, K;
  DeviceBuffer<int32_t> offsets{kG + 1};
  DeviceBuffer<bf16> x, w, dy, y, dx;
  DeviceBuffer<uint8_t> mx_codes, mx_scales;
  DeviceBuffer<float> dw;
  std::vector<float> dw_init;

  Operands(int64_t n, int64_t k)
      : N(n), K(k), x(count(kM * k)), w(count(kG * n * k)), dy(count(kM * n)), y(count(kM * n)), dx(count(kM * k)),
        mx_codes(count(kM * k / 2)), mx_scales(count(kM * k / kMxBlock)), dw(count(kG * n * k)) {
    x.upload(random_bf16(kM * K, 1.0f, 1));
    w.upload(random_bf16(kG * N * K, 0.02f, 2));
    dy.upload(random_bf16(kM * N, 1.0f, 3));
    std::mt19937 rng(4);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    dw_init.resize(static_cast<size_t>(kG * N * K));
    for (auto& v : dw_init) v = u(rng);
    bf16_to_mxfp4_row(x.ptr, kM, K, mx_codes.ptr, mx_scales.ptr, MxQuantConfig{}, nullptr, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
  }
  GroupLinearInput input(const Recipe& r) const {
    return r.mxfp4_input ? GroupLinearInput{nullptr, mx_codes.ptr, mx_scales.ptr}
                         : GroupLinearInput{x.ptr, nullptr, nullptr};
  }
  // Poisons Y and dX, restores the master gradient, sets the device offsets; done when it returns (the layer's
  // stream does not wait for the legacy stream these copies run on).
  void reset(const std::vector<int32_t>& split) {
    y.poison(0xFF);
    dx.poison(0xFF);
    dw.upload(dw_init);
    offsets.upload(split);
    CUDA_CHECK(cudaDeviceSynchronize());
  }
  Outputs outputs() const { return Outputs{y.download(), dx.download(), dw.download()}; }
};

void run_layer(GroupLinear& layer, const Operands& op, const Recipe& r, const GroupSplit& split, cudaStream_t s) {
  layer.forward(op.input(r), split, op.y.ptr, s);
  layer.backward(op.input(r), op.dy.ptr, split, op.dx.ptr, op.dw.ptr, s);
}

// (N, K): a shape the Hopper kernels take, and the tiny model's experts (the CUDA-core kernels).
using Shape = std::pair<int64_t, int64_t>;
class DeviceOnlySplit : public ::testing::TestWithParam<std::tuple<Recipe, Shape>> {};

std::string device_only_case_name(const ::testing::TestParamInfo<DeviceOnlySplit::ParamType>& info) {
  const Shape shape = std::get<1>(info.param);
  std::string name = recipe_name(std::get<0>(info.param));
  for (char& c : name)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return name + "_N" + std::to_string(shape.first) + "_K" + std::to_string(shape.second);
}

TEST_P(DeviceOnlySplit, OneCapturedGraphReplaysEveryRoutingLikeEagerRuns) {
  FP4MOE_REQUIRE_DEVICE();
  const Recipe recipe = std::get<0>(GetParam());
  const Shape shape = std::get<1>(GetParam());
  const int64_t kN = shape.first, kK = shape.second;
  SCOPED_TRACE(std::string("recipe ") + recipe_name(recipe) + ", N=" + std::to_string(kN) +
               " K=" + std::to_string(kK) +
               (grouped_gemm_sm90_unsupported(kN, kK, kG).empty() ? "" : " (CUDA-core expert GEMMs)"));
  Operands op(kN, kK);
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const GroupSplit device_only{op.offsets.ptr, nullptr, kG, kM};
  GroupLinear layer(kG, kN, kK, recipe, nullptr);
  Outputs eager[2];
  cudaGraphExec_t exec = nullptr;
  cudaGraph_t graph = nullptr;
  try {
    layer.set_weights(op.w.ptr, stream);
    const std::vector<int32_t>* splits[2] = {&kSplitA, &kSplitB};
    for (int i = 0; i < 2; ++i) {  // eager runs (the first also allocates every buffer the layer holds)
      op.reset(*splits[i]);
      run_layer(layer, op, recipe, device_only, stream);
      CUDA_CHECK(cudaStreamSynchronize(stream));
      eager[i] = op.outputs();
    }
    // The layer given the host copy of each split (its automatic paths may take cuBLASLt, which sums the same FP8
    // operands in another order): close, not equal.
    for (int i = 0; i < 2; ++i) {
      GroupLinear host_layer(kG, kN, kK, recipe, nullptr);
      host_layer.set_weights(op.w.ptr, stream);
      op.reset(*splits[i]);
      run_layer(host_layer, op, recipe, GroupSplit{op.offsets.ptr, splits[i]->data(), kG}, stream);
      CUDA_CHECK(cudaStreamSynchronize(stream));
      const Outputs host = op.outputs();
      const std::string what = std::string(" without the host copy against with it, split ") + "AB"[i];
      EXPECT_LT(rel_l2(eager[i].y, host.y), 5e-3) << "Y" << what;
      EXPECT_LT(rel_l2(eager[i].dx, host.dx), 5e-3) << "dX" << what;
      EXPECT_LT(relative_l2_error(eager[i].dw.data(), host.dw.data(), static_cast<int64_t>(host.dw.size())), 1e-3)
          << "dW" << what;
    }
    CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    try {
      run_layer(layer, op, recipe, device_only, stream);
    } catch (...) {
      cudaStreamEndCapture(stream, &graph);
      throw;
    }
    CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int round = 0; round < 2; ++round)  // A, B, A, B: the offsets change between replays, the graph does not
      for (int i = 0; i < 2; ++i) {
        op.reset(*splits[i]);
        CUDA_CHECK(cudaGraphLaunch(exec, stream));
        CUDA_CHECK(cudaStreamSynchronize(stream));
        const Outputs got = op.outputs();
        const std::string what = std::string("replay ") + std::to_string(round) + ", split " + "AB"[i];
        EXPECT_TRUE(same_bits(got.y, eager[i].y)) << what << ": Y differs from the eager run's";
        EXPECT_TRUE(same_bits(got.dx, eager[i].dx)) << what << ": dX differs from the eager run's";
        EXPECT_TRUE(same_bits(got.dw, eager[i].dw)) << what << ": dW differs from the eager run's";
      }
    // A test that cannot fail is a defect: the two routings must give different outputs.
    EXPECT_FALSE(same_bits(eager[0].y, eager[1].y)) << "splits A and B gave the same Y";
    EXPECT_FALSE(same_bits(eager[0].dx, eager[1].dx)) << "splits A and B gave the same dX";
    EXPECT_FALSE(same_bits(eager[0].dw, eager[1].dw)) << "splits A and B gave the same dW";
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw: " << e.what();
  }
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  CUDA_CHECK(cudaStreamDestroy(stream));
}

INSTANTIATE_TEST_SUITE_P(
    Recipes, DeviceOnlySplit,
    ::testing::Combine(::testing::Values(Recipe::bf16, Recipe::fp8, Recipe::mxfp4,
                                         parse_recipe("fp8 fprop=mxfp4 dgrad=mxfp4", "test")),
                       ::testing::Values(Shape(256, 384), Shape(32, 64))),
    device_only_case_name);

// Paper 2's MXFP4 Wgrad needs the counts on the host: it refuses a split without them, naming why, and launches
// nothing; so does a split with neither a host copy nor a token count.
TEST(DeviceOnlySplit, RecipesThatNeedHostCountsRefuseWithTheReason) {
  FP4MOE_REQUIRE_DEVICE();
  constexpr int64_t kN = 256, kK = 384;
  Operands op(kN, kK);
  op.reset(kSplitA);
  const GroupSplit device_only{op.offsets.ptr, nullptr, kG, kM};
  const auto expect_refused = [&](const Recipe& r, const std::string& fragment) {
    GroupLinear layer(kG, kN, kK, r, nullptr);
    layer.set_weights(op.w.ptr, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    op.y.poison(0xFF);
    try {
      layer.forward(op.input(r), device_only, op.y.ptr, nullptr);
      ADD_FAILURE() << recipe_name(r) << ": expected fp4moe::Error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << recipe_name(r) << ": " << e.what();
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    for (bf16 v : op.y.download()) ASSERT_EQ(bf16_bits(v), 0xFFFFu) << recipe_name(r) << ": Y was written";
  };
  expect_refused(parse_recipe("fp8 wgrad=mxfp4", "test"), "MXFP4 Wgrad");
  // Neither a host copy nor a token count.
  GroupLinear layer(kG, kN, kK, Recipe::fp8, nullptr);
  layer.set_weights(op.w.ptr, nullptr);
  EXPECT_THROW(layer.forward(op.input(Recipe::fp8), GroupSplit{op.offsets.ptr, nullptr, kG}, op.y.ptr, nullptr),
               Error);
}

}  // namespace
}  // namespace fp4moe
