// MXFP4 x MXFP4 GEMMs on FP8 tensor cores (kernels/gemm/mxfp4_gemm.h) against FP64 products of the dequantized
// MXFP4 operands: dense (BF16 and FP32 outputs, accumulation), edge cases without NaN (all-zero blocks and
// operands, +-6 at large and small block exponents, -0), the exponent spread > 14 where the conversion rounds,
// both operands transformed along K (h16, h32, rht: the product of the inverse-rotated dequantized operands), and
// the grouped Wgrad over ragged experts from the column quantizer.
//
// Tolerance (mxfp4_gemm.h "Accumulation"): the FP8 products are exact; within a 128-group the tensor cores add at
// most four MMA steps of 32 products into an accumulator that keeps about 13 bits (DeepSeek-V3 report sec. 3.3.2:
// about 14), at most 4 x 2^-13 = 2^-11 of the group's sum of |products|, and cuBLASLt adds the groups in FP32
// (K 2^-24). Bound, with a factor 2 of margin: |y - y64| <= (2^-10 + K 2^-24) sum_k |a_k b_k|, plus the output
// rounding (2^-8 |y64| for BF16, 2^-24 |y64| for FP32) and, with accumulation, 2^-24 of the prior value.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels/common/check.h"
#include "kernels/common/types.h"
#include "kernels/formats/formats.h"
#include "kernels/gemm/mxfp4_gemm.h"
#include "kernels/quant/bf16_to_mxfp4_col.h"
#include "kernels/quant/bf16_to_mxfp4_row.h"
#include "kernels/quant/layouts.h"
#include "kernels/quant/mx_transform.h"
#include "tests/common/gpu_test_util.h"
#include "tests/common/mx_test_util.h"

