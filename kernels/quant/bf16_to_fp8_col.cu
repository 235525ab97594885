// BF16 -> FP8 column quantization over ragged groups (bf16_to_fp8.h), the fp8 recipe's Wgrad operand. One thread
// block per (group, 128-token block, 64 features), found on the device from the device offsets
// (ragged_token_blocks.cuh):
//   1. 128 token rows x 64 features loaded with 16-byte loads into shared memory, BF16 pairs as 32-bit words,
//      XOR-swizzled per 16-token chunk so that the column reads below are free of bank conflicts;
//   2. lane = chunk + 8 j: a thread reads one feature pair over 16 tokens, 8 lanes reduce the pair's amax;
//   3. each thread writes 16 codes per feature with one 16-byte store: 8 lanes fill 128 bytes of a feature row.
#include "kernels/common/check.h"
#include "kernels/common/offsets.h"
#include "kernels/quant/bf16_fp8_device.cuh"
#include "kernels/quant/bf16_to_fp8.h"
#include "kernels/quant/fp8_shape_checks.h"
#include "kernels/quant/layouts.h"
#include "kernels/quant/ragged_token_blocks.cuh"

namespace fp4moe {
namespace {

constexpr int kThreads = 256;
constexpr int kTileTokens = kFp8Block;  // 128
constexpr int kTileFeatures = 64;
constexpr int kRowWords = kTileFeatures / 2;  // BF16 pairs per tile row
static_assert(kTileTokens * kTileFeatures / 8 == 4 * kThreads, "four 16-byte loads per thread");
static_assert(kRowWords * 8 == kThreads, "one (feature pair, 16-token chunk) per thread");

using Finder = detail::TokenBlockFinder<kThreads>;

struct Shared {
  Finder::Storage find;
  uint32_t x[kTileTokens * kRowWords];  // pair w of token t at t * 32 + (w ^ (4 * chunk(t)))
};

__global__ void __launch_bounds__(kThreads)
bf16_to_fp8_col_kernel(const bf16* __restrict__ x, int64_t M, int64_t K, const int32_t* __restrict__ offsets, int G,
                       Fp8ScaleMode mode, uint8_t* __restrict__ codes, float* __restrict__ scales,
                       unsigned long long* __restrict__ nonfinite_blocks) {
  __shared__ Shared sh;
  detail::TokenBlock tb;
  if (!Finder::find(offsets, G, M, K, blockIdx.x, sh.find, tb)) return;
  const int64_t k0 = int64_t{blockIdx.y} * kTileFeatures;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

  // 1. Load: thread (token t, 8-feature chunk q); 8 lanes read a row's 128 contiguous bytes.
  uint4 v[4];
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    int idx = tid + r * kThreads, t = idx >> 3, q = idx & 7;
    v[r] = make_uint4(0, 0, 0, 0);
    if (t < tb.rows && k0 + 8 * q < K) v[r] = __ldg(reinterpret_cast<const uint4*>(x + (tb.row0 + t) * K + k0 + 8 * q));
  }
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    int idx = tid + r * kThreads, t = idx >> 3, q = idx & 7;
    *reinterpret_cast<uint4*>(&sh.x[t * kRowWords + 4 * (q ^ ((t >> 4) & 7))]) = v[r];
  }
  __syncthreads();

  // 2. amax of features k0 + 2 wi and k0 + 2 wi + 1 over the block's tokens.
  const int c = lane & 7, wi = 4 * warp + (lane >> 3);
  uint32_t pairs[16];
  uint32_t m2 = 0;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    pairs[i] = sh.x[(16 * c + i) * kRowWords + (wi ^ (c << 2))];
    m2 = detail::bf16x2_abs_max(m2, pairs[i]);
  }
#pragma unroll
  for (int off = 1; off < 8; off <<= 1) m2 = detail::bf16x2_abs_max(m2, __shfl_xor_sync(0xFFFFFFFFu, m2, off));
  const Fp8BlockScale s_lo = fp8_block_scale(bf16_bits_to_f32(static_cast<uint16_t>(m2 & 0xFFFFu)), mode);
  const Fp8BlockScale s_hi = fp8_block_scale(bf16_bits_to_f32(static_cast<uint16_t>(m2 >> 16)), mode);

  const int64_t k = k0 + 2 * wi;
  if (k >= K) return;  // K % 16 == 0: both features of the pair exist or neither
  if (c == 0) {
    scales[tb.scales_offset + k] = s_lo.scale;
    scales[tb.scales_offset + k + 1] = s_hi.scale;
    int bad = int{s_lo.nonfinite} + int{s_hi.nonfinite};
    if (bad && nonfinite_blocks) atomicAdd(nonfinite_blocks, static_cast<unsigned long long>(bad));
  }

  // 3. Codes: 16 tokens per feature, one 16-byte store each; zero past the group's tokens up to L_g.
  if (tb.col0 + 16 * c >= tb.ld) return;
  const int valid = tb.rows - 16 * c;  // tokens of this chunk that exist (<= 0: pure padding)
  uint4 lo = s_lo.nonfinite ? detail::e4m3_nan16(valid) : detail::bf16_column16_to_e4m3<false>(pairs, s_lo.multiplier);
  uint4 hi = s_hi.nonfinite ? detail::e4m3_nan16(valid) : detail::bf16_column16_to_e4m3<true>(pairs, s_hi.multiplier);
  uint8_t* dst = codes + tb.codes_offset + k * tb.ld + tb.col0 + 16 * c;
  *reinterpret_cast<uint4*>(dst) = lo;
  *reinterpret_cast<uint4*>(dst + tb.ld) = hi;
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
  if (host_offsets) validate_group_offsets(host_offsets, G, M, what);
  if (M == 0) return;  // every group is empty

  dim3 grid(static_cast<unsigned>(ceil_div(M, kFp8Block) + G), static_cast<unsigned>(ceil_div(K, kTileFeatures)));
  bf16_to_fp8_col_kernel<<<grid, kThreads, 0, stream>>>(x, M, K, offsets, static_cast<int>(G), mode, codes, scales,
                                                         nonfinite_blocks);
  CUDA_CHECK_LAUNCH();
}

}  // namespace fp4moe
