// Host operands of the grouped GEMM tests (tests/gemm/test_grouped_gemm*_gpu.cpp): seeded random E4M3 codes and
// scales built directly in the layouts of kernels/quant/layouts.h with their exact dequantized values, device
// uploads, poisoned output buffers and the checks the tests share.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "kernels/common/check.h"
#include "kernels/common/types.h"
#include "kernels/formats/formats.h"
#include "kernels/gemm/grouped_gemm.h"
#include "kernels/gemm/grouped_gemm_ref.h"
#include "kernels/quant/layouts.h"
#include "tests/common/gpu_test_util.h"

namespace fp4moe::test {

inline const float kNaN = std::numeric_limits<float>::quiet_NaN();

enum class ScaleKind { pow2, fp32 };

struct Rng {
  uint64_t state;
  explicit Rng(uint64_t seed) : state(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t next() { return mix64(state += 0x9E3779B97F4A7C15ull); }
  int64_t below(int64_t n) { return static_cast<int64_t>(next() % static_cast<uint64_t>(n)); }
  // Any finite E4M3 code (NaN codes 0x7F/0xFF become zeros).
  uint8_t code() {
    uint8_t c = static_cast<uint8_t>(next() >> 56);
    return (c & 0x7F) == 0x7F ? 0 : c;
  }
  float scale(ScaleKind kind) {
    if (kind == ScaleKind::pow2) return exp2_exact(static_cast<int>(below(9)) - 6);  // 2^-6 .. 2^2
    return static_cast<float>(0.001 + 0.2 * static_cast<double>(next() >> 11) * 0x1.0p-53);
  }
};

inline float e4m3(uint8_t c) { return e4m3_to_f32(c); }

struct HostFp8 {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  std::vector<float> deq;  // dense fp32, the exact dequantized values
};

// FP8 1x128 row tensor [R, C]; padding rows of the scales are NaN (a GEMM may read them only for rows it never
// stores).
inline HostFp8 make_row_tensor(int64_t R, int64_t C, ScaleKind kind, Rng& rng) {
  HostFp8 t;
  t.codes.resize(R * C);
  t.scales.assign(fp8_row_scale_count(R, C), kNaN);
  t.deq.resize(R * C);
  for (auto& c : t.codes) c = rng.code();
  for (int64_t b = 0; b < ceil_div(C, kFp8Block); ++b)
    for (int64_t r = 0; r < R; ++r) t.scales[fp8_row_scale_index(r, b, R)] = rng.scale(kind);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c)
      t.deq[r * C + c] = e4m3(t.codes[r * C + c]) * t.scales[fp8_row_scale_index(r, c / kFp8Block, R)];
  return t;
}

// G stacked FP8 128x128 block tensors [R, C]; padding k-blocks of the scales hold 1.0 (layouts.h).
inline HostFp8 make_block_stack(int64_t G, int64_t R, int64_t C, ScaleKind kind, Rng& rng) {
  HostFp8 t;
  const int64_t count = fp8_block_scale_count(R, C), ld = fp8_block_scale_ld(C);
  t.codes.resize(G * R * C);
  t.scales.assign(G * count, 1.0f);
  t.deq.resize(G * R * C);
  for (auto& c : t.codes) c = rng.code();
  for (int64_t g = 0; g < G; ++g)
    for (int64_t rb = 0; rb < ceil_div(R, kFp8Block); ++rb)
      for (int64_t cb = 0; cb < ceil_div(C, kFp8Block); ++cb) t.scales[g * count + rb * ld + cb] = rng.scale(kind);
  for (int64_t g = 0; g < G; ++g)
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c)
        t.deq[(g * R + r) * C + c] =
            e4m3(t.codes[(g * R + r) * C + c]) * t.scales[g * count + (r / kFp8Block) * ld + c / kFp8Block];
  return t;
}

// The same experts transposed: [R, C] blocks -> [C, R] blocks (what bf16_to_fp8_block128 with transpose = true
// writes for Dgrad). deq is not filled (it is the transpose of the input's).
inline HostFp8 transpose_block_stack(const HostFp8& w, int64_t G, int64_t R, int64_t C) {
  HostFp8 t;
  const int64_t count = fp8_block_scale_count(R, C), ld = fp8_block_scale_ld(C);
  const int64_t count_t = fp8_block_scale_count(C, R), ld_t = fp8_block_scale_ld(R);
  t.codes.resize(G * R * C);
  t.scales.assign(G * count_t, 1.0f);
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c) t.codes[(g * C + c) * R + r] = w.codes[(g * R + r) * C + c];
    for (int64_t rb = 0; rb < ceil_div(R, kFp8Block); ++rb)
      for (int64_t cb = 0; cb < ceil_div(C, kFp8Block); ++cb)
        t.scales[g * count_t + cb * ld_t + rb] = w.scales[g * count + rb * ld + cb];
  }
  return t;
}

