// BF16 -> FP8 128x128 block quantization of weights (bf16_to_fp8.h). One thread block per 128x128 tile:
// eight 16-byte loads per thread, a block-wide amax of magnitude bits, then
//   transpose = false: each thread writes its 8 codes per row chunk straight back (16 lanes cover a 128-byte row);
//   transpose = true : the tile goes through shared memory (BF16 pairs, XOR-swizzled per 16-row chunk) and each
//                      thread writes two W^T rows of 16 codes (8 lanes cover a 128-byte row of W^T).
#include "kernels/common/check.h"
#include "kernels/quant/bf16_fp8_device.cuh"
#include "kernels/quant/bf16_to_fp8.h"
#include "kernels/quant/fp8_shape_checks.h"
#include "kernels/quant/layouts.h"

namespace fp4moe {
namespace {

constexpr int kThreads = 256;
constexpr int kTile = kFp8Block;          // 128
constexpr int kChunksPerRow = kTile / 8;  // 16-byte chunks (8 BF16) per tile row
constexpr int kLoads = kTile * kChunksPerRow / kThreads;  // 8
constexpr int kRowWords = kTile / 2;      // BF16 pairs per tile row

template <bool kTranspose>
__global__ void __launch_bounds__(kThreads)
bf16_to_fp8_block128_kernel(const bf16* __restrict__ w, int64_t N, int64_t K, Fp8ScaleMode mode,
                            uint8_t* __restrict__ codes, float* __restrict__ scales,
                            unsigned long long* __restrict__ nonfinite_blocks) {
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t kb = blockIdx.x, nb = blockIdx.y, n0 = nb * kTile, k0 = kb * kTile;

  uint4 v[kLoads];
  uint32_t m2 = 0;
#pragma unroll
  for (int r = 0; r < kLoads; ++r) {
    int idx = tid + r * kThreads, n = idx / kChunksPerRow, q = idx % kChunksPerRow;
    v[r] = make_uint4(0, 0, 0, 0);
    if (n0 + n < N && k0 + 8 * q < K) v[r] = __ldg(reinterpret_cast<const uint4*>(w + (n0 + n) * K + k0 + 8 * q));
    m2 = detail::bf16x2_abs_max(detail::bf16x2_abs_max(m2, v[r].x), v[r].y);
    m2 = detail::bf16x2_abs_max(detail::bf16x2_abs_max(m2, v[r].z), v[r].w);
  }
  uint32_t amax_bits = __reduce_max_sync(0xFFFFFFFFu, max(m2 & 0xFFFFu, m2 >> 16));

  __shared__ uint32_t warp_amax[kThreads / 32];
  __shared__ uint32_t tile[kTranspose ? kTile * kRowWords : 1];  // pair p of row n at n * 64 + (p ^ (4 * chunk(n)))
  if (lane == 0) warp_amax[warp] = amax_bits;
  if constexpr (kTranspose) {
#pragma unroll
    for (int r = 0; r < kLoads; ++r) {
      int idx = tid + r * kThreads, n = idx / kChunksPerRow, q = idx % kChunksPerRow;
      *reinterpret_cast<uint4*>(&tile[n * kRowWords + 4 * (q ^ ((n >> 4) & 7))]) = v[r];
    }
  }
  __syncthreads();
  amax_bits = warp_amax[0];
#pragma unroll
  for (int i = 1; i < kThreads / 32; ++i) amax_bits = max(amax_bits, warp_amax[i]);
  const Fp8BlockScale sc = fp8_block_scale(bf16_bits_to_f32(static_cast<uint16_t>(amax_bits)), mode);

  // Scale, and the padding entries (1.0) at the end of each scale row, written by the last tile of the row.
  const int64_t blocks_k = gridDim.x, blocks_n = gridDim.y;
  if (tid == 0) {
    if (sc.nonfinite && nonfinite_blocks) atomicAdd(nonfinite_blocks, 1ull);
    if constexpr (kTranspose) scales[kb * fp8_block_scale_ld(N) + nb] = sc.scale;
    else scales[nb * fp8_block_scale_ld(K) + kb] = sc.scale;
  }
  if constexpr (kTranspose) {
    const int64_t ld = fp8_block_scale_ld(N);
    if (nb == blocks_n - 1 && tid < ld - blocks_n) scales[kb * ld + blocks_n + tid] = 1.0f;
  } else {
    const int64_t ld = fp8_block_scale_ld(K);
    if (kb == blocks_k - 1 && tid < ld - blocks_k) scales[nb * ld + blocks_k + tid] = 1.0f;
  }

  if constexpr (!kTranspose) {
#pragma unroll
    for (int r = 0; r < kLoads; ++r) {
      int idx = tid + r * kThreads, n = idx / kChunksPerRow, q = idx % kChunksPerRow;
      if (n0 + n >= N || k0 + 8 * q >= K) continue;
      uint2 out = sc.nonfinite ? make_uint2(0x7F7F7F7Fu, 0x7F7F7F7Fu)
                               : make_uint2(detail::bf16x4_to_e4m3x4(v[r].x, v[r].y, sc.multiplier),
                                            detail::bf16x4_to_e4m3x4(v[r].z, v[r].w, sc.multiplier));
      *reinterpret_cast<uint2*>(codes + (n0 + n) * K + k0 + 8 * q) = out;
    }
  } else {
    // lane = chunk c of 16 rows of W (= 16 columns of W^T) + 8 j; pair p = 4 group + j: W^T rows k0 + 2p, + 1.
    const int c = lane & 7;
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      const int p = 4 * (warp + 8 * s) + (lane >> 3);
      const int64_t k = k0 + 2 * p;
      if (k >= K || n0 + 16 * c >= N) continue;  // N % 16 == 0 and K % 16 == 0: whole chunks and pairs
      uint4 lo, hi;
      if (sc.nonfinite) {
        lo = hi = make_uint4(0x7F7F7F7Fu, 0x7F7F7F7Fu, 0x7F7F7F7Fu, 0x7F7F7F7Fu);
      } else {
        uint32_t pairs[16];
#pragma unroll
        for (int i = 0; i < 16; ++i) pairs[i] = tile[(16 * c + i) * kRowWords + (p ^ (c << 2))];
        lo = detail::bf16_column16_to_e4m3<false>(pairs, sc.multiplier);
        hi = detail::bf16_column16_to_e4m3<true>(pairs, sc.multiplier);
      }
      uint8_t* dst = codes + k * N + n0 + 16 * c;
      *reinterpret_cast<uint4*>(dst) = lo;
      *reinterpret_cast<uint4*>(dst + N) = hi;
    }
  }
}

}  // namespace

