// BF16 -> MXFP4 row quantization (bf16_to_mxfp4_row.h).
// bench_quant times it against the copy ceiling (results: reports/results/h200/README.md).
//
// Two kernels with the same bits (bf16_to_mxfp4_row.h detail::MxRowKernel): the chunk-per-lane kernel described
// here, and the block-per-thread kernel described above its definition below, which bf16_to_mxfp4_row runs for
// every option (no warp shuffles; one hash for rht's 32 signs of a block; detail::mx_row_default_kernel). The
// block-per-thread kernel also takes two shortcuts with the same bits, each with a fallback to the rule as
// written for the blocks where it would not hold: RNE with h16 or rht leaves the transform's 1/4 out of the values
// and takes it from the block exponent (mx_h16_fold_exact below: one FP32 product fewer per element), and
// stochastic rounding scales two elements per BF16x2 product and minimum (encode_chunk_stochastic_bf16x2 in
// mx_quant_device.cuh: fewer instructions per element).
// The [M, K] tensor is walked as one flat sequence of 8-element chunks (16 bytes of BF16): K % 32 == 0, so every
// MX block is four consecutive chunks of one row, and its codes (16 bytes) and scale (1 byte) sit at the flat
// block index in [M, K/2] and [M, K/32]. One thread block per tile of kThreads x kChunksPerThread chunks (the
// blocks stride only past 2^31 - 1 tiles): each thread issues its four 16-byte loads first; then, per chunk, four
// consecutive lanes hold one MX block, the block amax is an integer maximum of BF16 magnitude bits over two warp
// shuffles, and each lane writes its 4 bytes of codes (a warp writes 128 contiguous bytes). A full tile takes no
// bounds checks and indexes with 32-bit offsets from the tile's base pointers; only the last tile checks.
// A transform runs on the chunk in registers before the block rule: the lane's 8 elements in FP32, the butterfly
// stages within the chunk, then those across chunks with one shuffle and one fused multiply-add by +-1 per element
// (h = 8: lanes 1 apart; h = 16: lanes 2 apart), the scale, and the rounding back to BF16 (one BF16x2 conversion
// per pair); rht draws one 64-bit hash per chunk for its 8 signs. RNE scales and rounds two elements per BF16x2
// instruction (encode_chunk_rne in mx_quant_device.cuh, which holds the per-chunk steps shared with the column
// quantizer); stochastic rounding
// scales each element by one exact FP32 product and rounds it with the integer formulation of mx_fast_codecs.h
// (encode_chunk_stochastic), drawing one 64-bit hash per chunk of eight elements (mx_sr_bits8). The NaN/Inf blocks are
// counted per warp and added with one atomic per warp at the end.
#include <cuda_bf16.h>

#include <climits>

#include "kernels/formats/formats.h"
#include "kernels/quant/bf16_to_mxfp4_row.h"
#include "kernels/quant/layouts.h"
#include "kernels/quant/mx_quant_device.cuh"
#include "kernels/quant/mx_row_checks.h"