template <typename T>
std::unique_ptr<DeviceBuffer<T>> upload(const std::vector<T>& h) {
  auto d = std::make_unique<DeviceBuffer<T>>(h.size());
  d->upload(h);
  return d;
}

// An output buffer of `count` elements of either type, poisoned with 0xFF bytes (NaN in bf16 and fp32).
struct OutBuffer {
  DeviceBuffer<float> buf;  // fp32-sized storage serves both types
  int64_t count;
  GemmOutType type;
  OutBuffer(int64_t n, GemmOutType t) : buf(static_cast<size_t>(std::max<int64_t>(n, 1))), count(n), type(t) {
    buf.poison(0xFF);
  }
  GemmOutput output(bool accumulate = false) { return GemmOutput{buf.ptr, type, accumulate}; }
  std::vector<float> download() const {
    std::vector<float> all = buf.download();
    std::vector<float> out(static_cast<size_t>(count));
    if (type == GemmOutType::fp32) {
      std::copy(all.begin(), all.begin() + count, out.begin());
    } else {
      const auto* b = reinterpret_cast<const uint16_t*>(all.data());
      for (int64_t i = 0; i < count; ++i) out[i] = bf16_bits_to_f32(b[i]);
    }
    return out;
  }
};

// Index of the first NaN/Inf in v (the poison of an unwritten element), or -1.
inline int64_t first_non_finite(const std::vector<float>& v) {
  for (size_t i = 0; i < v.size(); ++i)
    if (!std::isfinite(v[i])) return static_cast<int64_t>(i);
  return -1;
}

// Runs `body`, turning an fp4moe::Error into a test failure that names the case (other cases still run).
template <typename F>
bool run_case(const std::string& what, F&& body) {
  try {
    body();
    CUDA_CHECK(cudaDeviceSynchronize());
    return true;
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": threw " << e.what();
    return false;
  }
}

// The compared rows of expert group g (rows in [offsets[g], offsets[g+1])) of two outputs [.., P], concatenated:
// got into gg, want into ww (both emptied first).
inline void group_rows(const std::vector<float>& got, const std::vector<float>& want, int64_t P,
                       const std::vector<int32_t>& offsets, const std::vector<int64_t>& rows, int64_t g,
                       std::vector<float>& gg, std::vector<float>& ww) {
  gg.clear();
  ww.clear();
  for (int64_t r : rows)
    if (r >= offsets[g] && r < offsets[g + 1]) {
      gg.insert(gg.end(), got.begin() + r * P, got.begin() + (r + 1) * P);
      ww.insert(ww.end(), want.begin() + r * P, want.begin() + (r + 1) * P);
    }
}

// Rows of an [M, P] grouped output to compare with a reference: every row when the problem's work (M N K) is at most
// `all_up_to`, else the first and last 4 rows of every group (where tiles and padded GEMMs end and the next group's
// rows are loaded) and 8 random rows of each; sorted, unique.
inline std::vector<int64_t> rows_to_compare(const std::vector<int32_t>& offsets, int64_t work, int64_t all_up_to,
                                            Rng& rng) {
  std::vector<int64_t> rows;
  const bool all = work <= all_up_to;
  for (size_t g = 0; g + 1 < offsets.size(); ++g) {
    const int64_t off = offsets[g], Mg = offsets[g + 1] - off;
    for (int64_t t = 0; t < Mg; ++t)
      if (all || t < 4 || t >= Mg - 4) rows.push_back(off + t);
    if (!all && Mg > 8)
      for (int i = 0; i < 8; ++i) rows.push_back(off + 4 + rng.below(Mg - 8));
  }
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  return rows;
}

// Offsets [G+1] of consecutive groups of the given sizes.
inline std::vector<int32_t> offsets_of(const std::vector<int32_t>& sizes) {
  std::vector<int32_t> o(sizes.size() + 1, 0);
  for (size_t g = 0; g < sizes.size(); ++g) o[g + 1] = o[g] + sizes[g];
  return o;
}

