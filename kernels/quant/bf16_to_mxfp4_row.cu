// BF16 -> MXFP4 row quantization (bf16_to_mxfp4_row.h).
// bench_quant times it against the copy ceiling (results: reports/results/h200/README.md).
//
// The [M, K] tensor is walked as one flat sequence of 8-element chunks (16 bytes of BF16): K % 32 == 0, so every
// MX block is four consecutive chunks of one row, and its codes (16 bytes) and scale (1 byte) sit at the flat
// block index in [M, K/2] and [M, K/32]. One thread block per tile of kThreads x kChunksPerThread chunks (the
// blocks stride only past 2^31 - 1 tiles): each thread issues its four 16-byte loads first; then, per chunk, four
// consecutive lanes hold one MX block, the block amax is an integer maximum of BF16 magnitude bits over two warp
// shuffles, and each lane writes its 4 bytes of codes (a warp writes 128 contiguous bytes). A full tile takes no
// bounds checks and indexes with 32-bit offsets from the tile's base pointers; only the last tile checks.
// RNE scales and rounds two elements per BF16x2 instruction (encode_chunk_rne below); stochastic rounding scales
// each element by one exact fp32 product 2^-e and draws the numbers of uniform_from_counter_fast (mx_fast_codecs.h,
// the same values as formats.h's): its cost is that per-element hash. The NaN/Inf blocks are counted per warp and
// added with one atomic per warp at the end.
#include <cuda_bf16.h>

#include <climits>

#include "kernels/formats/formats.h"
#include "kernels/quant/bf16_to_mxfp4_row.h"
#include "kernels/quant/layouts.h"
#include "kernels/quant/mx_fast_codecs.h"
#include "kernels/quant/mx_row_checks.h"

namespace fp4moe {
namespace {

constexpr int kThreads = 256;
constexpr int kChunksPerThread = 4;                 // independent 16-byte loads in flight per thread
constexpr int kTile = kThreads * kChunksPerThread;  // chunks per thread block
constexpr int kChunk = 8;                           // BF16 elements per chunk (16 bytes); 4 chunks per MX block
static_assert(kMxBlock == 4 * kChunk, "four lanes per MX block");
static_assert(kThreads % 32 == 0 && kTile % 4 == 0, "whole warps (the amax shuffles need every lane), whole blocks");

constexpr uint32_t kBf16AbsNonFinite = 0x7F80;  // |x| bits >= this: Inf or NaN

// Largest BF16 magnitude bits of one chunk (bits order like magnitudes; >= kBf16AbsNonFinite: Inf or NaN).
__device__ __forceinline__ uint32_t chunk_amax_bits(const uint4& v) {
  const uint32_t m2 = __vmaxu2(__vmaxu2(v.x & 0x7FFF7FFFu, v.y & 0x7FFF7FFFu),
                               __vmaxu2(v.z & 0x7FFF7FFFu, v.w & 0x7FFF7FFFu));
  return max(m2 & 0xFFFFu, m2 >> 16);
}

// mx_scale_exponent of a finite, nonzero BF16 amax given by its magnitude bits, read off the exponent field when
// amax is a normal (floor: exponent - 2; ceil: one more when the 7-bit fraction exceeds 1.5; clamped at -127).
__device__ __forceinline__ int block_exponent(uint32_t amax_bits, MxScaleMode mode) {
  const int biased = static_cast<int>(amax_bits >> 7);
  if (biased == 0) return mx_scale_exponent(bf16_bits_to_f32(static_cast<uint16_t>(amax_bits)), mode);
  const int up = (mode == MxScaleMode::ceil && (amax_bits & 0x7Fu) > 0x40u) ? 1 : 0;
  return max(biased - kUE8M0Bias - 2 + up, -127);
}

// Stochastic E2M1 magnitude code of a = |v * 2^-e| with u in [0, 1): the rule of f32_to_e2m1_stochastic without
// its search loop. lo = the largest magnitude <= a, and a rounds up with probability (a - lo) / step, the
// division by the power-of-two step done as an exact product.
__device__ __forceinline__ uint32_t e2m1_stochastic_magnitude(float a, float u) {
  const uint32_t lo = static_cast<uint32_t>(a >= 0.5f) + static_cast<uint32_t>(a >= 1.0f) +
                      static_cast<uint32_t>(a >= 1.5f) + static_cast<uint32_t>(a >= 2.0f) +
                      static_cast<uint32_t>(a >= 3.0f) + static_cast<uint32_t>(a >= 4.0f);
  const float lo_value = 0.5f * static_cast<float>(e2m1_half_units(lo));
  const float inv_step = lo < 4u ? 2.0f : (lo < 6u ? 1.0f : 0.5f);  // steps 0.5, 1, 2
  const float p_up = __fmul_rn(__fsub_rn(a, lo_value), inv_step);
  const uint32_t code = u < p_up ? lo + 1u : lo;
  return a >= kE2M1Max ? 7u : code;
}

// Stochastic rounding of 8 BF16 (one chunk) of a finite block with inv_scale = 2^-e: 8 E2M1 codes, element i in
// bits 4i..4i+3, the sign bit of v kept (-0 included). The product is an exact power-of-two scaling (rounded only
// below 2^-126, far under 0.25). Element i draws its number from the counter first_index + i.
__device__ __forceinline__ uint32_t encode_chunk_stochastic(const uint4& v, float inv_scale, uint64_t seed,
                                                            uint64_t first_index) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  uint32_t packed = 0;
#pragma unroll
  for (int i = 0; i < kChunk; ++i) {
    const uint32_t bits = (i & 1) ? (w[i / 2] & 0xFFFF0000u) : (w[i / 2] << 16);  // BF16 -> fp32 bits
    const float a = fabsf(__fmul_rn(__uint_as_float(bits), inv_scale));
    const uint32_t magnitude = e2m1_stochastic_magnitude(a, detail::uniform_from_counter_fast(seed, first_index + i));
    packed |= (magnitude | ((bits >> 28) & 8u)) << (4 * i);
  }
  return packed;
}

// RNE: two elements per BF16x2 instruction (mx_fast_codecs.h e2m1_pair_rne_bf16x2): half the instructions of an
// fp32 encoder (one fp32 product and one rounding per element), which it replaced when timed faster (bench_quant).
// Encode 8 BF16 (one chunk) of a finite block with RNE: element i's code in bits 4i..4i+3.
__device__ __forceinline__ uint32_t encode_chunk_rne(const uint4& v, float inv_scale) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  const __nv_bfloat162 inv2 = __float2bfloat162_rn(inv_scale);  // 2^-e, e in [-127, 126]: exact in BF16
  uint32_t byte[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t c = detail::e2m1_pair_rne_bf16x2(w[i], inv2);
    byte[i] = c | (c >> 12);  // byte 0: element 2i low nibble, element 2i+1 high nibble
  }
  return __byte_perm(__byte_perm(byte[0], byte[1], 0x0040), __byte_perm(byte[2], byte[3], 0x0040), 0x5410);
}

