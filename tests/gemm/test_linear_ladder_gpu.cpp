// Paper 2's ladder in the layers (trainer/model/recipe.h, group_linear.h) on the GPU:
//   - Linear with each GEMM class in fp8 or mxfp4 (the 7 combinations with an mxfp4 class), with RNE and no
//     transform, with SR + H16, and with SR + the random Hadamard transform: each mxfp4 class against the FP64
//     product of its MXFP4 operands made by the quantizers' CPU references with the layer's seeds (mxfp4_gemm_exact_ref
//     of bf16_to_mxfp4_row_ref / bf16_to_mxfp4_col_ref / bf16_to_mxfp4_col_ragged_ref), each fp8 class against the
//     fp8 recipe's reference (linear_ref.h): relative L2 < 1e-2 for the BF16 outputs Y and dX, < 2e-3 for dW
//     accumulated into a random FP32 grad (the tensor cores' accumulation; rows without exponent spread, so the
//     MXFP4 -> FP8 conversion is exact). Fresh random inputs: M = 256, N = 192, K = 320.
//   - Group Linear of routed experts with an MXFP4 Wgrad (4 ragged groups, one empty, sizes not multiples of 32):
//     Y and dX bit for bit those of the fp8 preset (the same FP8 GEMMs), dW per expert against the FP64 product of
//     the ragged column quantizer's references; with MXFP4 Fprop and Dgrad too (M and group sizes not multiples
//     of 4): Y and dX against the FP64 products of the row quantizer's and column quantizer's references per expert.
//   - tiny (configs/tiny.toml with 64-dimensional heads: an MXFP4 Dgrad blocks kv_down's 32 + 32 outputs) trains
//     with every combination of fp8/mxfp4 GEMM classes on attention, dense FFN, shared and routed experts, and
//     with SR, H16, H32 and RHT on the all-mxfp4 ladder: 30 AdamW steps on a fixed batch, every loss finite, the
//     mean of the last three below the first by more than 0.5 nats.
// Prefix LadderLinear: --gtest_filter='LadderLinear*' runs every test of this file.
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/common/check.h"
#include "kernels/formats/formats.h"
#include "kernels/gemm/cublaslt_matmul.h"
#include "kernels/gemm/mxfp4_gemm.h"
#include "kernels/nn/adamw.h"
#include "kernels/nn/cross_entropy.h"
#include "kernels/quant/bf16_to_mxfp4_col.h"
#include "kernels/quant/bf16_to_mxfp4_row.h"
#include "kernels/quant/layouts.h"
#include "kernels/quant/mx_random.h"
#include "tests/common/gpu_test_util.h"
#include "trainer/config.h"
#include "trainer/memory/device_memory.h"
#include "trainer/model/context.h"
#include "trainer/model/group_linear.h"
#include "trainer/model/linear.h"
#include "trainer/model/linear_ref.h"
#include "trainer/model/model.h"
#include "trainer/model/params.h"

