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
// A transform runs on the chunk in registers before the block rule: the lane's 8 elements in FP32, the butterfly
// stages within the chunk, then those across chunks with one shuffle per element (h = 8: lanes 1 apart; h = 16:
// lanes 2 apart), the scale, and the rounding back to BF16 (one BF16x2 conversion per pair); rht draws one 64-bit
// hash per chunk for its 8 signs. RNE scales and rounds two elements per BF16x2 instruction (encode_chunk_rne
// below); stochastic rounding scales each element by one exact FP32 product and rounds it with the integer
// formulation of mx_fast_codecs.h, drawing one 64-bit hash per four elements (mx_sr_bits16). The NaN/Inf blocks are
// counted per warp and added with one atomic per warp at the end.
#include <cuda_bf16.h>

#include <climits>

#include "kernels/formats/formats.h"
#include "kernels/quant/bf16_to_mxfp4_row.h"
#include "kernels/quant/layouts.h"
#include "kernels/quant/mx_fast_codecs.h"
#include "kernels/quant/mx_random.h"
#include "kernels/quant/mx_row_checks.h"
#include "kernels/quant/mx_transform.h"

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
  uint64_t rht_seed;
  uint32_t K;  // columns (rht only: K <= 2^30)
  unsigned long long* nonfinite_blocks;
};

// One butterfly stage across lanes `kLaneXor` apart: the lower lane holds a = y_j, the upper b = y_{j+h}; the
// lower keeps a + b, the upper a - b (mx_transform.h). Both as one sum, other + (+-own): IEEE addition commutes
// and a - b is a + (-b), so the bits are those of the rule, without a branch per element.
template <int kLaneXor>
__device__ __forceinline__ void butterfly_across_lanes(float (&y)[kChunk]) {
  const uint32_t own_sign = (threadIdx.x & kLaneXor) != 0 ? 0x80000000u : 0u;
#pragma unroll
  for (int i = 0; i < kChunk; ++i) {
    const float other = __shfl_xor_sync(0xFFFFFFFFu, y[i], kLaneXor);
    y[i] = __fadd_rn(other, __uint_as_float(__float_as_uint(y[i]) ^ own_sign));
  }
}

// The 8 BF16 of a chunk in FP32 (exact).
__device__ __forceinline__ void unpack_chunk(const uint4& v, float (&y)[kChunk]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < kChunk; ++i) y[i] = __uint_as_float((i & 1) ? (w[i / 2] & 0xFFFF0000u) : (w[i / 2] << 16));
}

