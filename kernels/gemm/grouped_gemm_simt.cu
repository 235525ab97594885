// Grouped GEMMs on the CUDA cores from device offsets (grouped_gemm_simt.h).
//
// One thread block of 256 threads per 64 x 64 output tile at a time (a persistent grid striding over the tiles),
// each thread 4 x 4 outputs; the operands' 64 x 32 slices converted to FP32 (BF16 exactly, E4M3 codes exactly,
// without their scales) into shared memory, reduction-major, then 32 fused multiply-adds per output per slice.
// FP8 partial sums are promoted with both scales every 128 of the reduction.
#include "kernels/gemm/grouped_gemm_simt.h"

#include <cuda_bf16.h>
#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <string>

#include "kernels/common/check.h"
#include "kernels/formats/formats.h"
#include "kernels/gemm/grouped_tiles.h"
#include "kernels/gemm/sm90_grouped_device.cuh"
#include "kernels/quant/layouts.h"

namespace fp4moe {
namespace {

constexpr int kThreads = 256;
constexpr int kTile = 64;  // output tile side
constexpr int kStep = 32;  // reduction slice per shared-memory stage
constexpr int kLd = kTile + 4;
static_assert(kFp8Block % kStep == 0, "slices never straddle a 128-block of the reduction");
static_assert(kThreads == (kTile / 4) * (kTile / 4), "4 x 4 outputs per thread");
static_assert(kTile * kStep % kThreads == 0, "whole slices per thread");

struct RowsParams {
  const void* a;
  const float* a_scales;
  const void* b;
  const float* b_scales;
  const int32_t* offsets;
  int32_t G, M, P, Q;
  int64_t b_scales_stride;  // floats per group
  int64_t b_scale_ld;       // block128: fp8_block_scale_ld(Q); row128: fp8_row_scale_ld(P)
  int64_t a_scale_ld;       // fp8_row_scale_ld(M)
  void* out;
};

struct WgradParams {
  const void* dy;
  const float* dy_scales;
  const void* x;
  const float* x_scales;
  const int32_t* offsets;
  int32_t G, M, N, K, token_pad;
  void* out;
  bool accumulate;
};

template <bool kFp8>
__device__ __forceinline__ float operand(const void* p, int64_t i) {
  if constexpr (kFp8)
    return e4m3_to_f32(static_cast<const uint8_t*>(p)[i]);
  else
    return bf16_bits_to_f32(static_cast<const uint16_t*>(p)[i]);
}

template <bool kF32>
__device__ __forceinline__ void store_out(void* out, int64_t i, float v, bool accumulate) {
  if constexpr (kF32) {
    float* o = static_cast<float*>(out) + i;
    *o = accumulate ? *o + v : v;
  } else {
    static_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16_rn(v);
  }
}

// part[i][j] += As[s][4 ty + i] * Bs[s][4 tx + j] over the slice.
__device__ __forceinline__ void slice_products(const float (&As)[kStep][kLd], const float (&Bs)[kStep][kLd], int ty,
                                               int tx, float (&part)[4][4]) {
#pragma unroll 8
  for (int s = 0; s < kStep; ++s) {
    const float4 a = *reinterpret_cast<const float4*>(&As[s][4 * ty]);
    const float4 b = *reinterpret_cast<const float4*>(&Bs[s][4 * tx]);
    const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) part[i][j] = __fmaf_rn(av[i], bv[j], part[i][j]);
  }
}

// acc[i][j] += part[i][j] * (sa[i] * sb[j]), then part = 0: the promotion of one 128-block's FP8 partial sums.
__device__ __forceinline__ void promote(float (&acc)[4][4], float (&part)[4][4], const float (&sa)[4],
                                        const float (&sb)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      acc[i][j] = __fmaf_rn(part[i][j], sa[i] * sb[j], acc[i][j]);
      part[i][j] = 0.0f;
    }
}