namespace fp4moe {
namespace {

using test::DeviceBuffer;

std::vector<bf16> random_bf16(int64_t n, float stddev, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<bf16> v(static_cast<size_t>(n));
  for (auto& e : v) e = bf16_from_bits(f32_to_bf16_bits(dist(rng)));
  return v;
}

std::vector<float> to_float(const std::vector<bf16>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = bf16_bits_to_f32(bf16_bits(v[i]));
  return f;
}

double rel(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    num += d * d;
    den += want[i] * want[i];
  }
  return std::sqrt(num / den);  // NaN (an unwritten output) fails every comparison
}

std::vector<uint16_t> bits_of(const std::vector<bf16>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = bf16_bits(v[i]);
  return b;
}

std::vector<double> to_double(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

// The transpose of a row-major [R, C] BF16 matrix.
std::vector<bf16> transpose(const std::vector<bf16>& a, int64_t R, int64_t C) {
  std::vector<bf16> t(a.size());
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) t[static_cast<size_t>(c * R + r)] = a[static_cast<size_t>(r * C + c)];
  return t;
}

// An MXFP4 row tensor [R, L] on the host.
struct MxHost {
  std::vector<uint8_t> codes, scales;
  MxHost(int64_t R, int64_t L) : codes(static_cast<size_t>(R * L / 2)), scales(static_cast<size_t>(R * L / 32)) {}
  Mxfp4RowOperand op() const { return {codes.data(), scales.data()}; }
};

// The quantizer options group_linear.h states for a layer seed: RHT signs from stream 0, stochastic rounding of
// the first backward's Dgrad dY from stream 1 and its Wgrad dY from stream 2.
MxQuantConfig layer_cfg(const Recipe& r, uint64_t seed, bool gradient, uint64_t sr_stream) {
  MxQuantConfig c;
  c.transform = r.mx.transform;
  c.rht_seed = splitmix64_at(seed, 0);
  c.rounding = gradient ? r.mx.rounding : Rounding::rne;
  c.seed = splitmix64_at(seed, gradient ? sr_stream : 0);
  return c;
}

// MXFP4 column tensor of one group {0, M} of X [M, C] along tokens: [C, L], L = round_up(M, 32).
MxHost mx_columns(const std::vector<bf16>& x, int64_t M, int64_t C, const MxQuantConfig& cfg) {
  const int64_t L = mxfp4_col_group_ld(M);
  MxHost h(C, L);
  const int32_t offsets[2] = {0, static_cast<int32_t>(M)};
  bf16_to_mxfp4_col_ragged_ref(x.data(), M, C, offsets, 1, h.codes.data(), h.scales.data(), cfg);
  return h;
}

struct LadderCase {
  const char* name;
  const char* recipe;
};

void PrintTo(const LadderCase& c, std::ostream* os) { *os << c.name << " (" << c.recipe << ")"; }

class LadderLinear : public ::testing::TestWithParam<LadderCase> {};

TEST_P(LadderLinear, MatchesTheFp64ProductOfItsQuantizedOperands) {
  FP4MOE_REQUIRE_DEVICE();
  const Recipe r = parse_recipe(GetParam().recipe, "recipe");
  const int64_t M = 256, N = 192, K = 320;
  std::random_device fresh;
  const uint32_t s0 = fresh();
  SCOPED_TRACE("input seed " + std::to_string(s0));
  const std::vector<bf16> x = random_bf16(M * K, 1.0f, s0), w = random_bf16(N * K, 0.02f, s0 + 1),
                          dy = random_bf16(M * N, 1.0f, s0 + 2);
  std::vector<float> grad0(static_cast<size_t>(N * K));
  {
    std::mt19937 rng(s0 + 3);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (auto& g : grad0) g = u(rng);
  }

  DeviceMemory mem;
  CublasLtMatmul lt;
  ParamStore store;
  Linear linear(store, "lin", K, N, r, 0.02f);
  store.allocate(mem);
  ModelContext ctx{nullptr, &lt, &mem};
  ctx.quant_seed = 0x5EEDull + s0;  // as Model::begin_step would set it
  const uint64_t seed = layer_quant_seed(ctx.quant_seed, "lin");
  CUDA_CHECK(cudaMemcpy(linear.weight().param, w.data(), w.size() * sizeof(bf16), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(linear.weight().grad, grad0.data(), grad0.size() * sizeof(float), cudaMemcpyHostToDevice));
  DeviceBuffer<bf16> d_x(M * K), d_dy(M * N), d_y(M * N), d_dx(M * K);
  d_x.upload(x);
  d_dy.upload(dy);
  d_y.poison(0xFF);
  d_dx.poison(0xFF);
  linear.forward(ctx, d_x.ptr, M, d_y.ptr);
  linear.backward(ctx, d_dy.ptr, nullptr, M, LinearGradOut{d_dx.ptr, false, false});
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> y = to_float(d_y.download()), dx = to_float(d_dx.download());
  std::vector<float> g(grad0.size());
  CUDA_CHECK(cudaMemcpy(g.data(), linear.weight().grad, g.size() * sizeof(float), cudaMemcpyDeviceToHost));

  // fp8 classes: the fp8 recipe's reference.
  std::vector<float> y8, dx8, dw8;
  linear_recipe_ref(linear_recipe_operands(Recipe::fp8, x.data(), w.data(), dy.data(), M, N, K), M, N, K, y8, dx8,
                    dw8);
  std::vector<double> y_ref = to_double(y8), dx_ref = to_double(dx8), dw_ref = to_double(dw8);
  if (r.fprop == GemmPrecision::mxfp4) {
    MxHost xq(M, K), wq(N, K);
    bf16_to_mxfp4_row_ref(x.data(), M, K, xq.codes.data(), xq.scales.data(), layer_cfg(r, seed, false, 0));
    bf16_to_mxfp4_row_ref(w.data(), N, K, wq.codes.data(), wq.scales.data(), layer_cfg(r, seed, false, 0));
    mxfp4_gemm_exact_ref(xq.op(), wq.op(), M, N, K, y_ref.data());
  }
  if (r.dgrad == GemmPrecision::mxfp4) {
    MxHost dq(M, N), wt(K, N);
    bf16_to_mxfp4_row_ref(dy.data(), M, N, dq.codes.data(), dq.scales.data(), layer_cfg(r, seed, true, 1));
    bf16_to_mxfp4_col_ref(w.data(), N, K, wt.codes.data(), wt.scales.data(), layer_cfg(r, seed, false, 0));
    mxfp4_gemm_exact_ref(dq.op(), wt.op(), M, K, N, dx_ref.data());
  }
  if (r.wgrad == GemmPrecision::mxfp4) {
    const MxHost dq = mx_columns(dy, M, N, layer_cfg(r, seed, true, 2));
    const MxHost xq = mx_columns(x, M, K, layer_cfg(r, seed, false, 0));
    mxfp4_gemm_exact_ref(dq.op(), xq.op(), N, K, mxfp4_col_group_ld(M), dw_ref.data());
  }
  for (size_t i = 0; i < dw_ref.size(); ++i) dw_ref[i] += grad0[i];
  const double ey = rel(y, y_ref), ex = rel(dx, dx_ref), ew = rel(g, dw_ref);
  std::printf("[ %s ] relative L2 to the reference: Fprop %.2e Dgrad %.2e Wgrad %.2e\n", GetParam().name, ey, ex, ew);
  EXPECT_LT(ey, 1e-2);
  EXPECT_LT(ex, 1e-2);
  EXPECT_LT(ew, 2e-3);
}

INSTANTIATE_TEST_SUITE_P(
    LadderLinearClasses, LadderLinear,
    ::testing::Values(LadderCase{"fprop", "fp8 fprop=mxfp4"}, LadderCase{"dgrad", "fp8 dgrad=mxfp4"},
                      LadderCase{"wgrad", "fp8 wgrad=mxfp4"}, LadderCase{"fprop_dgrad", "fp8 fprop=mxfp4 dgrad=mxfp4"},
                      LadderCase{"fprop_wgrad", "fp8 fprop=mxfp4 wgrad=mxfp4"},
                      LadderCase{"dgrad_wgrad", "fp8 dgrad=mxfp4 wgrad=mxfp4"},
                      LadderCase{"all", "fp8 fprop=mxfp4 dgrad=mxfp4 wgrad=mxfp4"},
                      LadderCase{"all_sr_h16", "fp8 fprop=mxfp4 dgrad=mxfp4 wgrad=mxfp4 rounding=sr transform=h16"},
                      LadderCase{"all_h32", "fp8 fprop=mxfp4 dgrad=mxfp4 wgrad=mxfp4 transform=h32"},
                      LadderCase{"all_sr_rht", "fp8 fprop=mxfp4 dgrad=mxfp4 wgrad=mxfp4 rounding=sr transform=rht"}),
    [](const ::testing::TestParamInfo<LadderCase>& info) { return std::string(info.param.name); });

// ---- Group Linear of routed experts ----

// dW_g = dY_g^T X_g of the MXFP4 column tensors (the ragged quantizer's reference, the layer's seeds), per expert,
// against dw [G, N, K] accumulated from zero: relative L2 < 2e-3; an empty expert's dW stays 0.
void expect_mxfp4_wgrad(const Recipe& r, uint64_t seed, const std::vector<bf16>& x, const std::vector<bf16>& dy,
                        const std::vector<int32_t>& offsets, int64_t N, int64_t K, const std::vector<float>& dw) {
  const int64_t G = static_cast<int64_t>(offsets.size()) - 1, M = offsets[G];
  const MxQuantConfig dy_cfg = layer_cfg(r, seed, true, 2), x_cfg = layer_cfg(r, seed, false, 0);
  std::vector<uint8_t> dyc(static_cast<size_t>(mxfp4_col_codes_capacity(M, N, G))),
      dys(static_cast<size_t>(mxfp4_col_scales_capacity(M, N, G))),
      xc(static_cast<size_t>(mxfp4_col_codes_capacity(M, K, G))),
      xs(static_cast<size_t>(mxfp4_col_scales_capacity(M, K, G)));
  bf16_to_mxfp4_col_ragged_ref(dy.data(), M, N, offsets.data(), G, dyc.data(), dys.data(), dy_cfg);
  bf16_to_mxfp4_col_ragged_ref(x.data(), M, K, offsets.data(), G, xc.data(), xs.data(), x_cfg);
  int64_t P = 0;  // padded tokens before group g
  for (int64_t g = 0; g < G; ++g) {
    const int64_t L = mxfp4_col_group_ld(offsets[g + 1] - offsets[g]);
    const std::vector<float> got(dw.begin() + g * N * K, dw.begin() + (g + 1) * N * K);
    if (L == 0) {
      for (float v : got) EXPECT_EQ(v, 0.0f) << "expert " << g << " has no tokens";
      continue;
    }
    std::vector<double> want(static_cast<size_t>(N * K));
    mxfp4_gemm_exact_ref({dyc.data() + N * P / 2, dys.data() + N * P / 32},
                         {xc.data() + K * P / 2, xs.data() + K * P / 32}, N, K, L, want.data());
    EXPECT_LT(rel(got, want), 2e-3) << "expert " << g;
    P += L;
  }
}

// An MXFP4 row tensor [R, C] quantized by the row quantizer's reference and dequantized to FP64.
std::vector<double> mx_rows_f64(const bf16* x, int64_t R, int64_t C, const MxQuantConfig& cfg) {
  MxHost h(R, C);
  bf16_to_mxfp4_row_ref(x, R, C, h.codes.data(), h.scales.data(), cfg);
  std::vector<double> v(static_cast<size_t>(R * C));
  mxfp4_dequantize_f64_ref(h.op(), R, C, v.data());
  return v;
}

TEST(LadderLinearGrouped, Mxfp4FpropDgradWgradOverRaggedExperts) {
  // Every class in mxfp4 over 4 ragged experts (one empty, sizes and M not multiples of 4 or 32: the grouped
  // GEMM's ragged tails; N = 192 and K = 320 span several 128-blocks, the last one short, so that the weights'
  // per-expert scale tensors [ceil(R/128), P] are exercised along both axes): Y_g = X_g W_g^T and dX_g = dY_g W_g
  // against the FP64 products of the MXFP4 operands the quantizers' references make with the layer's seeds,
  // relative L2 < 1e-2; dW as expect_mxfp4_wgrad.
  FP4MOE_REQUIRE_DEVICE();
  for (const char* text : {"fp8 fprop=mxfp4 dgrad=mxfp4 wgrad=mxfp4",
                           "fp8 fprop=mxfp4 dgrad=mxfp4 wgrad=mxfp4 rounding=sr transform=rht",
                           "fp8 fprop=mxfp4 dgrad=mxfp4 transform=h16"}) {
    SCOPED_TRACE(text);
    const Recipe r = parse_recipe(text, "recipe");
    const int64_t G = 4, N = 192, K = 320;
    const std::vector<int32_t> offsets = {0, 37, 37, 130, 203};
    const int64_t M = offsets[G];
    std::random_device fresh;
    const uint32_t s0 = fresh();
    SCOPED_TRACE("input seed " + std::to_string(s0));
    const std::vector<bf16> x = random_bf16(M * K, 1.0f, s0), w = random_bf16(G * N * K, 0.05f, s0 + 1),
                            dy = random_bf16(M * N, 1.0f, s0 + 2);
    DeviceBuffer<bf16> d_x(M * K), d_w(G * N * K), d_dy(M * N), d_y(M * N), d_dx(M * K);
    DeviceBuffer<int32_t> d_off(G + 1);
    DeviceBuffer<float> d_dw(G * N * K);
    d_x.upload(x);
    d_w.upload(w);
    d_dy.upload(dy);
    d_off.upload(offsets);
    d_y.poison(0xFF);
    d_dx.poison(0xFF);
    d_dw.upload(std::vector<float>(static_cast<size_t>(G * N * K), 0.0f));
    const GroupSplit split{d_off.ptr, offsets.data(), G};
    const uint64_t seed = 0x1234ull + s0;
    GroupLinear layer(G, N, K, r, nullptr);
    layer.set_quant_seed(seed);
    layer.set_weights(d_w.ptr, nullptr);
    layer.forward(GroupLinearInput{d_x.ptr}, split, d_y.ptr, nullptr);
    layer.backward(GroupLinearInput{d_x.ptr}, d_dy.ptr, split, d_dx.ptr, d_dw.ptr, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());

    const MxQuantConfig rne = layer_cfg(r, seed, false, 0);
    const std::vector<double> xd = mx_rows_f64(x.data(), M, K, rne), wd = mx_rows_f64(w.data(), G * N, K, rne),
                              dyd = mx_rows_f64(dy.data(), M, N, layer_cfg(r, seed, true, 1));
    std::vector<double> wtd;  // each expert's W^T [K, N], quantized along N (bf16_to_mxfp4_col_ref)
    for (int64_t g = 0; g < G; ++g) {
      MxHost h(K, N);
      bf16_to_mxfp4_col_ref(w.data() + g * N * K, N, K, h.codes.data(), h.scales.data(), rne);
      std::vector<double> v(static_cast<size_t>(K * N));
      mxfp4_dequantize_f64_ref(h.op(), K, N, v.data());
      wtd.insert(wtd.end(), v.begin(), v.end());
    }
    std::vector<double> y_ref(static_cast<size_t>(M * N), 0.0), dx_ref(static_cast<size_t>(M * K), 0.0);
    for (int64_t g = 0; g < G; ++g)
      for (int64_t m = offsets[g]; m < offsets[g + 1]; ++m) {
        for (int64_t n = 0; n < N; ++n)
          for (int64_t k = 0; k < K; ++k) y_ref[m * N + n] += xd[m * K + k] * wd[(g * N + n) * K + k];
        for (int64_t k = 0; k < K; ++k)
          for (int64_t n = 0; n < N; ++n) dx_ref[m * K + k] += dyd[m * N + n] * wtd[(g * K + k) * N + n];
      }
    const double ey = rel(to_float(d_y.download()), y_ref), ex = rel(to_float(d_dx.download()), dx_ref);
    std::printf("[ grouped %s ] relative L2: Fprop %.2e Dgrad %.2e\n", text, ey, ex);
    EXPECT_LT(ey, 1e-2);
    EXPECT_LT(ex, 1e-2);
    if (r.wgrad == GemmPrecision::mxfp4) expect_mxfp4_wgrad(r, seed, x, dy, offsets, N, K, d_dw.download());
  }
}

TEST(LadderLinearGrouped, Mxfp4WgradOverRaggedExperts) {
  FP4MOE_REQUIRE_DEVICE();
  for (const char* text : {"fp8 wgrad=mxfp4", "fp8 wgrad=mxfp4 rounding=sr transform=rht"}) {
    SCOPED_TRACE(text);
    const Recipe r = parse_recipe(text, "recipe");
    const int64_t G = 4, N = 64, K = 96;
    const std::vector<int32_t> offsets = {0, 37, 37, 130, 200};  // an empty expert, sizes not multiples of 32
    const int64_t M = offsets[G];
    std::random_device fresh;
    const uint32_t s0 = fresh();
    SCOPED_TRACE("input seed " + std::to_string(s0));
    const std::vector<bf16> x = random_bf16(M * K, 1.0f, s0), w = random_bf16(G * N * K, 0.05f, s0 + 1),
                            dy = random_bf16(M * N, 1.0f, s0 + 2);
    DeviceBuffer<bf16> d_x(M * K), d_w(G * N * K), d_dy(M * N), d_y(M * N), d_dx(M * K), e_y(M * N), e_dx(M * K);
    DeviceBuffer<int32_t> d_off(G + 1);
    DeviceBuffer<float> d_dw(G * N * K), e_dw(G * N * K);
    d_x.upload(x);
    d_w.upload(w);
    d_dy.upload(dy);
    d_off.upload(offsets);
    d_dw.upload(std::vector<float>(static_cast<size_t>(G * N * K), 0.0f));
    e_dw.upload(std::vector<float>(static_cast<size_t>(G * N * K), 0.0f));
    const GroupSplit split{d_off.ptr, offsets.data(), G};
    const uint64_t seed = 0xABCDull + s0;
    GroupLinear ladder(G, N, K, r, nullptr), fp8(G, N, K, Recipe::fp8, nullptr);
    ladder.set_quant_seed(seed);
    for (GroupLinear* gl : {&ladder, &fp8}) gl->set_weights(d_w.ptr, nullptr);
    ladder.forward(GroupLinearInput{d_x.ptr}, split, d_y.ptr, nullptr);
    ladder.backward(GroupLinearInput{d_x.ptr}, d_dy.ptr, split, d_dx.ptr, d_dw.ptr, nullptr);
    fp8.forward(GroupLinearInput{d_x.ptr}, split, e_y.ptr, nullptr);
    fp8.backward(GroupLinearInput{d_x.ptr}, d_dy.ptr, split, e_dx.ptr, e_dw.ptr, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(bits_of(d_y.download()), bits_of(e_y.download())) << "Fprop stays the fp8 one";
    EXPECT_EQ(bits_of(d_dx.download()), bits_of(e_dx.download())) << "Dgrad stays the fp8 one";

    expect_mxfp4_wgrad(r, seed, x, dy, offsets, N, K, d_dw.download());
  }
}

// ---- tiny with every combination of GEMM classes ----

std::string tiny_config_path() {
  const auto p = std::filesystem::path(FP4MOE_SOURCE_DIR) / "configs" / "tiny.toml";
  return std::filesystem::exists(p) ? p.string() : std::string("configs/tiny.toml");
}

// The ladder recipe of one combination: "fp8 fprop=.. dgrad=.. wgrad=.. [options]".
std::string combination(int bits, const std::string& options) {
  const auto p = [&](int bit) { return (bits >> bit) & 1 ? "mxfp4" : "fp8"; };
  return std::string("fp8 fprop=") + p(0) + " dgrad=" + p(1) + " wgrad=" + p(2) + (options.empty() ? "" : " ") +
         options;
}

struct TinyCase {
  int bits;             // bit 0 Fprop, 1 Dgrad, 2 Wgrad in mxfp4
  const char* options;  // rounding and transform
};

void PrintTo(const TinyCase& c, std::ostream* os) { *os << combination(c.bits, c.options); }

class LadderLinearTiny : public ::testing::TestWithParam<TinyCase> {};

TEST_P(LadderLinearTiny, TrainsAndItsLossFalls) {
  FP4MOE_REQUIRE_DEVICE();
  const std::string linear = combination(GetParam().bits, GetParam().options);
  const std::string routed = linear;  // the routed experts (Group Linear over ragged groups) follow every class
  SCOPED_TRACE("linear layers '" + linear + "', routed experts '" + routed + "'");
  TrainerConfig cfg;
  try {
    cfg = parse_config_args({"--config", tiny_config_path(), "--model.qk_nope_head_dim", "32",
                             "--model.qk_rope_head_dim", "32", "--model.v_head_dim", "64", "--recipe.attention",
                             linear, "--recipe.dense_mlp", linear, "--recipe.shared_experts", linear,
                             "--recipe.routed_experts", routed});
  } catch (const std::exception& e) {
    FAIL() << "the configuration was refused: " << e.what();
  }
  const int64_t B = cfg.train.micro_batch, T = cfg.train.seq_len, M = B * T;
  DeviceMemory mem;
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreate(&stream));
  std::vector<float> losses;
  float final_loss = NAN;
  try {
    Model model(cfg, mem, stream);
    model.init_weights(cfg.train.seed);
    std::mt19937 rng(5);  // a fixed batch: tokens from 32 ids, targets the next token
    std::vector<int32_t> tok(static_cast<size_t>(M)), tgt(static_cast<size_t>(M));
    for (auto& t : tok) t = static_cast<int32_t>(rng() % 32);
    for (int64_t m = 0; m < M; ++m) tgt[m] = (m + 1) % T == 0 ? kIgnoreIndex : tok[m + 1];
    DeviceBuffer<int32_t> tokens(M), targets(M);
    tokens.upload(tok);
    targets.upload(tgt);
    ParamStore& store = model.params();
    for (int64_t step = 1; step <= 30; ++step) {
      model.begin_step(static_cast<uint64_t>(step));
      store.zero_grads(stream);
      losses.push_back(model.forward_backward(tokens.ptr, targets.ptr, B, 1.0f).loss);
      for (Param& p : store.params()) {
        const AdamWConfig opt{2e-3f, 0.9f, 0.95f, 1e-8f, p.decay ? 0.1f : 0.0f, step};
        adamw_step(AdamWTensor{p.master, p.param, p.grad, p.m, p.v, p.n}, opt, nullptr, stream);
      }
      model.end_step();
    }
    CUDA_CHECK(cudaStreamSynchronize(stream));
    final_loss = (losses[27] + losses[28] + losses[29]) / 3;
  } catch (const std::exception& e) {
    cudaStreamDestroy(stream);
    FAIL() << "training threw: " << e.what();
  }
  cudaStreamDestroy(stream);
  std::printf("[ %s ] losses %s\n", linear.c_str(), ::testing::PrintToString(losses).c_str());
  for (float l : losses) EXPECT_TRUE(std::isfinite(l));
  EXPECT_LT(final_loss, losses[0] - 0.5f) << ::testing::PrintToString(losses);
}

INSTANTIATE_TEST_SUITE_P(LadderLinearCombinations, LadderLinearTiny,
                         ::testing::Values(TinyCase{1, ""}, TinyCase{2, ""}, TinyCase{3, ""}, TinyCase{4, ""},
                                           TinyCase{5, ""}, TinyCase{6, ""}, TinyCase{7, ""},
                                           TinyCase{7, "rounding=sr"}, TinyCase{7, "transform=h16"},
                                           TinyCase{7, "transform=h32"}, TinyCase{7, "transform=rht"},
                                           TinyCase{7, "rounding=sr transform=rht"}),
                         [](const ::testing::TestParamInfo<TinyCase>& info) {
                           std::string s = "c" + std::to_string(info.param.bits);
                           for (const char* c = info.param.options; *c; ++c)
                             s += std::isalnum(static_cast<unsigned char>(*c)) ? *c : '_';
                           return s;
                         });

}  // namespace
}  // namespace fp4moe