namespace fp4moe {
namespace {

constexpr int kThreads = 256;
constexpr int kChunksPerThread = 4;                 // independent 16-byte loads in flight per thread
constexpr int kTile = kThreads * kChunksPerThread;  // chunks per thread block
constexpr int kChunk = detail::kMxChunk;            // BF16 elements per chunk (16 bytes); 4 chunks per MX block
static_assert(kThreads % 32 == 0 && kTile % 4 == 0, "whole warps (the amax shuffles need every lane), whole blocks");

struct QuantParams {
  MxScaleMode mode;
  uint64_t seed;
  uint64_t index_base;  // counter of the tensor's first element (stochastic rounding)
  uint64_t rht_seed;
  uint32_t K;  // columns (rht only: K <= 2^30)
  // rht, block-per-thread kernel: MX blocks per row K / 32 and its mod_by_inverse inverse (a block's column).
  uint32_t k_blocks;
  uint32_t k_blocks_inverse;
  unsigned long long* nonfinite_blocks;
};

// Writes a chunk's codes and (one lane in four) its block's scale, and counts its NaN/Inf block on the warp.
__device__ __forceinline__ void store_chunk(bool in, bool nonfinite, uint32_t packed, uint8_t scale, int c,
                                           const QuantParams& p, uint32_t* __restrict__ ct, uint8_t* __restrict__ st,
                                           unsigned long long& counted) {
  const int lane = threadIdx.x & 31;
  if (in) {
    ct[c] = packed;
    if ((lane & 3) == 0) st[c / 4] = scale;
  }
  if (p.nonfinite_blocks != nullptr) detail::count_nonfinite_blocks(in, nonfinite, counted);
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
    const uint32_t k0 = k_chunk;
    if constexpr (kTransform == HadamardTransform::rht) {
      k_chunk += kThreads * kChunk;
      if (k_chunk >= p.K) k_chunk = k_chunk - p.K < p.K ? k_chunk - p.K : k_chunk % p.K;
    }
    // Stochastic rounding: the chunk's 8 consecutive flat indices start at a multiple of 8 (one hash).
    const uint64_t first_index = p.index_base + (first_chunk + static_cast<uint64_t>(c)) * kChunk;
    const detail::ChunkCodes q =
        detail::quantize_chunk<kRounding, kTransform>(v[j], k0, p.rht_seed, p.mode,
                                                      [&] { return detail::chunk_draws(p.seed, first_index / 8); });
    store_chunk(in, q.nonfinite, q.packed, q.scale, c, p, ct, st, counted);
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

// The block-per-thread kernel (detail::MxRowKernel::block_per_thread): thread t of a tile owns MX block t, its
// four chunks (64 bytes: four L1-cached 16-byte loads, which together read the warp's 2 KB once). The transform
// runs in the thread's registers (every butterfly stage, h = 16 included, without a shuffle; rht: one hash for the
// 32 signs, flipped on the BF16 words two at a time), the block amax needs no shuffle, and the thread writes its
// 16 bytes of codes with one store and its scale byte. Same bits as the chunk-per-lane kernel above: the same
// operations in the same order per element, but for the two shortcuts that give the same bits (the file's head).
// kScaled = false leaves out the final product by hadamard_scale (the folded path below): the values are then
// bf16(y) instead of bf16(y * c).
template <HadamardTransform kTransform, bool kScaled = true>
__device__ __forceinline__ void transform_block(uint4 (&v)[4], uint32_t k0, uint64_t rht_seed) {
  // A sign flip is exact, so flipping the BF16 inputs gives the FP32 values of the rule.
  if constexpr (kTransform == HadamardTransform::rht) detail::flip_block_signs(v, rht_sign_bits32(rht_seed, k0));
  float y[kMxBlock];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    float c[kChunk];
    detail::unpack_chunk(v[j], c);
#pragma unroll
    for (int i = 0; i < kChunk; ++i) y[kChunk * j + i] = c[i];
  }
  detail::block_butterflies<kTransform>(y);
  const float c = hadamard_scale(hadamard_block_size(kTransform));
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int e = kChunk * j + 2 * i;
      w[i] = kScaled ? detail::bits_of_bf162(__floats2bfloat162_rn(__fmul_rn(y[e], c), __fmul_rn(y[e + 1], c)))
                     : detail::bits_of_bf162(__floats2bfloat162_rn(y[e], y[e + 1]));
    }
    v[j] = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// Largest BF16 magnitude bits of one MX block held by one thread (>= kBf16AbsNonFinite: NaN or Inf): the per-half
// maxima of its magnitudes over all 16 words, then the larger half. The magnitudes: for RNE those of
// detail::chunk_magnitudes (the FMA pipe, as the RNE encoder takes them); for stochastic rounding, whose encoder
// keeps the FMA pipe busier, masks on the integer/logic pipe (the faster choice for each when timed, bench_quant).
template <Rounding kRounding>
__device__ __forceinline__ uint32_t block_amax_bits(const uint4 (&v)[4]) {
  uint32_t m2 = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint4 m = kRounding == Rounding::rne
                        ? detail::chunk_magnitudes(v[j])
                        : make_uint4(v[j].x & 0x7FFF7FFFu, v[j].y & 0x7FFF7FFFu, v[j].z & 0x7FFF7FFFu,
                                     v[j].w & 0x7FFF7FFFu);
    m2 = __vmaxu2(m2, __vmaxu2(__vmaxu2(m.x, m.y), __vmaxu2(m.z, m.w)));
  }
  return max(m2 & 0xFFFFu, m2 >> 16);
}

// RNE with a 16-point transform (h16, rht): the scale 1/4 folded into the block exponent. The rule's values are
// v_i = bf16(y_i / 4) (the FP32 product by 1/4 is exact, see below); the folded path rounds u_i = bf16(y_i)
// instead (no product), takes the block exponent of amax(u) and encodes u with it, and writes that exponent less
// 2 as the scale. It is used where this gives the rule's bits, i.e. where amax(u) is 0 or in [2^-100, 2^126)
// (mx_h16_fold_exact); any other block (NaN/Inf, an FP32 value past BF16's range, tiny blocks) reloads its
// inputs and runs the rule as written. Why the bits agree there:
//  - every y_i is a multiple of 2^-133 (BF16's smallest subnormal): the inputs are, sign flips keep it, and an
//    FP32 sum of two multiples is exact below 2^-109 and otherwise rounded to a multiple of its ulp >= 2^-132.
//    So y_i / 4 is a multiple of 2^-135, exact in FP32 (grid 2^-149), and u_i = 0 iff y_i = 0.
//  - amax(u) = 0: every y_i = +-0, so every v_i = +-0: an all-zero block (scale 0, codes 0) either way.
//  - amax(u) in [2^-100, 2^126): every |y_i| < 2^126 (RNE is monotone and 2^126 a BF16), so no u_i overflows.
//    Where |y_i| >= 2^-124, y_i / 4 and u_i / 4 are normal and rounding commutes with the power of two:
//    v_i = u_i / 4, sign included. Where |y_i| < 2^-124: |u_i| <= 2^-124 and |v_i| <= 2^-126. The largest |u_i|
//    (>= 2^-100) has |y_i| >= 2^-124, so amax(v) = amax(u) / 4: the same fraction, the exponent field 2 less
//    (>= 25, a normal), hence block_exponent(amax(v)) = block_exponent(amax(u)) - 2 =: e (no clamp at -127:
//    e >= -104), and e + 2 <= 124 is in encode_chunk_rne's range. Codes: |u_i| 2^-(e+2) = |v_i| 2^-e exactly
//    for |y_i| >= 2^-124 (the same BF16 product); for smaller |y_i| both products are <= 2^-22 < 0.25, magnitude
//    code 0, and the sign bits of u_i and v_i are both y_i's.
constexpr uint32_t kFoldAmaxLo = 27u << 7;   // 2^-100 (biased exponent 27)
constexpr uint32_t kFoldAmaxHi = 253u << 7;  // 2^126 (biased exponent 253)
__device__ __forceinline__ bool mx_h16_fold_exact(uint32_t amax_bits) {
  return amax_bits == 0 || amax_bits - kFoldAmaxLo < kFoldAmaxHi - kFoldAmaxLo;
}
template <Rounding kRounding, HadamardTransform kTransform>
constexpr bool kFoldH16Scale = kRounding == Rounding::rne && hadamard_block_size(kTransform) == 16;

template <Rounding kRounding, HadamardTransform kTransform>
__global__ void __launch_bounds__(kThreads)
bf16_to_mxfp4_row_block_kernel(const uint4* __restrict__ x, int64_t num_blocks, QuantParams p,
                               uint4* __restrict__ codes, uint8_t* __restrict__ scales) {
  unsigned long long counted = 0;
  // `base` is the same for the whole thread block: every lane runs every iteration (the ballot needs whole warps).
  for (int64_t base = int64_t{blockIdx.x} * kThreads; base < num_blocks; base += int64_t{gridDim.x} * kThreads) {
    const int64_t b = base + threadIdx.x;  // this thread's MX block (flat)
    const bool in = b < num_blocks;
    uint4 v[4] = {};
    if (in) {
      const uint4* xb = x + 4 * b;  // one address, the four loads at constant offsets from it
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j] = __ldg(xb + j);
    }
    uint32_t amax_bits;
    int folded = 0;  // log2 of the factor left out of the values (kFoldH16Scale): the scale is 2^(e - folded)
    if constexpr (kTransform == HadamardTransform::none) {
      amax_bits = block_amax_bits<kRounding>(v);
    } else {
      uint32_t k0 = 0;  // rht: the block's first column (K <= 2^30)
      if constexpr (kTransform == HadamardTransform::rht)
        k0 = mod_by_inverse(static_cast<uint64_t>(b), p.k_blocks, p.k_blocks_inverse) * kMxBlock;
      if constexpr (kFoldH16Scale<kRounding, kTransform>) {
        transform_block<kTransform, false>(v, k0, p.rht_seed);
        amax_bits = block_amax_bits<kRounding>(v);
        folded = 2;
        if (in && !mx_h16_fold_exact(amax_bits)) {  // rare: the rule as written on the reloaded inputs
          folded = 0;  // (an out-of-range thread's zeros are an all-zero block, exact: it never reloads)
          const uint4* xb = x + 4 * b;
#pragma unroll
          for (int j = 0; j < 4; ++j) v[j] = __ldg(xb + j);
          transform_block<kTransform>(v, k0, p.rht_seed);
          amax_bits = block_amax_bits<kRounding>(v);
        }
      } else {
        transform_block<kTransform>(v, k0, p.rht_seed);
        amax_bits = block_amax_bits<kRounding>(v);
      }
    }
    const bool nonfinite = amax_bits >= detail::kBf16AbsNonFinite;
    uint32_t packed[4] = {0, 0, 0, 0};  // NaN/Inf block and all-zero block: codes 0
    uint8_t scale = nonfinite ? kUE8M0NaN : 0;
    if (!nonfinite && amax_bits != 0) {
      const int e = detail::block_exponent(amax_bits, p.mode);
      scale = static_cast<uint8_t>(e - folded + kUE8M0Bias);
      if constexpr (kRounding == Rounding::rne) {
#pragma unroll
        for (int j = 0; j < 4; ++j) packed[j] = detail::encode_chunk_rne(v[j], e);
      } else {
        // Chunk j's 8 consecutive flat indices start at a multiple of 8 (one hash, as mx_sr_bits8 packs them):
        // hash n0 + j.
        const uint64_t n0 = (p.index_base + static_cast<uint64_t>(b) * kMxBlock) / 8;
        if (e >= detail::kSrBf16x2MinExponent) {  // all but tiny blocks (amax below about 2^-108)
          const __nv_bfloat162 inv2 = detail::sr_bf16x2_scale(e);
#pragma unroll
          for (int j = 0; j < 4; ++j)
            packed[j] = detail::encode_chunk_stochastic_bf16x2(v[j], inv2, detail::chunk_draws(p.seed, n0 + j));
        } else {
          const float inv_scale = detail::inv_block_scale(e);
#pragma unroll
          for (int j = 0; j < 4; ++j)
            packed[j] = detail::encode_chunk_stochastic(v[j], inv_scale, detail::chunk_draws(p.seed, n0 + j));
        }
      }
    }
    if (in) {
      codes[b] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
      scales[b] = scale;
    }
    if (p.nonfinite_blocks != nullptr)
      counted += static_cast<unsigned long long>(__popc(__ballot_sync(0xFFFFFFFFu, in && nonfinite)));
  }
  if (p.nonfinite_blocks != nullptr && (threadIdx.x & 31) == 0 && counted != 0) atomicAdd(p.nonfinite_blocks, counted);
}

