// BF16 -> FP8 column quantization over ragged groups (bf16_to_fp8.h), the fp8 recipe's Wgrad operand. One thread
// block per (group, 128-token block, 128 features), found on the device from the device offsets
// (ragged_token_blocks.cuh):
//   1. 128 token rows x 128 features (256 contiguous bytes per row) copied with eight 16-byte cp.async per thread
//      into shared memory, BF16 pairs as 32-bit words, XOR-swizzled per 16-token chunk so that the column reads
//      below are free of bank conflicts;
//   2. lane = chunk + 8 j: a thread reads one feature pair over 16 tokens, 8 lanes reduce the pair's amax;
//   3. each thread writes 16 codes per feature with one 16-byte store: 8 lanes fill 128 bytes of a feature row.
#include "kernels/common/check.h"
#include "kernels/common/offsets.h"
#include "kernels/quant/bf16_fp8_device.cuh"
#include "kernels/quant/bf16_to_fp8.h"
#include "kernels/quant/cp_async.cuh"
#include "kernels/quant/fp8_shape_checks.h"
#include "kernels/quant/layouts.h"
#include "kernels/quant/ragged_token_blocks.cuh"

namespace fp4moe {
namespace {

constexpr int kThreads = 256;
constexpr int kTileTokens = kFp8Block;  // 128
constexpr int kTileFeatures = 128;
constexpr int kRowChunks = kTileFeatures / 8;  // 16-byte chunks (8 BF16) per tile row
constexpr int kRowWords = kTileFeatures / 2;   // BF16 pairs per tile row
constexpr int kCopies = kTileTokens * kRowChunks / kThreads;  // 8
static_assert(kRowWords * 8 == 2 * kThreads, "two (feature pair, 16-token chunk) tasks per thread");

using Finder = detail::TokenBlockFinder<kThreads>;

struct Shared {
  uint32_t x[kTileTokens * kRowWords];  // pair p of token t at t * 64 + (p ^ (4 * chunk(t)))
};

__global__ void __launch_bounds__(kThreads)
bf16_to_fp8_col_kernel(const bf16* __restrict__ x, int64_t M, int64_t K, const int32_t* __restrict__ offsets, int G,
                       Fp8ScaleMode mode, uint8_t* __restrict__ codes, float* __restrict__ scales,
                       unsigned long long* __restrict__ nonfinite_blocks) {
  __shared__ Shared sh;
  detail::TokenBlock tb;
  if (!Finder::find_by_warp(offsets, G, M, K, blockIdx.x, tb)) return;  // the same answer in every warp
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t k0 = int64_t{blockIdx.y} * kTileFeatures;

  // 1. Thread (token t0 + 16 r, 8-feature chunk q) for r < 8; 16 lanes copy a row's 256 contiguous bytes.
  {
    const int t0 = tid / kRowChunks, q = tid % kRowChunks;
    const bool k_valid = k0 + 8 * q < K;  // K % 16 == 0: a chunk is all in or all out
    const bf16* src = x + (tb.row0 + t0) * K + k0 + 8 * q;
#pragma unroll
    for (int r = 0; r < kCopies; ++r) {
      const int t = t0 + 16 * r;
      const bool valid = k_valid && t < tb.rows;
      detail::cp_async_16(&sh.x[t * kRowWords + 4 * (q ^ ((t >> 4) & 7))], valid ? src + 16 * r * K : x, valid);
    }
    detail::cp_async_commit();
    detail::cp_async_wait<0>();
  }
  __syncthreads();

  // 2./3. Task s: feature pair p = 4 (warp + 8 s) + j (features k0 + 2 p, + 1) over tokens 16 c .. 16 c + 15.
  const int c = lane & 7;
#pragma unroll
  for (int s = 0; s < 2; ++s) {
    const int p = 4 * (warp + 8 * s) + (lane >> 3);
    uint32_t pairs[16];
    uint32_t m2 = 0;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      pairs[i] = sh.x[(16 * c + i) * kRowWords + (p ^ (c << 2))];
      m2 = detail::bf16x2_abs_max(m2, pairs[i]);
    }
#pragma unroll
    for (int off = 1; off < 8; off <<= 1) m2 = detail::bf16x2_abs_max(m2, __shfl_xor_sync(0xFFFFFFFFu, m2, off));
    const Fp8BlockScale s_lo = fp8_block_scale(bf16_bits_to_f32(static_cast<uint16_t>(m2 & 0xFFFFu)), mode);
    const Fp8BlockScale s_hi = fp8_block_scale(bf16_bits_to_f32(static_cast<uint16_t>(m2 >> 16)), mode);

    const int64_t k = k0 + 2 * p;
    if (k >= K) continue;  // K % 16 == 0: both features of the pair exist or neither
    if (c == 0) {
      scales[tb.scales_offset + k] = s_lo.scale;
      scales[tb.scales_offset + k + 1] = s_hi.scale;
      int bad = int{s_lo.nonfinite} + int{s_hi.nonfinite};
      if (bad && nonfinite_blocks) atomicAdd(nonfinite_blocks, static_cast<unsigned long long>(bad));
    }
    if (tb.col0 + 16 * c >= tb.ld) continue;  // past the group's padded length
    const int valid = tb.rows - 16 * c;       // tokens of this chunk that exist (<= 0: pure padding, zeros)
    uint4 lo = s_lo.nonfinite ? detail::e4m3_nan16(valid) : detail::bf16_column16_to_e4m3<false>(pairs, s_lo.multiplier);
    uint4 hi = s_hi.nonfinite ? detail::e4m3_nan16(valid) : detail::bf16_column16_to_e4m3<true>(pairs, s_hi.multiplier);
    uint8_t* dst = codes + tb.codes_offset + k * tb.ld + tb.col0 + 16 * c;
    *reinterpret_cast<uint4*>(dst) = lo;
    *reinterpret_cast<uint4*>(dst + tb.ld) = hi;
  }
}

}  // namespace