// T(x) on the chunk's 8 BF16 elements (mx_transform.h) in FP32, the chunk starting at column k0, rounded back to
// BF16 (RNE, as f32_to_bf16_bits). Every lane runs it (shuffles).
template <HadamardTransform kTransform>
__device__ __forceinline__ uint4 transform_chunk(const uint4& v, uint32_t k0, uint64_t rht_seed) {
  float y[kChunk];
  unpack_chunk(v, y);
  if constexpr (kTransform == HadamardTransform::rht) {
    const uint32_t signs = rht_sign_bits8(rht_seed, k0);
#pragma unroll
    for (int i = 0; i < kChunk; ++i) y[i] = __uint_as_float(__float_as_uint(y[i]) ^ (((signs >> i) & 1u) << 31));
  }
#pragma unroll
  for (int h = 1; h < kChunk; h *= 2)
#pragma unroll
    for (int i = 0; i < kChunk; i += 2 * h)
#pragma unroll
      for (int j = i; j < i + h; ++j) {
        const float a = y[j], b = y[j + h];
        y[j] = __fadd_rn(a, b);
        y[j + h] = __fsub_rn(a, b);
      }
  butterfly_across_lanes<1>(y);  // h = 8
  constexpr int n = hadamard_block_size(kTransform);
  if constexpr (n == 32) butterfly_across_lanes<2>(y);  // h = 16
  const float c = hadamard_scale(n);
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    w[i] = detail::bits_of_bf162(__floats2bfloat162_rn(__fmul_rn(y[2 * i], c), __fmul_rn(y[2 * i + 1], c)));
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Stochastic rounding of 8 BF16 (one chunk) of a finite block with inv_scale = 2^-e: element i's code in bits
// 4i..4i+3, the sign of v kept (-0 included), drawn with the 16 bits of element first_index + i
// (first_index % 8 == 0: two hashes). The product is an exact power-of-two scaling (rounded only below 2^-126).
__device__ __forceinline__ uint32_t encode_chunk_stochastic(const uint4& v, float inv_scale, uint64_t seed,
                                                            uint64_t first_index) {
  float y[kChunk];
  unpack_chunk(v, y);
  const uint64_t draws[2] = {splitmix64_at(seed, first_index / 4), splitmix64_at(seed, first_index / 4 + 1)};
  uint32_t packed = 0;
#pragma unroll
  for (int i = 0; i < kChunk; ++i) {
    const float a = fabsf(__fmul_rn(y[i], inv_scale));
    const uint32_t s = static_cast<uint32_t>(draws[i / 4] >> (16 * (i % 4))) & 0xFFFFu;
    packed |= (detail::e2m1_magnitude_sr_f32(a, s) | ((__float_as_uint(y[i]) >> 28) & 8u)) << (4 * i);
  }
  return packed;
}

// Writes a chunk's codes and (one lane in four) its block's scale, and counts its NaN/Inf block on the warp.
__device__ __forceinline__ void store_chunk(bool in, bool nonfinite, uint32_t packed, uint8_t scale, int c,
                                           const QuantParams& p, uint32_t* __restrict__ ct, uint8_t* __restrict__ st,
                                           unsigned long long& counted) {
  const int lane = threadIdx.x & 31;
  if (in) {
    ct[c] = packed;
    if ((lane & 3) == 0) st[c / 4] = scale;
  }
  if (p.nonfinite_blocks != nullptr) {
    const unsigned ballot = __ballot_sync(0xFFFFFFFFu, in && nonfinite && (lane & 3) == 0);
    counted += static_cast<unsigned long long>(__popc(ballot));
  }
}

// The largest of a value over the four lanes of an MX block.
__device__ __forceinline__ uint32_t block_max(uint32_t v) {
  v = max(v, __shfl_xor_sync(0xFFFFFFFFu, v, 1));
  return max(v, __shfl_xor_sync(0xFFFFFFFFu, v, 2));
}

// One tile: `valid` chunks from xt (all kTile when kFull). first_chunk: the tile's flat chunk index. Every lane
// of the block runs it (the shuffles need whole warps); `counted` collects, on lane 0 of each warp, the NaN/Inf
// blocks met.
template <Rounding kRounding, HadamardTransform kTransform, bool kFull>
__device__ __forceinline__ void quantize_tile(const uint4* __restrict__ xt, int valid, uint64_t first_chunk,
                                             const QuantParams& p, uint32_t* __restrict__ ct,
                                             uint8_t* __restrict__ st, unsigned long long& counted) {
  uint4 v[kChunksPerThread];
#pragma unroll
  for (int j = 0; j < kChunksPerThread; ++j) {
    const int c = j * kThreads + static_cast<int>(threadIdx.x);
    v[j] = (kFull || c < valid) ? __ldcs(xt + c) : make_uint4(0, 0, 0, 0);  // streamed once: evict first
  }
  // rht: the column of this thread's chunk (K <= 2^30, so the 32-bit sums below do not wrap); the next chunk of
  // the thread is kThreads * kChunk columns further, one subtraction away unless K is smaller than that.
  uint32_t k_chunk = 0;
  if constexpr (kTransform == HadamardTransform::rht)
    k_chunk = static_cast<uint32_t>(((first_chunk + threadIdx.x) * kChunk) % p.K);
#pragma unroll
  for (int j = 0; j < kChunksPerThread; ++j) {
    const int c = j * kThreads + static_cast<int>(threadIdx.x);  // valid % 4 == 0: a block is all in or all out
    const bool in = kFull || c < valid;
    uint4 w = v[j];
    if constexpr (kTransform != HadamardTransform::none) w = transform_chunk<kTransform>(w, k_chunk, p.rht_seed);
    if constexpr (kTransform == HadamardTransform::rht) {
      k_chunk += kThreads * kChunk;
      if (k_chunk >= p.K) k_chunk = k_chunk - p.K < p.K ? k_chunk - p.K : k_chunk % p.K;
    }
    const uint32_t amax_bits = block_max(chunk_amax_bits(w));
    const bool nonfinite = amax_bits >= kBf16AbsNonFinite;
    uint32_t packed = 0;  // NaN/Inf block and all-zero block: codes 0
    uint8_t scale = nonfinite ? kUE8M0NaN : 0;
    if (!nonfinite && amax_bits != 0) {
      const int e = block_exponent(amax_bits, p.mode);
      scale = static_cast<uint8_t>(e + kUE8M0Bias);
      if constexpr (kRounding == Rounding::rne)
        packed = encode_chunk_rne(w, exp2_exact(-e));
      else
        packed = encode_chunk_stochastic(w, exp2_exact(-e), p.seed,
                                         p.index_base + (first_chunk + static_cast<uint64_t>(c)) * kChunk);
    }
    store_chunk(in, nonfinite, packed, scale, c, p, ct, st, counted);
  }
}

template <Rounding kRounding, HadamardTransform kTransform>
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
      quantize_tile<kRounding, kTransform, true>(xt, kTile, base, p, ct, st, counted);
    else
      quantize_tile<kRounding, kTransform, false>(xt, static_cast<int>(num_chunks - base), base, p, ct, st, counted);
  }
  if (p.nonfinite_blocks != nullptr && (threadIdx.x & 31) == 0 && counted != 0) atomicAdd(p.nonfinite_blocks, counted);
}