using RowLaunch = void (*)(unsigned grid, cudaStream_t stream, const uint4* x, int64_t num_chunks,
                           const QuantParams& p, uint8_t* codes, uint8_t* scales);

template <detail::MxRowKernel kKernel, Rounding kRounding, HadamardTransform kTransform>
void launch_row(unsigned grid, cudaStream_t stream, const uint4* x, int64_t num_chunks, const QuantParams& p,
                uint8_t* codes, uint8_t* scales) {
  if constexpr (kKernel == detail::MxRowKernel::chunk_per_lane)
    bf16_to_mxfp4_row_kernel<kRounding, kTransform><<<grid, kThreads, 0, stream>>>(
        x, num_chunks, p, reinterpret_cast<uint32_t*>(codes), scales);
  else
    bf16_to_mxfp4_row_block_kernel<kRounding, kTransform><<<grid, kThreads, 0, stream>>>(
        x, num_chunks / 4, p, reinterpret_cast<uint4*>(codes), scales);
}

template <detail::MxRowKernel kKernel, Rounding kRounding>
RowLaunch row_launch(HadamardTransform t) {
  switch (t) {
    case HadamardTransform::h16:
      return launch_row<kKernel, kRounding, HadamardTransform::h16>;
    case HadamardTransform::h32:
      return launch_row<kKernel, kRounding, HadamardTransform::h32>;
    case HadamardTransform::rht:
      return launch_row<kKernel, kRounding, HadamardTransform::rht>;
    default:
      return launch_row<kKernel, kRounding, HadamardTransform::none>;
  }
}

