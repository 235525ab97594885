// Group Linear (trainer/model/group_linear.h): forward and backward of each recipe against the CPU reference built
// from the CPU references of the same quantizers (kernels/quant/) and the grouped GEMM reference, so that a wrong
// operand, layout or transpose anywhere in the chain shows up. Outputs are poisoned before the run; the FP32
// master gradient starts from random values and must come back as those plus dW.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tests/common/gpu_test_util.h"
#include "tests/common/param_printers.h"
#include "kernels/common/check.h"
#include "kernels/common/types.h"
#include "kernels/formats/formats.h"
#include "kernels/gemm/grouped_gemm_ref.h"
#include "kernels/quant/bf16_to_fp8.h"
#include "kernels/quant/bf16_to_mxfp4_row.h"
#include "kernels/quant/layouts.h"
#include "kernels/quant/mxfp4_row_to_fp8_col.h"
#include "kernels/quant/mxfp4_row_to_fp8_row.h"
#include "trainer/model/group_linear.h"

namespace fp4moe {
namespace {

using test::DeviceBuffer;

// Seeded BF16 values: a normal times a per-row power of two in 2^[-3, 3] (tokens of different magnitude).
std::vector<bf16> random_bf16(int64_t rows, int64_t cols, float stddev, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  std::uniform_int_distribution<int> row_exp(-3, 3);
  std::vector<bf16> v(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const float s = exp2_exact(row_exp(rng));
    for (int64_t c = 0; c < cols; ++c) v[r * cols + c] = bf16_from_bits(f32_to_bf16_bits(normal(rng) * s));
  }
  return v;
}

std::vector<float> to_float(const std::vector<bf16>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = bf16_bits_to_f32(bf16_bits(v[i]));
  return f;
}

template <typename T>
std::unique_ptr<DeviceBuffer<T>> upload(const std::vector<T>& h) {
  auto d = std::make_unique<DeviceBuffer<T>>(h.size());
  d->upload(h);
  return d;
}

// Relative L2 error per expert group of a token-row tensor [M, C], all below tol; every element finite.
void expect_rows_close(const std::string& what, const std::vector<float>& got, const std::vector<float>& want,
                       int64_t C, const std::vector<int32_t>& offsets, double tol) {
  for (size_t g = 0; g + 1 < offsets.size(); ++g) {
    const int64_t a = offsets[g] * C, n = (offsets[g + 1] - offsets[g]) * C;
    if (n == 0) continue;
    const double err = relative_l2_error(got.data() + a, want.data() + a, n);
    EXPECT_LT(err, tol) << what << ": expert group " << g << " (" << offsets[g + 1] - offsets[g]
                        << " rows): relative L2 error " << err << " (NaN: a poisoned element was left unwritten)";
  }
}

std::vector<float> download_bf16(const DeviceBuffer<bf16>& d) { return to_float(d.download()); }

class Recipes : public ::testing::TestWithParam<Recipe> {};

TEST_P(Recipes, ForwardAndBackwardMatchTheQuantizedReference) {
  FP4MOE_REQUIRE_DEVICE();
  const Recipe recipe = GetParam();
  const int64_t N = 256, K = 576;
  const std::vector<int32_t> offsets = {0, 162, 162, 2739, 3185, 3185, 3268};  // [162, 0, 2577, 446, 0, 83]
  const int64_t G = 6, M = offsets[G];
  SCOPED_TRACE(std::string("recipe ") + recipe_name(recipe));

  const std::vector<bf16> x = random_bf16(M, K, 1.0f, 1), w = random_bf16(G * N, K, 0.02f, 2),
                          dy = random_bf16(M, N, 1.0f, 3);
  std::vector<float> dw_init(G * N * K);
  {
    std::mt19937 rng(4);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (auto& v : dw_init) v = u(rng);
  }

  // ---- reference operands: exactly what each recipe feeds its GEMMs ----
  std::vector<float> xf = to_float(x), wf = to_float(w), dyf = to_float(dy);
  std::vector<float> x_fprop = xf, w_fprop = wf, dy_dgrad = dyf, w_dgrad = wf, dy_wgrad = dyf, x_wgrad = xf;
  std::vector<uint8_t> mx_codes(M * K / 2), mx_scales(M * K / kMxBlock);
  if (recipe != Recipe::bf16) {
    const Fp8ScaleMode mode = Fp8ScaleMode::pow2;
    std::vector<uint8_t> codes;
    std::vector<float> scales;
    // Fprop: X row (BF16 -> FP8, or MXFP4 -> FP8 direct), W 128x128.
    codes.assign(M * K, 0);
    scales.assign(fp8_row_scale_count(M, K), 0.0f);
    if (recipe == Recipe::mxfp4) {
      bf16_to_mxfp4_row_ref(x.data(), M, K, mx_codes.data(), mx_scales.data(), MxQuantConfig{});
      mxfp4_row_to_fp8_row_ref(mx_codes.data(), mx_scales.data(), M, K, codes.data(), scales.data());
    } else {
      bf16_to_fp8_row_ref(x.data(), M, K, mode, codes.data(), scales.data());
    }
    fp8_row_dequantize_ref(codes.data(), scales.data(), M, K, x_fprop.data());
    codes.assign(N * K, 0);
    std::vector<float> wt(K * N);
    for (int64_t g = 0; g < G; ++g) {
      scales.assign(fp8_block_scale_count(N, K), 0.0f);
      bf16_to_fp8_block128_ref(w.data() + g * N * K, N, K, mode, false, codes.data(), scales.data());
      fp8_block128_dequantize_ref(codes.data(), scales.data(), N, K, false, w_fprop.data() + g * N * K);
      scales.assign(fp8_block_scale_count(K, N), 0.0f);
      bf16_to_fp8_block128_ref(w.data() + g * N * K, N, K, mode, true, codes.data(), scales.data());
      fp8_block128_dequantize_ref(codes.data(), scales.data(), N, K, true, wt.data());
      for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < K; ++k) w_dgrad[(g * N + n) * K + k] = wt[k * N + n];
    }
    // Dgrad: dY row.
    codes.assign(M * N, 0);
    scales.assign(fp8_row_scale_count(M, N), 0.0f);
    bf16_to_fp8_row_ref(dy.data(), M, N, mode, codes.data(), scales.data());
    fp8_row_dequantize_ref(codes.data(), scales.data(), M, N, dy_dgrad.data());
    // Wgrad: dY and X as columns over the groups.
    codes.assign(fp8_col_codes_capacity(M, N, G), 0);
    scales.assign(fp8_col_scales_capacity(M, N, G), 0.0f);
    bf16_to_fp8_col_ref(dy.data(), M, N, offsets.data(), G, mode, codes.data(), scales.data());
    fp8_col_dequantize_ref(codes.data(), scales.data(), M, N, offsets.data(), G, dy_wgrad.data());
    codes.assign(fp8_col_codes_capacity(M, K, G), 0);
    scales.assign(fp8_col_scales_capacity(M, K, G), 0.0f);
    if (recipe == Recipe::mxfp4)
      mxfp4_row_to_fp8_col_ref(mx_codes.data(), mx_scales.data(), M, K, offsets.data(), G, codes.data(),
                               scales.data());
    else
      bf16_to_fp8_col_ref(x.data(), M, K, offsets.data(), G, mode, codes.data(), scales.data());
    fp8_col_dequantize_ref(codes.data(), scales.data(), M, K, offsets.data(), G, x_wgrad.data());
  }
  std::vector<float> y_ref(M * N), dx_ref(M * K), dw_ref(G * N * K);
  grouped_fprop_ref(x_fprop.data(), w_fprop.data(), M, N, K, offsets.data(), G, y_ref.data());
  grouped_dgrad_ref(dy_dgrad.data(), w_dgrad.data(), M, N, K, offsets.data(), G, dx_ref.data());
  grouped_wgrad_ref(dy_wgrad.data(), x_wgrad.data(), M, N, K, offsets.data(), G, dw_ref.data());
  for (int64_t i = 0; i < G * N * K; ++i) dw_ref[i] += dw_init[i];