template <Rounding kRounding>
void launch_for_transform(HadamardTransform t, unsigned grid, cudaStream_t stream, const uint4* x,
                          int64_t num_chunks, const QuantParams& p, uint32_t* codes, uint8_t* scales) {
  switch (t) {
    case HadamardTransform::none:
      bf16_to_mxfp4_row_kernel<kRounding, HadamardTransform::none><<<grid, kThreads, 0, stream>>>(x, num_chunks, p,
                                                                                                  codes, scales);
      break;
    case HadamardTransform::h16:
      bf16_to_mxfp4_row_kernel<kRounding, HadamardTransform::h16><<<grid, kThreads, 0, stream>>>(x, num_chunks, p,
                                                                                                 codes, scales);
      break;
    case HadamardTransform::h32:
      bf16_to_mxfp4_row_kernel<kRounding, HadamardTransform::h32><<<grid, kThreads, 0, stream>>>(x, num_chunks, p,
                                                                                                 codes, scales);
      break;
    case HadamardTransform::rht:
      bf16_to_mxfp4_row_kernel<kRounding, HadamardTransform::rht><<<grid, kThreads, 0, stream>>>(x, num_chunks, p,
                                                                                                 codes, scales);
      break;
  }
}

}  // namespace

void bf16_to_mxfp4_row(const bf16* x, int64_t M, int64_t K, uint8_t* codes, uint8_t* scales,
                       const MxQuantConfig& cfg, unsigned long long* nonfinite_blocks, cudaStream_t stream) {
  const char* what = "bf16_to_mxfp4_row";
  detail::check_mx_quant_config(what, M, K, cfg);
  if (M == 0) return;
  detail::check_mx_pointer(what, "x", x, 16);
  detail::check_mx_pointer(what, "codes", codes, 16);
  detail::check_mx_pointer(what, "scales", scales, 1);
  if (nonfinite_blocks != nullptr) detail::check_mx_pointer(what, "nonfinite_blocks", nonfinite_blocks, 8);

  const int64_t num_chunks = M * K / kChunk;
  const int64_t tiles = ceil_div(num_chunks, int64_t{kTile});
  const unsigned grid = static_cast<unsigned>(tiles < INT_MAX ? tiles : INT_MAX);  // past it the blocks stride
  const QuantParams p{cfg.scale_mode,
                      cfg.seed,
                      static_cast<uint64_t>(cfg.row_offset) * static_cast<uint64_t>(K),
                      cfg.rht_seed,
                      static_cast<uint32_t>(K <= kRhtMaxK ? K : 0),  // read by rht only, which takes K <= 2^30
                      nonfinite_blocks};
  const auto* x16 = reinterpret_cast<const uint4*>(x);
  auto* codes32 = reinterpret_cast<uint32_t*>(codes);
  if (cfg.rounding == Rounding::rne)
    launch_for_transform<Rounding::rne>(cfg.transform, grid, stream, x16, num_chunks, p, codes32, scales);
  else
    launch_for_transform<Rounding::stochastic>(cfg.transform, grid, stream, x16, num_chunks, p, codes32, scales);
  CUDA_CHECK_LAUNCH();
}

}  // namespace fp4moe