template <detail::MxRowKernel kKernel>
RowLaunch row_launch(const MxQuantConfig& cfg) {
  return cfg.rounding == Rounding::rne ? row_launch<kKernel, Rounding::rne>(cfg.transform)
                                       : row_launch<kKernel, Rounding::stochastic>(cfg.transform);
}

}  // namespace

namespace detail {

MxRowKernel mx_row_default_kernel(HadamardTransform) {
  // Chosen by measurement (reports/results/h200/quant-speed-ranks-20261202/README.md; bench_quant's
  // bf16_to_mxfp4_row/ cases run this choice, bf16_to_mxfp4_row_lanes/ the other kernel): block_per_thread is the
  // faster for every option, since its transforms keep the block in registers (butterfly_stage) and it needs fewer
  // instructions per element (reports/results/h200/quant-speed-ranks-20261202/NOTES-speed.md).
  return MxRowKernel::block_per_thread;
}

void bf16_to_mxfp4_row_using(MxRowKernel kernel, const bf16* x, int64_t M, int64_t K, uint8_t* codes,
                             uint8_t* scales, const MxQuantConfig& cfg, unsigned long long* nonfinite_blocks,
                             cudaStream_t stream) {
  const char* what = "bf16_to_mxfp4_row";
  check_mx_quant_config(what, M, K, cfg);
  if (M == 0) return;
  check_mx_pointer(what, "x", x, 16);
  check_mx_pointer(what, "codes", codes, 16);
  check_mx_pointer(what, "scales", scales, 1);
  if (nonfinite_blocks != nullptr) check_mx_pointer(what, "nonfinite_blocks", nonfinite_blocks, 8);

  const int64_t num_chunks = M * K / kChunk;
  // Both kernels: kThreads x 4 chunks per tile (chunk_per_lane: a tile of chunks; block_per_thread: of MX blocks).
  const int64_t tiles = ceil_div(num_chunks, int64_t{kTile});
  const unsigned grid = static_cast<unsigned>(tiles < INT_MAX ? tiles : INT_MAX);  // past it the blocks stride
  const uint32_t k_blocks = static_cast<uint32_t>(K <= kRhtMaxK ? K / kMxBlock : 1);  // read by rht only
  const QuantParams p{cfg.scale_mode,
                      cfg.seed,
                      static_cast<uint64_t>(cfg.row_offset) * static_cast<uint64_t>(K),
                      cfg.rht_seed,
                      static_cast<uint32_t>(K <= kRhtMaxK ? K : 0),  // read by rht only, which takes K <= 2^30
                      k_blocks,
                      0xFFFFFFFFu / k_blocks,  // mod_by_inverse's inverse of k_blocks
                      nonfinite_blocks};
  const RowLaunch launch = kernel == MxRowKernel::chunk_per_lane ? row_launch<MxRowKernel::chunk_per_lane>(cfg)
                                                                 : row_launch<MxRowKernel::block_per_thread>(cfg);
  launch(grid, stream, reinterpret_cast<const uint4*>(x), num_chunks, p, codes, scales);
  CUDA_CHECK_LAUNCH();
}

}  // namespace detail

void bf16_to_mxfp4_row(const bf16* x, int64_t M, int64_t K, uint8_t* codes, uint8_t* scales,
                       const MxQuantConfig& cfg, unsigned long long* nonfinite_blocks, cudaStream_t stream) {
  detail::bf16_to_mxfp4_row_using(detail::mx_row_default_kernel(cfg.transform), x, M, K, codes, scales, cfg,
                                  nonfinite_blocks, stream);
}

}  // namespace fp4moe