// Warp 0 loads the raw offsets [G+1] into s_o and makes them safe (grouped_tiles.h).
__device__ __forceinline__ void load_safe_offsets(const int32_t* offsets, int32_t G, int32_t M, int32_t* s_o) {
  for (int i = static_cast<int>(threadIdx.x); i <= G; i += 32) s_o[i] = offsets[i];
  __syncwarp();
  sm90::safe_offsets_warp(s_o, G, M);
}

template <bool kFp8, SimtWeightScales kScales, bool kBTransposed, bool kF32>
__global__ void __launch_bounds__(kThreads) grouped_rows_simt_kernel(RowsParams p) {
  extern __shared__ int32_t s_groups[];  // safe offsets [G+1], tile starts [G+1]
  __shared__ __align__(16) float As[kStep][kLd];
  __shared__ __align__(16) float Bs[kStep][kLd];
  int32_t* const s_o = s_groups;
  int32_t* const s_start = s_groups + p.G + 1;
  const int32_t col_blocks = (p.P + kTile - 1) / kTile;
  if (threadIdx.x < 32) {
    load_safe_offsets(p.offsets, p.G, p.M, s_o);
    sm90::exclusive_sum_warp(
        p.G, [&](int g) { return group_tile_count(s_o[g + 1] - s_o[g], kTile, col_blocks); }, s_start);
  }
  __syncthreads();
  const int t = static_cast<int>(threadIdx.x), tx = t % 16, ty = t / 16;
  for (int32_t tile = static_cast<int32_t>(blockIdx.x); tile < s_start[p.G]; tile += static_cast<int32_t>(gridDim.x)) {
    const GroupedTile gt = grouped_tile(tile, s_o, s_start, p.G, kTile, kTile, col_blocks);
    const int64_t g = gt.group;
    float acc[4][4] = {}, part[4][4] = {};
    for (int32_t q0 = 0; q0 < p.Q; q0 += kStep) {
#pragma unroll
      for (int it = 0; it < kTile * kStep / kThreads; ++it) {
        const int e = it * kThreads + t;
        {  // a: row-major, the reduction fastest
          const int r = e / kStep, s = e % kStep;
          const int32_t row = gt.row0 + r, q = q0 + s;
          As[s][r] = row < gt.row_end && q < p.Q ? operand<kFp8>(p.a, int64_t{row} * p.Q + q) : 0.0f;
        }
        {  // b_g: [P, Q] (the reduction fastest) or stored [Q, P] (the output column fastest)
          const int c = kBTransposed ? e % kTile : e / kStep, s = kBTransposed ? e / kTile : e % kStep;
          const int32_t col = gt.col0 + c, q = q0 + s;
          const int64_t i = kBTransposed ? (g * p.Q + q) * p.P + col : (g * p.P + col) * p.Q + q;
          Bs[s][c] = col < p.P && q < p.Q ? operand<kFp8>(p.b, i) : 0.0f;
        }
      }
      __syncthreads();
      slice_products(As, Bs, ty, tx, part);
      __syncthreads();
      if constexpr (kFp8) {
        if ((q0 + kStep) % kFp8Block == 0 || q0 + kStep >= p.Q) {  // promote block kb of the reduction
          const int64_t kb = q0 / kFp8Block;
          float sa[4], sb[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int32_t row = gt.row0 + 4 * ty + i;
            sa[i] = row < gt.row_end ? p.a_scales[kb * p.a_scale_ld + row] : 0.0f;
          }
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const int32_t col = gt.col0 + 4 * tx + j;
            const float* bs = p.b_scales + g * p.b_scales_stride;
            sb[j] = col >= p.P ? 0.0f
                    : kScales == SimtWeightScales::block128 ? bs[(col / kFp8Block) * p.b_scale_ld + kb]
                                                            : bs[kb * p.b_scale_ld + col];
          }
          promote(acc, part, sa, sb);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int32_t row = gt.row0 + 4 * ty + i;
      if (row >= gt.row_end) continue;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int32_t col = gt.col0 + 4 * tx + j;
        if (col < p.P) store_out<kF32>(p.out, int64_t{row} * p.P + col, kFp8 ? acc[i][j] : part[i][j], false);
      }
    }
  }
}