struct QuantParams {
  MxScaleMode mode;
  uint64_t seed;
  uint64_t index_base;  // counter of the tensor's first element (stochastic rounding)
  unsigned long long* nonfinite_blocks;
};

// One tile: `valid` chunks from xt (all kTile when kFull). first_chunk: the tile's flat chunk index. Every lane
// of the block runs it (the shuffles need whole warps); `counted` collects, on lane 0 of each warp, the NaN/Inf
// blocks met.
template <Rounding kRounding, bool kFull>
__device__ __forceinline__ void quantize_tile(const uint4* __restrict__ xt, int valid, uint64_t first_chunk,
                                             const QuantParams& p, uint32_t* __restrict__ ct,
                                             uint8_t* __restrict__ st, unsigned long long& counted) {
  const int lane = threadIdx.x & 31;
  uint4 v[kChunksPerThread];
#pragma unroll
  for (int j = 0; j < kChunksPerThread; ++j) {
    const int c = j * kThreads + static_cast<int>(threadIdx.x);
    v[j] = (kFull || c < valid) ? __ldcs(xt + c) : make_uint4(0, 0, 0, 0);  // streamed once: evict first
  }
#pragma unroll
  for (int j = 0; j < kChunksPerThread; ++j) {
    const int c = j * kThreads + static_cast<int>(threadIdx.x);  // valid % 4 == 0: a block is all in or all out
    uint32_t amax_bits = chunk_amax_bits(v[j]);
    amax_bits = max(amax_bits, __shfl_xor_sync(0xFFFFFFFFu, amax_bits, 1));
    amax_bits = max(amax_bits, __shfl_xor_sync(0xFFFFFFFFu, amax_bits, 2));
    const bool nonfinite = amax_bits >= kBf16AbsNonFinite;

    uint32_t packed = 0;  // NaN/Inf block and all-zero block: codes 0
    uint8_t scale = nonfinite ? kUE8M0NaN : 0;
    if (!nonfinite && amax_bits != 0) {
      const int e = block_exponent(amax_bits, p.mode);
      scale = static_cast<uint8_t>(e + kUE8M0Bias);
      if constexpr (kRounding == Rounding::rne)
        packed = encode_chunk_rne(v[j], exp2_exact(-e));
      else
        packed = encode_chunk_stochastic(v[j], exp2_exact(-e), p.seed,
                                         p.index_base + (first_chunk + static_cast<uint64_t>(c)) * kChunk);
    }
    const bool in = kFull || c < valid;
    if (in) {
      ct[c] = packed;
      if ((lane & 3) == 0) st[c / 4] = scale;
    }
    if (p.nonfinite_blocks != nullptr) {
      const unsigned ballot = __ballot_sync(0xFFFFFFFFu, in && nonfinite && (lane & 3) == 0);
      counted += static_cast<unsigned long long>(__popc(ballot));
    }
  }
}