void bf16_to_fp8_block128(const bf16* w, int64_t N, int64_t K, Fp8ScaleMode mode, bool transpose, uint8_t* codes,
                          float* scales, unsigned long long* nonfinite_blocks, cudaStream_t stream) {
  const char* what = "bf16_to_fp8_block128";
  detail::check_fp8_shape(what, "w", "N", N, K, true);
  FP4MOE_CHECK(mode == Fp8ScaleMode::pow2 || mode == Fp8ScaleMode::fp32, "{}: unknown scale mode {}", what,
               static_cast<int>(mode));
  FP4MOE_CHECK(ceil_div(N, kTile) <= 65535, "{}: N={} too large (at most {})", what, N, 65535 * kTile);
  FP4MOE_CHECK(w != nullptr && codes != nullptr && scales != nullptr, "{}: null pointer (w, codes or scales)", what);
  FP4MOE_CHECK(detail::aligned16(w) && detail::aligned16(codes) && detail::aligned16(scales),
               "{}: w, codes and scales must be 16-byte aligned", what);
  detail::check_nonfinite_counter(what, nonfinite_blocks);
  dim3 grid(static_cast<unsigned>(ceil_div(K, kTile)), static_cast<unsigned>(ceil_div(N, kTile)));
  if (transpose)
    bf16_to_fp8_block128_kernel<true><<<grid, kThreads, 0, stream>>>(w, N, K, mode, codes, scales, nonfinite_blocks);
  else
    bf16_to_fp8_block128_kernel<false><<<grid, kThreads, 0, stream>>>(w, N, K, mode, codes, scales, nonfinite_blocks);
  CUDA_CHECK_LAUNCH();
}

}  // namespace fp4moe