void bf16_to_fp8_col(const bf16* x, int64_t M, int64_t K, const int32_t* offsets, int64_t G,
                     const int32_t* host_offsets, Fp8ScaleMode mode, uint8_t* codes, float* scales,
                     unsigned long long* nonfinite_blocks, cudaStream_t stream) {
  const char* what = "bf16_to_fp8_col";
  detail::check_fp8_shape(what, "x", "M", M, K, false);
  FP4MOE_CHECK(mode == Fp8ScaleMode::pow2 || mode == Fp8ScaleMode::fp32, "{}: unknown scale mode {}", what,
               static_cast<int>(mode));
  FP4MOE_CHECK(ceil_div(K, kTileFeatures) <= 65535, "{}: K={} too large (at most {})", what, K, 65535 * kTileFeatures);
  FP4MOE_CHECK(G >= 1 && G <= detail::kMaxColGroups, "{}: G must be in [1, {}], got G={}", what,
               detail::kMaxColGroups, G);
  FP4MOE_CHECK(offsets != nullptr, "{}: device group offsets are null (expected int32 [G+1] = [{}])", what, G + 1);
  FP4MOE_CHECK(codes != nullptr && scales != nullptr, "{}: output pointers are null", what);
  FP4MOE_CHECK(M == 0 || x != nullptr, "{}: input pointer is null", what);
  FP4MOE_CHECK(detail::aligned16(x) && detail::aligned16(codes), "{}: x and codes must be 16-byte aligned", what);
  FP4MOE_CHECK((reinterpret_cast<uintptr_t>(scales) & 3u) == 0, "{}: scales must be 4-byte aligned", what);
  detail::check_nonfinite_counter(what, nonfinite_blocks);
  if (host_offsets) validate_group_offsets(host_offsets, G, M, what);
  if (M == 0) return;  // every group is empty

  dim3 grid(static_cast<unsigned>(ceil_div(M, kFp8Block) + G), static_cast<unsigned>(ceil_div(K, kTileFeatures)));
  bf16_to_fp8_col_kernel<<<grid, kThreads, 0, stream>>>(x, M, K, offsets, static_cast<int>(G), mode, codes, scales,
                                                         nonfinite_blocks);
  CUDA_CHECK_LAUNCH();
}

}  // namespace fp4moe