  // ---- the layer on the GPU ----
  auto d_offsets = upload(offsets);
  auto d_x = upload(x);
  auto d_w = upload(w);
  auto d_dy = upload(dy);
  auto d_mx_codes = upload(mx_codes);
  auto d_mx_scales = upload(mx_scales);
  DeviceBuffer<bf16> d_y(M * N), d_dx(M * K);
  DeviceBuffer<float> d_dw(G * N * K);
  d_y.poison(0xFF);
  d_dx.poison(0xFF);
  d_dw.upload(dw_init);

  const GroupSplit split{d_offsets->ptr, offsets.data(), G};
  GroupLinear layer(G, N, K, recipe, nullptr);
  GroupLinearInput in;
  if (recipe == Recipe::mxfp4) in = GroupLinearInput{nullptr, d_mx_codes->ptr, d_mx_scales->ptr};
  else in.x = d_x->ptr;
  try {
    layer.set_weights(d_w->ptr, nullptr);
    layer.forward(in, split, d_y.ptr, nullptr);
    layer.backward(in, d_dy->ptr, split, d_dx.ptr, d_dw.ptr, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
  } catch (const std::exception& e) {
    FAIL() << "GroupLinear threw: " << e.what();
  }
  expect_rows_close("forward Y", download_bf16(d_y), y_ref, N, offsets, 1e-2);
  expect_rows_close("backward dX", download_bf16(d_dx), dx_ref, K, offsets, 1e-2);
  const std::vector<float> dw = d_dw.download();
  for (int64_t g = 0; g < G; ++g) {
    const double err = relative_l2_error(dw.data() + g * N * K, dw_ref.data() + g * N * K, N * K);
    EXPECT_LT(err, 1e-3) << "backward dW (accumulated into the FP32 master gradient), expert " << g << " ("
                         << offsets[g + 1] - offsets[g] << " tokens): relative L2 error " << err;
  }
}

INSTANTIATE_TEST_SUITE_P(AllRecipes, Recipes,
                         ::testing::Values(Recipe::bf16, Recipe::fp8, Recipe::mxfp4),
                         [](const ::testing::TestParamInfo<Recipe>& info) {
                           return std::string(recipe_name(info.param));
                         });

TEST(GroupLinear, RejectsMisuse) {
  FP4MOE_REQUIRE_DEVICE();
  EXPECT_THROW(GroupLinear(2, 128, 48, Recipe::mxfp4, nullptr), Error);  // K % 32 != 0
  EXPECT_THROW(GroupLinear(0, 128, 128, Recipe::fp8, nullptr), Error);
  Recipe bf16_wgrad = Recipe::fp8;  // not a preset: not built yet
  bf16_wgrad.wgrad = GemmPrecision::bf16;
  EXPECT_THROW(GroupLinear(2, 128, 128, bf16_wgrad, nullptr), Error);
  GroupLinearAllocator half;  // allocate without release
  half.allocate = [](size_t, GroupLinearBuffer) -> void* { return nullptr; };
  EXPECT_THROW(GroupLinear(2, 128, 128, Recipe::fp8, nullptr, half), Error);
  GroupLinear layer(2, 128, 128, Recipe::fp8, nullptr);
  const std::vector<int32_t> offsets = {0, 3, 8};
  auto d_offsets = upload(offsets);
  DeviceBuffer<bf16> buf(8 * 128);
  const GroupSplit split{d_offsets->ptr, offsets.data(), 2};
  EXPECT_THROW(layer.forward(GroupLinearInput{buf.ptr, nullptr, nullptr}, split, buf.ptr, nullptr), Error);  // no W
  EXPECT_THROW(layer.backward(GroupLinearInput{}, buf.ptr, split, buf.ptr, nullptr, nullptr), Error);  // no forward
  // bf16 Wgrad reads the forward's X, which backward must be given.
  GroupLinear bf(2, 128, 128, Recipe::bf16, nullptr);
  DeviceBuffer<float> dw(2 * 128 * 128);
  DeviceBuffer<bf16> w(2 * 128 * 128), y(8 * 128);  // any values: only the rejection is checked
  bf.set_weights(w.ptr, nullptr);
  bf.forward(GroupLinearInput{buf.ptr, nullptr, nullptr}, split, y.ptr, nullptr);
  EXPECT_THROW(bf.backward(GroupLinearInput{}, buf.ptr, split, nullptr, dw.ptr, nullptr), Error);
}

}  // namespace
}  // namespace fp4moe
