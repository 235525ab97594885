#include "cli/quantize_run.h"

#include <cuda_runtime.h>

#include <cmath>

#include "kernels/common/check.h"
#include "kernels/common/types.h"
#include "kernels/quant/bf16_to_fp8.h"
#include "kernels/quant/layouts.h"
#include "kernels/quant/mx_transform.h"
#include "kernels/quant/mxfp4_to_bf16.h"

namespace fp4moe::cli {

namespace {

// A device copy of n elements of T, freed on scope exit.
template <typename T>
struct Device {
  T* ptr = nullptr;
  size_t n = 0;
  explicit Device(size_t count) : n(count) {
    CUDA_CHECK(cudaMalloc(&ptr, (n ? n : 1) * sizeof(T)));
    CUDA_CHECK(cudaMemset(ptr, 0, (n ? n : 1) * sizeof(T)));
  }
  Device(const std::vector<T>& h) : Device(h.size()) {
    if (n) CUDA_CHECK(cudaMemcpy(ptr, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~Device() { cudaFree(ptr); }
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  void download(std::vector<T>& h) const {
    h.resize(n);
    if (n) CUDA_CHECK(cudaMemcpy(h.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost));
  }
};

const bf16* as_bf16(const std::vector<uint16_t>& x) { return reinterpret_cast<const bf16*>(x.data()); }

// Element i of a BF16 matrix as a float.
struct Bf16Value {
  const std::vector<uint16_t>& x;
  float operator()(int64_t i) const { return bf16_bits_to_f32(x[i]); }
};

// One quantizer launch on the device (the cuda path): uploads x, allocates zeroed device arrays of the sizes of
// `codes` and `scales` and a zeroed non-finite block counter, calls launch(x, codes, scales, counter) with the
// device pointers (x as BF16), synchronizes, downloads codes and scales into the host vectors and returns the
// counter (the blocks that held a NaN or an Inf).
template <typename Scale, typename Launch>
int64_t quantize_on_device(const std::vector<uint16_t>& x, std::vector<uint8_t>& codes, std::vector<Scale>& scales,
                           Launch launch) {
  Device<uint16_t> dx(x);
  Device<uint8_t> dc(codes.size());
  Device<Scale> ds(scales.size());
  Device<unsigned long long> dn(1);
  launch(reinterpret_cast<const bf16*>(dx.ptr), dc.ptr, ds.ptr, dn.ptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  dc.download(codes);
  ds.download(scales);
  std::vector<unsigned long long> n;
  dn.download(n);
  return static_cast<int64_t>(n[0]);
}

// Elements whose magnitude exceeds the format's largest value at their block's scale (they were clipped).
// value(i) returns element i (flat) of what was quantized; limit(m, k) returns the block's largest representable
// magnitude, or NaN for a NaN block (skipped).
template <typename Value, typename Limit>
int64_t count_saturated(int64_t M, int64_t K, Value value, Limit limit) {
  // fp32 scales (amax / 448) may sit one rounding below the exact ratio; no BF16 value lies within 2^-20 of a
  // representable maximum without reaching it, so this slack only removes that rounding noise.
  const double slack = 1.0 + std::ldexp(1.0, -20);
  int64_t n = 0;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) {
      double v = std::fabs(static_cast<double>(value(m * K + k)));
      double lim = limit(m, k);
      if (std::isfinite(v) && !std::isnan(lim) && v > lim * slack) ++n;
    }
  return n;
}

QuantizeResult run_mxfp4(const std::vector<uint16_t>& x, int64_t M, int64_t K, const QuantizeSpec& s) {
  QuantizeResult r;
  r.codes.resize(M * K / 2);
  r.scales_ue8m0.resize(M * K / kMxBlock);
  if (s.cuda) {
    r.nonfinite_blocks = quantize_on_device(
        x, r.codes, r.scales_ue8m0, [&](const bf16* dx, uint8_t* dc, uint8_t* ds, unsigned long long* dn) {
          bf16_to_mxfp4_row(dx, M, K, dc, ds, s.mx, dn, nullptr);
        });
  } else {
    r.nonfinite_blocks = bf16_to_mxfp4_row_ref(as_bf16(x), M, K, r.codes.data(), r.scales_ue8m0.data(), s.mx);
  }
  r.codes_shape = {M, K / 2};
  r.scales_shape = {M, K / kMxBlock};
  r.blocks = M * K / kMxBlock;
  r.layout = "mxfp4 row: codes uint8 [M, K/2] (E2M1, element 2i in the low nibble of byte i), "
             "scales uint8 [M, K/32] (UE8M0)";
  std::vector<uint16_t> y(M * K);
  mxfp4_to_bf16_ref(r.codes.data(), r.scales_ue8m0.data(), M, K, reinterpret_cast<bf16*>(y.data()));
  r.dequantized.resize(M * K);
  for (int64_t i = 0; i < M * K; ++i) r.dequantized[i] = bf16_bits_to_f32(y[i]);
  std::vector<float> transformed;  // what was quantized, with a transform
  if (s.mx.transform != HadamardTransform::none) {
    transformed.resize(M * K);
    mx_transform_rows_bf16_ref(as_bf16(x), M, K, s.mx.transform, s.mx.rht_seed, transformed.data());
    r.dequantized_inverse.resize(M * K);
    mx_transform_rows_inverse_ref(r.dequantized.data(), M, K, s.mx.transform, s.mx.rht_seed,
                                  r.dequantized_inverse.data());
  }
  const auto quantized_value = [&](int64_t i) {
    return transformed.empty() ? bf16_bits_to_f32(x[i]) : transformed[i];
  };
  r.saturated = count_saturated(M, K, quantized_value, [&](int64_t m, int64_t k) {
    uint8_t b = r.scales_ue8m0[m * (K / kMxBlock) + k / kMxBlock];
    return b == kUE8M0NaN ? std::nan("") : kE2M1Max * static_cast<double>(ue8m0_to_f32(b));
  });
  return r;
}

QuantizeResult run_fp8_row(const std::vector<uint16_t>& x, int64_t M, int64_t K, const QuantizeSpec& s) {
  QuantizeResult r;
  r.codes.resize(M * K);
  r.scales_f32.resize(fp8_row_scale_count(M, K));
  if (s.cuda) {
    r.nonfinite_blocks = quantize_on_device(
        x, r.codes, r.scales_f32, [&](const bf16* dx, uint8_t* dc, float* ds, unsigned long long* dn) {
          bf16_to_fp8_row(dx, M, K, s.fp8_mode, dc, ds, dn, nullptr);
        });
  } else {
    r.nonfinite_blocks = bf16_to_fp8_row_ref(as_bf16(x), M, K, s.fp8_mode, r.codes.data(), r.scales_f32.data());
  }
  r.codes_shape = {M, K};
  r.scales_shape = {ceil_div(K, kFp8Block), fp8_row_scale_ld(M)};
  r.blocks = M * ceil_div(K, kFp8Block);
  r.layout = "fp8 1x128 row: codes uint8 [M, K] (E4M3), scales float32 [ceil(K/128), round_up(M, 4)] "
             "(scale of row m, block b at [b, m])";
  r.dequantized.resize(M * K);
  fp8_row_dequantize_ref(r.codes.data(), r.scales_f32.data(), M, K, r.dequantized.data());
  r.saturated = count_saturated(M, K, Bf16Value{x}, [&](int64_t m, int64_t k) {
    return kE4M3Max * static_cast<double>(r.scales_f32[fp8_row_scale_index(m, k / kFp8Block, M)]);
  });
  return r;
}

QuantizeResult run_fp8_col(const std::vector<uint16_t>& x, int64_t M, int64_t K, const QuantizeSpec& s) {
  QuantizeResult r;
  const auto& off = s.offsets;
  const int64_t G = static_cast<int64_t>(off.size()) - 1;
  std::vector<int64_t> scale_base(G);  // K * Q_g: where group g's scales start
  int64_t used_cols = 0, used_blocks = 0;
  for (int64_t g = 0; g < G; ++g) {
    int64_t m_g = off[g + 1] - off[g];
    scale_base[g] = K * used_blocks;
    used_cols += fp8_col_group_ld(m_g);
    used_blocks += ceil_div(m_g, kFp8Block);
  }
  r.codes.resize(fp8_col_codes_capacity(M, K, G));
  r.scales_f32.resize(fp8_col_scales_capacity(M, K, G));
  if (s.cuda) {
    Device<int32_t> doff(off);
    r.nonfinite_blocks = quantize_on_device(
        x, r.codes, r.scales_f32, [&](const bf16* dx, uint8_t* dc, float* ds, unsigned long long* dn) {
          bf16_to_fp8_col(dx, M, K, doff.ptr, G, off.data(), s.fp8_mode, dc, ds, dn, nullptr);
        });
  } else {
    r.nonfinite_blocks =
        bf16_to_fp8_col_ref(as_bf16(x), M, K, off.data(), G, s.fp8_mode, r.codes.data(), r.scales_f32.data());
  }
  r.dequantized.resize(M * K);
  fp8_col_dequantize_ref(r.codes.data(), r.scales_f32.data(), M, K, off.data(), G, r.dequantized.data());
  int64_t g = 0;
  r.saturated = count_saturated(M, K, Bf16Value{x}, [&](int64_t m, int64_t k) {
    while (m >= off[g + 1]) ++g;  // rows are visited in order
    int64_t t = m - off[g];
    return kE4M3Max * static_cast<double>(r.scales_f32[scale_base[g] + (t / kFp8Block) * K + k]);
  });
  r.codes.resize(K * used_cols);
  r.scales_f32.resize(K * used_blocks);
  r.codes_shape = {K * used_cols};
  r.scales_shape = {K * used_blocks};
  r.blocks = K * used_blocks;
  r.layout = "fp8 column over ragged groups (/group_offsets): group g is codes uint8 [K, round_up(M_g, 16)] (E4M3, "
             "transposed, zero padding) at K * sum_{h<g} round_up(M_h, 16), scales float32 [ceil(M_g/128), K] at "
             "K * sum_{h<g} ceil(M_h/128)";
  return r;
}

QuantizeResult run_fp8_block(const std::vector<uint16_t>& x, int64_t M, int64_t K, const QuantizeSpec& s) {
  QuantizeResult r;
  r.codes.resize(M * K);
  r.scales_f32.resize(fp8_block_scale_count(M, K));
  if (s.cuda) {
    r.nonfinite_blocks = quantize_on_device(
        x, r.codes, r.scales_f32, [&](const bf16* dx, uint8_t* dc, float* ds, unsigned long long* dn) {
          bf16_to_fp8_block128(dx, M, K, s.fp8_mode, false, dc, ds, dn, nullptr);
        });
  } else {
    r.nonfinite_blocks =
        bf16_to_fp8_block128_ref(as_bf16(x), M, K, s.fp8_mode, false, r.codes.data(), r.scales_f32.data());
  }
  const int64_t ld = fp8_block_scale_ld(K);
  r.codes_shape = {M, K};
  r.scales_shape = {ceil_div(M, kFp8Block), ld};
  r.blocks = ceil_div(M, kFp8Block) * ceil_div(K, kFp8Block);
  r.layout = "fp8 128x128 block: codes uint8 [N, K] (E4M3), scales float32 [ceil(N/128), round_up(ceil(K/128), 4)]";
  r.dequantized.resize(M * K);
  fp8_block128_dequantize_ref(r.codes.data(), r.scales_f32.data(), M, K, false, r.dequantized.data());
  r.saturated = count_saturated(M, K, Bf16Value{x}, [&](int64_t m, int64_t k) {
    return kE4M3Max * static_cast<double>(r.scales_f32[(m / kFp8Block) * ld + k / kFp8Block]);
  });
  return r;
}

}  // namespace

QuantizeResult quantize_matrix(const std::vector<uint16_t>& x, int64_t M, int64_t K, const QuantizeSpec& spec) {
  FP4MOE_CHECK(static_cast<int64_t>(x.size()) == M * K, "input holds {} elements, expected M*K = {}*{}", x.size(), M,
               K);
  switch (spec.format) {
    case QuantFormat::mxfp4: return run_mxfp4(x, M, K, spec);
    case QuantFormat::fp8_row: return run_fp8_row(x, M, K, spec);
    case QuantFormat::fp8_col: return run_fp8_col(x, M, K, spec);
    case QuantFormat::fp8_block: return run_fp8_block(x, M, K, spec);
  }
  fail(__FILE__, __LINE__, "unknown quantization format");
}

}  // namespace fp4moe::cli