namespace fp4moe {
namespace {

using test::DeviceBuffer;
using test::MxTensor;
using test::random_mx;

constexpr double kAccumulation = 0x1.0p-10;  // per sum of |products| of a 128-group (tensor-core accumulator)
constexpr double kFp32Step = 0x1.0p-24;      // per added term in FP32, and the FP32 output rounding
constexpr double kBf16Out = 0x1.0p-8;        // the BF16 output rounding, relative

std::vector<double> dequantize(const MxTensor& t) {
  std::vector<double> v(static_cast<size_t>(t.R * t.K));
  mxfp4_dequantize_f64_ref(t.op(), t.R, t.K, v.data());
  return v;
}

// sum_k |a_k b_k| for every output element: the scale of the accumulation error.
std::vector<double> abs_products(const std::vector<double>& a, const std::vector<double>& b, int64_t M, int64_t N,
                                 int64_t K) {
  std::vector<double> s(static_cast<size_t>(M * N), 0.0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) s[m * N + n] += std::fabs(a[m * K + k] * b[n * K + k]);
  return s;
}

template <typename T>
std::unique_ptr<DeviceBuffer<T>> on_device(const std::vector<T>& h) {
  auto d = std::make_unique<DeviceBuffer<T>>(h.size());
  d->upload(h);
  return d;
}

// y = A B^T on the GPU, read back as doubles; `prior` (FP32 output only) is the accumulation's starting value.
std::vector<double> gpu_gemm(const MxTensor& a, const MxTensor& b, GemmOutType type,
                             const std::vector<float>* prior = nullptr) {
  const int64_t M = a.R, N = b.R, K = a.K;
  auto ac = on_device(a.codes), as = on_device(a.scales), bc = on_device(b.codes), bs = on_device(b.scales);
  const size_t ws_bytes = mxfp4_gemm_workspace_bytes(M, N, K);
  DeviceBuffer<uint8_t> ws(ws_bytes);
  const size_t elem = type == GemmOutType::fp32 ? 4 : 2;
  DeviceBuffer<uint8_t> y(static_cast<size_t>(M * N) * elem);
  y.poison(0xFF);
  if (prior) CUDA_CHECK(cudaMemcpy(y.ptr, prior->data(), prior->size() * 4, cudaMemcpyHostToDevice));
  CublasLtMatmul lt;
  mxfp4_gemm(lt, {ac->ptr, as->ptr}, {bc->ptr, bs->ptr}, M, N, K, ws.ptr, ws_bytes,
             GemmOutput{y.ptr, type, prior != nullptr}, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<uint8_t> raw = y.download();
  std::vector<double> out(static_cast<size_t>(M * N));
  for (int64_t i = 0; i < M * N; ++i) {
    if (type == GemmOutType::fp32) {
      float f;
      std::memcpy(&f, &raw[i * 4], 4);
      out[i] = f;
    } else {
      uint16_t h;
      std::memcpy(&h, &raw[i * 2], 2);
      out[i] = bf16_bits_to_f32(h);
    }
  }
  return out;
}

// Every element within the tolerance above around `expected` (extra: a further allowance per element).
void expect_within(const std::vector<double>& got, const std::vector<double>& expected,
                   const std::vector<double>& abs_sum, int64_t K, GemmOutType type, const std::string& what,
                   const std::vector<double>* extra = nullptr) {
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double out_round = (type == GemmOutType::bf16 ? kBf16Out : kFp32Step) * std::fabs(expected[i]);
    const double tol = (kAccumulation + static_cast<double>(K) * kFp32Step) * abs_sum[i] + out_round +
                       (extra ? (*extra)[i] : 0.0) + 0x1.0p-140;
    if (!(std::fabs(got[i] - expected[i]) <= tol) && bad++ < 5)
      ADD_FAILURE() << what << ": element " << i << " got " << got[i] << " expected " << expected[i] << " (tol "
                    << tol << ")";
  }
  EXPECT_EQ(bad, 0) << what;
}

void check_against_exact(const MxTensor& a, const MxTensor& b, GemmOutType type, const std::string& what) {
  const int64_t M = a.R, N = b.R, K = a.K;
  std::vector<double> y64(static_cast<size_t>(M * N));
  mxfp4_gemm_exact_ref(a.op(), b.op(), M, N, K, y64.data());
  expect_within(gpu_gemm(a, b, type), y64, abs_products(dequantize(a), dequantize(b), M, N, K), K, type, what);
}

TEST(Mxfp4GemmGpu, MatchesTheFp64ProductOfTheDequantizedOperands) {
  FP4MOE_REQUIRE_DEVICE();
  struct Shape {
    int64_t M, N, K;
  };
  // K = 160: a last 128-group of one MX block; 576 and 2048: MoE widths.
  const Shape shapes[] = {{4, 16, 32}, {64, 64, 160}, {128, 256, 576}, {260, 272, 2048}};
  uint32_t seed = 1;
  for (const Shape& s : shapes) {
    const MxTensor a = random_mx(s.M, s.K, -8, 6, seed++), b = random_mx(s.N, s.K, -3, 10, seed++);
    for (GemmOutType type : {GemmOutType::bf16, GemmOutType::fp32})
      check_against_exact(a, b, type, "shape " + std::to_string(s.M) + "x" + std::to_string(s.N) + "x" +
                                          std::to_string(s.K) + (type == GemmOutType::bf16 ? " bf16" : " fp32"));
  }
}

TEST(Mxfp4GemmGpu, AccumulatesIntoAnFp32Output) {
  FP4MOE_REQUIRE_DEVICE();
  const int64_t M = 64, N = 48, K = 256;
  const MxTensor a = random_mx(M, K, -4, 4, 3), b = random_mx(N, K, -4, 4, 4);
  std::vector<float> prior(static_cast<size_t>(M * N));
  for (int64_t i = 0; i < M * N; ++i) prior[i] = static_cast<float>((i % 7) - 3) * 0.375f;
  std::vector<double> y64(static_cast<size_t>(M * N)), extra(prior.size());
  mxfp4_gemm_exact_ref(a.op(), b.op(), M, N, K, y64.data());
  for (size_t i = 0; i < y64.size(); ++i) {
    y64[i] += prior[i];
    extra[i] = kFp32Step * std::fabs(prior[i]);
  }
  expect_within(gpu_gemm(a, b, GemmOutType::fp32, &prior), y64, abs_products(dequantize(a), dequantize(b), M, N, K),
                K, GemmOutType::fp32, "accumulate", &extra);
}

TEST(Mxfp4GemmGpu, EdgeCasesWithoutNaN) {
  FP4MOE_REQUIRE_DEVICE();
  const int64_t M = 8, N = 16, K = 256;
  // +-6 everywhere at large exponents (products 36 * 2^100, sums below FP32's maximum), at small ones (products
  // 36 * 2^-80; the product of the two FP8 group scales, 2^-92, stays a normal FP32), -0 codes, all-zero operands.
  struct Case {
    const char* name;
    uint8_t a_code, b_code;
    int a_e, b_e;
  };
  const Case cases[] = {{"6 x -6 at 2^50", 0x77, 0xFF, 50, 50},     // y = -36 K 2^100 = -9216 * 2^100
                        {"-6 x -6 at 2^-40", 0xFF, 0xFF, -40, -40},  // y = 9216 * 2^-80
                        {"+-6 x -6 at 2^50", 0x7F, 0xFF, 50, 50},    // the signs alternate: y = 0 exactly
                        {"-0 codes", 0x88, 0x7F, 3, 3},
                        {"all zero", 0x00, 0x00, -127, -127}};
  for (const Case& c : cases) {
    MxTensor a(M, K), b(N, K);
    for (auto& v : a.codes) v = c.a_code;
    for (auto& v : b.codes) v = c.b_code;
    for (auto& s : a.scales) s = static_cast<uint8_t>(c.a_e + 127);
    for (auto& s : b.scales) s = static_cast<uint8_t>(c.b_e + 127);
    for (GemmOutType type : {GemmOutType::bf16, GemmOutType::fp32}) check_against_exact(a, b, type, c.name);
  }
  // All-zero blocks between nonzero ones: a row's zero block takes no part in its group's scale.
  MxTensor a = random_mx(M, K, 0, 4, 5), b = random_mx(N, K, 0, 4, 6);
  for (int64_t blk = 0; blk < M * K / 32; blk += 3) {
    a.scales[blk] = 0;
    for (int i = 0; i < 16; ++i) a.codes[blk * 16 + i] = 0;
  }
  check_against_exact(a, b, GemmOutType::fp32, "zero blocks");
}

// Exponent spread > 14 within 128-groups: in every group of A, block 0 has exponent 0 (it sets the group scale
// 2^-6) and blocks 1..3 exponents in [-20, -15]; B is zero on block 0, so the product comes from the small blocks
// only, which the conversion rounds to multiples of 2^-15 (mxfp4_gemm.h, "Conversion"; at -19 and -20 they all
// vanish). Expected: the GPU follows the product of the converted operands (mxfp4_gemm_fp8_ref) within the
// accumulation tolerance, and differs from the exact product by that rounding, far beyond the tolerance.
TEST(Mxfp4GemmGpu, SpreadAbove14FollowsTheFp8ConversionNotTheExactProduct) {
  FP4MOE_REQUIRE_DEVICE();
  const int64_t M = 32, N = 32, K = 512;
  MxTensor a = random_mx(M, K, -20, -15, 7), b = random_mx(N, K, -2, 2, 8);
  for (int64_t blk = 0; blk < M * K / 32; blk += 4) a.scales[blk] = 127;
  for (int64_t blk = 0; blk < N * K / 32; blk += 4) {
    b.scales[blk] = 0;
    for (int i = 0; i < 16; ++i) b.codes[blk * 16 + i] = 0;
  }
  std::vector<double> y8(static_cast<size_t>(M * N)), y64(y8.size());
  mxfp4_gemm_fp8_ref(a.op(), b.op(), M, N, K, y8.data());
  mxfp4_gemm_exact_ref(a.op(), b.op(), M, N, K, y64.data());
  const std::vector<double> s = abs_products(dequantize(a), dequantize(b), M, N, K);
  const std::vector<double> got = gpu_gemm(a, b, GemmOutType::fp32);
  expect_within(got, y8, s, K, GemmOutType::fp32, "against the converted operands");
  int64_t beyond = 0;
  for (size_t i = 0; i < got.size(); ++i)
    beyond += std::fabs(y8[i] - y64[i]) > (kAccumulation + K * kFp32Step) * s[i] + kFp32Step * std::fabs(y64[i]);
  EXPECT_GT(beyond, static_cast<int64_t>(got.size()) / 2) << "the conversion's deviation must show";
}

// A transform along K applied to both operands: the GPU product of the MXFP4 codes of T(a) and T(b) equals the FP64
// product of their dequantized values rotated back (mx_transform_rows_inverse_ref, FP32) within the accumulation
// tolerance plus the FP32 rounding of the inverse rotation (2^-16 ||a_m|| ||b_n||, a generous bound).
TEST(Mxfp4GemmGpu, TransformedOperandsGiveTheProductOfTheRotatedBackDequantizedOperands) {
  FP4MOE_REQUIRE_DEVICE();
  const int64_t M = 64, N = 48, K = 256;
  const std::vector<bf16> a = test::mx_random_bf16(M, K, 11), b = test::mx_random_bf16(N, K, 12);
  auto da = on_device(a), db = on_device(b);
  for (HadamardTransform t : {HadamardTransform::h16, HadamardTransform::h32, HadamardTransform::rht}) {
    MxQuantConfig cfg;
    cfg.transform = t;
    cfg.rht_seed = 99;
    MxTensor qa(M, K), qb(N, K);
    DeviceBuffer<uint8_t> ac(qa.codes.size()), as(qa.scales.size()), bc(qb.codes.size()), bs(qb.scales.size());
    bf16_to_mxfp4_row(da->ptr, M, K, ac.ptr, as.ptr, cfg, nullptr, nullptr);
    bf16_to_mxfp4_row(db->ptr, N, K, bc.ptr, bs.ptr, cfg, nullptr, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    qa.codes = ac.download();
    qa.scales = as.download();
    qb.codes = bc.download();
    qb.scales = bs.download();
    auto rotated_back = [&](const MxTensor& q) {
      const std::vector<double> v = dequantize(q);
      std::vector<float> f(v.begin(), v.end()), r(f.size());  // MXFP4 values of BF16 data: exact in FP32
      mx_transform_rows_inverse_ref(f.data(), q.R, K, t, cfg.rht_seed, r.data());
      return std::vector<double>(r.begin(), r.end());
    };
    const std::vector<double> ra = rotated_back(qa), rb = rotated_back(qb);
    std::vector<double> expected(static_cast<size_t>(M * N), 0.0), extra(expected.size());
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double na = 0, nb = 0;
        for (int64_t k = 0; k < K; ++k) {
          expected[m * N + n] += ra[m * K + k] * rb[n * K + k];
          na += ra[m * K + k] * ra[m * K + k];
          nb += rb[n * K + k] * rb[n * K + k];
        }
        extra[m * N + n] = 0x1.0p-16 * std::sqrt(na * nb);
      }
    expect_within(gpu_gemm(qa, qb, GemmOutType::fp32), expected, abs_products(dequantize(qa), dequantize(qb), M, N, K),
                  K, GemmOutType::fp32, "transform " + std::to_string(static_cast<int>(t)), &extra);
  }
}

// Wgrad per expert from the column quantizer: dW_g = dY_g^T X_g over tokens, groups of any size (zero padding to 32
// tokens, empty experts give zeros), against the FP64 product of the dequantized column tensors.
TEST(Mxfp4GemmGpu, GroupedWgradFromTheColumnQuantizer) {
  FP4MOE_REQUIRE_DEVICE();
  const std::vector<int32_t> offsets = {0, 0, 20, 52, 52, 200, 331};
  const int64_t G = static_cast<int64_t>(offsets.size()) - 1, M = offsets.back(), N = 48, K = 64;
  const std::vector<bf16> dy = test::mx_random_bf16(M, N, 21), x = test::mx_random_bf16(M, K, 22);
  const auto d_dy = on_device(dy), d_x = on_device(x);
  const auto d_off = on_device(offsets);
  for (HadamardTransform t : {HadamardTransform::none, HadamardTransform::h16}) {
    MxQuantConfig cfg;
    cfg.transform = t;
    cfg.rounding = t == HadamardTransform::none ? Rounding::rne : Rounding::stochastic;  // SR on gradients
    cfg.seed = 5;
    DeviceBuffer<uint8_t> dyc(mxfp4_col_codes_capacity(M, N, G)), dys(mxfp4_col_scales_capacity(M, N, G));
    DeviceBuffer<uint8_t> xc(mxfp4_col_codes_capacity(M, K, G)), xs(mxfp4_col_scales_capacity(M, K, G));
    bf16_to_mxfp4_col_ragged(d_dy->ptr, M, N, d_off->ptr, G, offsets.data(), dyc.ptr, dys.ptr, cfg, nullptr,
                             nullptr);
    bf16_to_mxfp4_col_ragged(d_x->ptr, M, K, d_off->ptr, G, offsets.data(), xc.ptr, xs.ptr, cfg, nullptr, nullptr);
    const size_t ws_bytes = mxfp4_wgrad_workspace_bytes(M, N, K, G);
    DeviceBuffer<uint8_t> ws(ws_bytes);
    DeviceBuffer<float> dw(static_cast<size_t>(G * N * K));
    dw.poison(0xFF);
    GroupedGemm gg;
    mxfp4_wgrad_grouped(gg, {dyc.ptr, dys.ptr}, {xc.ptr, xs.ptr}, N, K, GroupSplit{d_off->ptr, offsets.data(), G},
                        ws.ptr, ws_bytes, GemmOutput{dw.ptr, GemmOutType::fp32, false}, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> got = dw.download();
    const std::vector<uint8_t> h_dyc = dyc.download(), h_dys = dys.download(), h_xc = xc.download(),
                               h_xs = xs.download();
    int64_t P = 0;
    for (int64_t g = 0; g < G; ++g) {
      const int64_t L = mxfp4_col_group_ld(offsets[g + 1] - offsets[g]);
      std::vector<double> expected(static_cast<size_t>(N * K), 0.0), s(expected.size(), 0.0);
      if (L > 0) {
        std::vector<double> vdy(static_cast<size_t>(N * L)), vx(static_cast<size_t>(K * L));
        mxfp4_dequantize_f64_ref({h_dyc.data() + N * P / 2, h_dys.data() + N * P / 32}, N, L, vdy.data());
        mxfp4_dequantize_f64_ref({h_xc.data() + K * P / 2, h_xs.data() + K * P / 32}, K, L, vx.data());
        for (int64_t n = 0; n < N; ++n)
          for (int64_t k = 0; k < K; ++k)
            for (int64_t l = 0; l < L; ++l) {
              expected[n * K + k] += vdy[n * L + l] * vx[k * L + l];
              s[n * K + k] += std::fabs(vdy[n * L + l] * vx[k * L + l]);
            }
      }
      const std::vector<double> got_g(got.begin() + g * N * K, got.begin() + (g + 1) * N * K);
      expect_within(got_g, expected, s, L, GemmOutType::fp32,
                    "transform " + std::to_string(static_cast<int>(t)) + " expert " + std::to_string(g));
      P += L;
    }
  }
}

TEST(Mxfp4GemmGpu, RejectsBeforeAnyLaunch) {
  FP4MOE_REQUIRE_DEVICE();
  DeviceBuffer<uint8_t> codes(64 * 64), scales(64 * 64), y(64 * 64 * 4);
  const size_t ws_bytes = mxfp4_gemm_workspace_bytes(64, 64, 64);
  DeviceBuffer<uint8_t> ws(ws_bytes);
  CublasLtMatmul lt;
  const Mxfp4RowOperand op{codes.ptr, scales.ptr};
  const GemmOutput out{y.ptr, GemmOutType::fp32, false};
  auto run = [&](int64_t M, int64_t N, int64_t K, size_t bytes, GemmOutput o, Mxfp4RowOperand a) {
    mxfp4_gemm(lt, a, op, M, N, K, ws.ptr, bytes, o, nullptr);
  };
  EXPECT_THROW(run(62, 64, 64, ws_bytes, out, op), Error);      // M % 4
  EXPECT_THROW(run(64, 56, 64, ws_bytes, out, op), Error);      // N % 16
  EXPECT_THROW(run(64, 64, 48, ws_bytes, out, op), Error);      // K % 32
  EXPECT_THROW(run(64, 64, 64, ws_bytes - 1, out, op), Error);  // workspace too small
  EXPECT_THROW(run(64, 64, 64, ws_bytes, GemmOutput{y.ptr, GemmOutType::bf16, true}, op), Error);
  EXPECT_THROW(run(64, 64, 64, ws_bytes, out, Mxfp4RowOperand{codes.ptr + 8, scales.ptr}), Error);
  CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace fp4moe