// FP8 column tensor over ragged groups of an [M, C] tensor (layouts.h): group g is [C, L_g] with 1x128 blocks
// along tokens and zero columns up to L_g = round_up(M_g, pad) (16: the FP8 column tensor; 32: the FP8 conversion
// of an MXFP4 column tensor, mxfp4_gemm.h; capacity C * (M + (pad - 1) G) codes). The unused end of the capacity
// holds NaN codes and NaN scales, so a read outside the groups' extents shows up in the result. deq is [M, C]
// row-major.
inline HostFp8 make_col_tensor(int64_t M, int64_t C, const std::vector<int32_t>& offsets, ScaleKind kind, Rng& rng,
                               int64_t pad = kColAlign) {
  const int64_t G = static_cast<int64_t>(offsets.size()) - 1;
  HostFp8 t;
  t.codes.assign(static_cast<size_t>(C * (M + (pad - 1) * G)), kE4M3NaN);
  t.scales.assign(fp8_col_scales_capacity(M, C, G), kNaN);
  t.deq.resize(M * C);
  int64_t P = 0, Q = 0;
  for (int64_t g = 0; g < G; ++g) {
    const int64_t off = offsets[g], Mg = offsets[g + 1] - off, L = ceil_div(Mg, pad) * pad, blocks = ceil_div(Mg, 128);
    for (int64_t c = 0; c < C; ++c)
      for (int64_t tok = 0; tok < L; ++tok) t.codes[C * P + c * L + tok] = tok < Mg ? rng.code() : 0;
    for (int64_t b = 0; b < blocks; ++b)
      for (int64_t c = 0; c < C; ++c) t.scales[C * Q + b * C + c] = rng.scale(kind);
    for (int64_t tok = 0; tok < Mg; ++tok)
      for (int64_t c = 0; c < C; ++c)
        t.deq[(off + tok) * C + c] = e4m3(t.codes[C * P + c * L + tok]) * t.scales[C * Q + (tok / 128) * C + c];
    P += L;
    Q += blocks;
  }
  return t;
}

// Rows n of every dW_g to compare: the first and last 4, rows at 128-block edges, 8 random; all when small.
inline std::vector<int64_t> sample_wgrad_rows(int64_t N, int64_t work, Rng& rng) {
  std::vector<int64_t> rows;
  if (work <= (int64_t{1} << 27)) {
    for (int64_t n = 0; n < N; ++n) rows.push_back(n);
    return rows;
  }
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{3}, N - 4, N - 3, N - 2, N - 1, int64_t{127},
                    int64_t{128}})
    if (n >= 0 && n < N) rows.push_back(n);
  for (int i = 0; i < 8; ++i) rows.push_back(rng.below(N));
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  return rows;
}

// dW [G, N, K]: all finite; empty groups exactly `init` (accumulate) or zero; others within the tolerance of
// init + reference over the sampled rows n.
inline void expect_wgrad_close(const std::string& what, const std::vector<float>& got,
                               const std::vector<float>& want, const std::vector<float>* init, int64_t N, int64_t K,
                               const std::vector<int32_t>& offsets, const std::vector<int64_t>& rows, double tol) {
  const int64_t bad = first_non_finite(got);
  if (bad >= 0) {
    ADD_FAILURE() << what << ": dW element (group " << bad / (N * K) << ", " << (bad / K) % N << ", " << bad % K
                  << ") is NaN/Inf (poison left unwritten, or a NaN read): " << got[bad];
    return;
  }
  const int64_t G = static_cast<int64_t>(offsets.size()) - 1;
  for (int64_t g = 0; g < G; ++g) {
    const int64_t base = g * N * K;
    if (offsets[g + 1] == offsets[g]) {
      for (int64_t i = 0; i < N * K; ++i) {
        const float expect = init ? (*init)[base + i] : 0.0f;
        if (got[base + i] != expect) {
          ADD_FAILURE() << what << ": empty expert group " << g << " must give " << (init ? "an unchanged" : "a zero")
                        << " dW, element (" << i / K << ", " << i % K << ") is " << got[base + i] << ", expected "
                        << expect;
          break;
        }
      }
      continue;
    }
    std::vector<float> gg, ww;
    for (int64_t n : rows)
      for (int64_t k = 0; k < K; ++k) {
        const int64_t i = base + n * K + k;
        gg.push_back(got[i]);
        ww.push_back(init ? (*init)[i] + want[i] : want[i]);
      }
    const double err = relative_l2_error(gg.data(), ww.data(), static_cast<int64_t>(gg.size()));
    EXPECT_LT(err, tol) << what << ": expert group " << g << " (" << offsets[g + 1] - offsets[g]
                        << " tokens): relative L2 error " << err << " over " << rows.size() << " rows of dW, tolerance "
                        << tol;
  }
}

}  // namespace fp4moe::test