template <Rounding kRounding>
__global__ void __launch_bounds__(kThreads)
bf16_to_mxfp4_row_kernel(const uint4* __restrict__ x, int64_t num_chunks, QuantParams p,
                         uint32_t* __restrict__ codes, uint8_t* __restrict__ scales) {
  unsigned long long counted = 0;
  // `base` is the same for the whole thread block: every lane runs every tile (shuffles stay legal).
  for (int64_t base = int64_t{blockIdx.x} * kTile; base < num_chunks; base += int64_t{gridDim.x} * kTile) {
    const uint4* xt = x + base;
    uint32_t* ct = codes + base;
    uint8_t* st = scales + base / 4;
    if (num_chunks - base >= kTile)
      quantize_tile<kRounding, true>(xt, kTile, base, p, ct, st, counted);
    else
      quantize_tile<kRounding, false>(xt, static_cast<int>(num_chunks - base), base, p, ct, st, counted);
  }
  if (p.nonfinite_blocks != nullptr && (threadIdx.x & 31) == 0 && counted != 0) atomicAdd(p.nonfinite_blocks, counted);
}

}  // namespace

void bf16_to_mxfp4_row(const bf16* x, int64_t M, int64_t K, uint8_t* codes, uint8_t* scales,
                       const MxQuantConfig& cfg, unsigned long long* nonfinite_blocks, cudaStream_t stream) {
  const char* what = "bf16_to_mxfp4_row";
  detail::check_mx_row_shape(what, M, K);
  FP4MOE_CHECK(cfg.scale_mode == MxScaleMode::floor || cfg.scale_mode == MxScaleMode::ceil,
               "{}: unknown MX scale mode {}", what, static_cast<int>(cfg.scale_mode));
  FP4MOE_CHECK(cfg.rounding == Rounding::rne || cfg.rounding == Rounding::stochastic, "{}: unknown rounding {}",
               what, static_cast<int>(cfg.rounding));
  FP4MOE_CHECK(cfg.row_offset >= 0, "{}: row_offset must be >= 0, got {}", what, cfg.row_offset);
  if (M == 0) return;
  detail::check_mx_pointer(what, "x", x, 16);
  detail::check_mx_pointer(what, "codes", codes, 16);
  detail::check_mx_pointer(what, "scales", scales, 1);
  if (nonfinite_blocks != nullptr) detail::check_mx_pointer(what, "nonfinite_blocks", nonfinite_blocks, 8);

  const int64_t num_chunks = M * K / kChunk;
  const int64_t tiles = ceil_div(num_chunks, int64_t{kTile});
  const unsigned grid = static_cast<unsigned>(tiles < INT_MAX ? tiles : INT_MAX);  // past it the blocks stride
  const QuantParams p{cfg.scale_mode, cfg.seed, static_cast<uint64_t>(cfg.row_offset) * static_cast<uint64_t>(K),
                      nonfinite_blocks};
  const auto* x16 = reinterpret_cast<const uint4*>(x);
  auto* codes32 = reinterpret_cast<uint32_t*>(codes);
  if (cfg.rounding == Rounding::rne)
    bf16_to_mxfp4_row_kernel<Rounding::rne><<<grid, kThreads, 0, stream>>>(x16, num_chunks, p, codes32, scales);
  else
    bf16_to_mxfp4_row_kernel<Rounding::stochastic><<<grid, kThreads, 0, stream>>>(x16, num_chunks, p, codes32, scales);
  CUDA_CHECK_LAUNCH();
}

}  // namespace fp4moe