template <bool kFp8, bool kF32>
__global__ void __launch_bounds__(kThreads) grouped_wgrad_simt_kernel(WgradParams p) {
  extern __shared__ int32_t s_groups[];  // safe offsets, padded token prefixes P_g, 128-block prefixes Q_g: [G+1] each
  __shared__ __align__(16) float As[kStep][kLd];
  __shared__ __align__(16) float Bs[kStep][kLd];
  int32_t* const s_o = s_groups;
  int32_t* const s_pad = s_groups + p.G + 1;
  int32_t* const s_blk = s_groups + 2 * (p.G + 1);
  if (threadIdx.x < 32) {
    load_safe_offsets(p.offsets, p.G, p.M, s_o);
    sm90::exclusive_sum_warp(
        p.G, [&](int g) { return (s_o[g + 1] - s_o[g] + p.token_pad - 1) / p.token_pad * p.token_pad; }, s_pad);
    sm90::exclusive_sum_warp(
        p.G, [&](int g) { return (s_o[g + 1] - s_o[g] + kFp8Block - 1) / kFp8Block; }, s_blk);
  }
  __syncthreads();
  const int t = static_cast<int>(threadIdx.x), tx = t % 16, ty = t / 16;
  const int32_t n_blocks = (p.N + kTile - 1) / kTile, k_blocks = (p.K + kTile - 1) / kTile;
  const int32_t per_group = n_blocks * k_blocks;
  for (int32_t tile = static_cast<int32_t>(blockIdx.x); tile < p.G * per_group; tile += static_cast<int32_t>(gridDim.x)) {
    const int32_t g = tile / per_group, n0 = (tile % per_group) / k_blocks * kTile, k0 = tile % k_blocks * kTile;
    const int32_t o = s_o[g], Mg = s_o[g + 1] - o;
    const int64_t L = (Mg + p.token_pad - 1) / p.token_pad * p.token_pad;
    const int64_t dy_codes = int64_t{p.N} * s_pad[g], x_codes = int64_t{p.K} * s_pad[g];
    float acc[4][4] = {}, part[4][4] = {};
    for (int32_t t0 = 0; t0 < Mg; t0 += kStep) {
#pragma unroll
      for (int it = 0; it < kTile * kStep / kThreads; ++it) {
        const int e = it * kThreads + t;
        // fp8: [features, L] per group, tokens fastest; bf16: [M, features] row-major, features fastest.
        const int c = kFp8 ? e / kStep : e % kTile, s = kFp8 ? e % kStep : e / kTile;
        const int32_t tok = t0 + s;
        const int32_t n = n0 + c, k = k0 + c;
        As[s][c] = n < p.N && tok < Mg
                       ? operand<kFp8>(p.dy, kFp8 ? dy_codes + n * L + tok : int64_t{o + tok} * p.N + n)
                       : 0.0f;
        Bs[s][c] = k < p.K && tok < Mg
                       ? operand<kFp8>(p.x, kFp8 ? x_codes + k * L + tok : int64_t{o + tok} * p.K + k)
                       : 0.0f;
      }
      __syncthreads();
      slice_products(As, Bs, ty, tx, part);
      __syncthreads();
      if constexpr (kFp8) {
        if ((t0 + kStep) % kFp8Block == 0 || t0 + kStep >= Mg) {
          const int64_t b = int64_t{s_blk[g]} + t0 / kFp8Block;  // the block's row of both scale tensors
          float sa[4], sb[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int32_t n = n0 + 4 * ty + i;
            sa[i] = n < p.N ? p.dy_scales[b * p.N + n] : 0.0f;
          }
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const int32_t k = k0 + 4 * tx + j;
            sb[j] = k < p.K ? p.x_scales[b * p.K + k] : 0.0f;
          }
          promote(acc, part, sa, sb);
        }
      }
    }
    if (Mg == 0 && p.accumulate) continue;  // an empty group leaves the master gradient as it is
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int32_t n = n0 + 4 * ty + i;
      if (n >= p.N) continue;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int32_t k = k0 + 4 * tx + j;
        if (k < p.K)
          store_out<kF32>(p.out, (int64_t{g} * p.N + n) * p.K + k, kFp8 ? acc[i][j] : part[i][j], p.accumulate);
      }
    }
  }
}

// A grid of at most 4 thread blocks per SM over `tiles` tiles (at least 1 block).
unsigned grid_for(int64_t tiles) {
  int device = 0, sms = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return static_cast<unsigned>(std::clamp<int64_t>(tiles, 1, int64_t{4} * sms));
}

void check_groups(const char* what, const int32_t* offsets, int64_t G, int64_t M) {
  FP4MOE_CHECK(G >= 1 && G <= kGroupedSimtMaxGroups, "{}: expected 1 <= G <= {} groups, got G={}", what,
               kGroupedSimtMaxGroups, G);
  FP4MOE_CHECK(offsets != nullptr, "{}: device group offsets are null (expected int32 [G+1] = [{}])", what, G + 1);
  FP4MOE_CHECK(M >= 0 && M <= kGroupedSimtMaxTokens, "{}: the token count M must be in [0, 2^30], got M={}", what, M);
}

void check_output(const char* what, const GemmOutput& out, bool wgrad) {
  FP4MOE_CHECK(out.data != nullptr, "{}: the output is null", what);
  FP4MOE_CHECK(!out.accumulate || (wgrad && out.type == GemmOutType::fp32),
               "{}: accumulation is only offered for Wgrad into an FP32 output", what);
}

template <bool kFp8, SimtWeightScales kScales, bool kBT>
void launch_rows(const RowsParams& p, bool f32, unsigned grid, size_t smem, cudaStream_t stream) {
  if (f32)
    grouped_rows_simt_kernel<kFp8, kScales, kBT, true><<<grid, kThreads, smem, stream>>>(p);
  else
    grouped_rows_simt_kernel<kFp8, kScales, kBT, false><<<grid, kThreads, smem, stream>>>(p);
}

}  // namespace

void grouped_rows_simt(const SimtRowsProblem& pr, const int32_t* offsets, int64_t G, GemmOutput out,
                       cudaStream_t stream) {
  const char* what = "grouped_rows_simt";
  check_groups(what, offsets, G, pr.M);
  FP4MOE_CHECK(pr.P >= 1 && pr.Q >= 1 && pr.P <= INT32_MAX && pr.Q <= INT32_MAX,
               "{}: the output width P and the reduction Q must be in [1, 2^31), got P={} Q={}", what, pr.P, pr.Q);
  FP4MOE_CHECK(!pr.fp8 || (!pr.b_transposed && pr.b_scale_kind != SimtWeightScales::none),
               "{}: FP8 weights are [P, Q] with 128x128 or 1x128 scales (b_transposed is for BF16 only)", what);
  FP4MOE_CHECK(pr.fp8 || pr.b_scale_kind == SimtWeightScales::none, "{}: BF16 weights take no scales", what);
  check_output(what, out, false);
  if (pr.M == 0) return;
  FP4MOE_CHECK(pr.a != nullptr && pr.b != nullptr && (!pr.fp8 || (pr.a_scales != nullptr && pr.b_scales != nullptr)),
               "{}: null operand or scales (a={}, b={}, a_scales={}, b_scales={})", what, pr.a, pr.b,
               static_cast<const void*>(pr.a_scales), static_cast<const void*>(pr.b_scales));
  const int64_t col_blocks = ceil_div(pr.P, int64_t{kTile});
  const int64_t tiles = (ceil_div(pr.M, int64_t{kTile}) + G) * col_blocks;  // bounds every split's tile count
  FP4MOE_CHECK(tiles <= INT32_MAX, "{}: {} output tiles of 64 x 64 exceed 2^31 - 1", what, tiles);
  RowsParams p{pr.a, pr.a_scales, pr.b, pr.b_scales, offsets, static_cast<int32_t>(G), static_cast<int32_t>(pr.M),
               static_cast<int32_t>(pr.P), static_cast<int32_t>(pr.Q), 0, 0, fp8_row_scale_ld(pr.M), out.data};
  if (pr.b_scale_kind == SimtWeightScales::block128) {
    p.b_scales_stride = fp8_block_scale_count(pr.P, pr.Q);
    p.b_scale_ld = fp8_block_scale_ld(pr.Q);
  } else if (pr.b_scale_kind == SimtWeightScales::row128) {
    p.b_scales_stride = fp8_row_scale_count(pr.P, pr.Q);
    p.b_scale_ld = fp8_row_scale_ld(pr.P);
  }
  const bool f32 = out.type == GemmOutType::fp32;
  const unsigned grid = grid_for(tiles);
  const size_t smem = 2 * sizeof(int32_t) * static_cast<size_t>(G + 1);
  if (!pr.fp8 && pr.b_transposed)
    launch_rows<false, SimtWeightScales::none, true>(p, f32, grid, smem, stream);
  else if (!pr.fp8)
    launch_rows<false, SimtWeightScales::none, false>(p, f32, grid, smem, stream);
  else if (pr.b_scale_kind == SimtWeightScales::block128)
    launch_rows<true, SimtWeightScales::block128, false>(p, f32, grid, smem, stream);
  else
    launch_rows<true, SimtWeightScales::row128, false>(p, f32, grid, smem, stream);
  CUDA_CHECK_LAUNCH();
}

void grouped_wgrad_simt(const SimtWgradProblem& pr, const int32_t* offsets, int64_t G, GemmOutput out,
                        cudaStream_t stream) {
  const char* what = "grouped_wgrad_simt";
  check_groups(what, offsets, G, pr.M);
  FP4MOE_CHECK(pr.N >= 1 && pr.K >= 1 && pr.N <= INT32_MAX && pr.K <= INT32_MAX,
               "{}: N and K must be in [1, 2^31), got N={} K={}", what, pr.N, pr.K);
  if (pr.fp8) {
    const std::string pad_problem = wgrad_token_pad_problem(pr.token_pad);
    FP4MOE_CHECK(pad_problem.empty(), "{}: {}", what, pad_problem);
  }
  check_output(what, out, true);
  FP4MOE_CHECK(pr.M == 0 || (pr.dy != nullptr && pr.x != nullptr &&
                             (!pr.fp8 || (pr.dy_scales != nullptr && pr.x_scales != nullptr))),
               "{}: null operand or scales (dy={}, x={}, dy_scales={}, x_scales={})", what, pr.dy, pr.x,
               static_cast<const void*>(pr.dy_scales), static_cast<const void*>(pr.x_scales));
  const int64_t tiles = G * ceil_div(pr.N, int64_t{kTile}) * ceil_div(pr.K, int64_t{kTile});
  FP4MOE_CHECK(tiles <= INT32_MAX, "{}: {} output tiles of 64 x 64 exceed 2^31 - 1", what, tiles);
  const WgradParams p{pr.dy, pr.dy_scales, pr.x, pr.x_scales, offsets, static_cast<int32_t>(G),
                      static_cast<int32_t>(pr.M), static_cast<int32_t>(pr.N), static_cast<int32_t>(pr.K),
                      static_cast<int32_t>(pr.fp8 ? pr.token_pad : 1), out.data, out.accumulate};
  const unsigned grid = grid_for(tiles);
  const size_t smem = 3 * sizeof(int32_t) * static_cast<size_t>(G + 1);
  const bool f32 = out.type == GemmOutType::fp32;
  if (pr.fp8 && f32)
    grouped_wgrad_simt_kernel<true, true><<<grid, kThreads, smem, stream>>>(p);
  else if (pr.fp8)
    grouped_wgrad_simt_kernel<true, false><<<grid, kThreads, smem, stream>>>(p);
  else if (f32)
    grouped_wgrad_simt_kernel<false, true><<<grid, kThreads, smem, stream>>>(p);
  else
    grouped_wgrad_simt_kernel<false, false><<<grid, kThreads, smem, stream>>>(p);
  CUDA_CHECK_LAUNCH();
}

}  // namespace fp4moe
