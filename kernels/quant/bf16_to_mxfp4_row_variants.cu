// Variants 1..4 of BF16 -> MXFP4 row quantization (bf16_to_mxfp4_row.h, detail::bf16_to_mxfp4_row_variant) and
// the variant dispatch. The layout of the work is variant 0's (bf16_to_mxfp4_row.cu): the tensor as a flat
// sequence of 16-byte chunks, four consecutive lanes per MX block, amax over two shuffles, 4 bytes of codes per
// lane. What changes, the integer-pipe work per chunk, which bounds variant 0 (its RNE and stochastic paths
// both run near the same integer instruction rate on the H200):
//   - a tile of kThreads x kChunks chunks; a full tile takes no bounds checks and indexes with 32-bit offsets
//     from the tile's base pointers; only the last tile checks;
//   - either one wave of thread blocks striding over the tiles (8 chunks, 128 bytes in flight per thread) or one
//     thread block per tile (4 chunks), which has no loop and frees each multiprocessor slot as it ends;
//   - RNE through the packed BF16 compares of variant 0 (with its element-by-element path at extreme exponents)
//     or through the fp32-addition encoder (FMA-pipe work, any exponent, no second path);
//   - stochastic rounding through uniform_from_counter_fast; the NaN/Inf count is one atomic per warp at the end.
#include <climits>

#include "kernels/quant/bf16_to_mxfp4_device.cuh"
#include "kernels/quant/bf16_to_mxfp4_row.h"
#include "kernels/quant/mx_row_launch.cuh"

namespace fp4moe {
namespace {

using namespace detail;

enum class RneEncoder { packed_compares, fp32_add };

struct Variant {
  const char* name;
  int threads;
  int chunks;        // chunks (16 bytes of BF16) per thread and tile
  bool one_wave;     // grid of one wave striding over the tiles; else one thread block per tile
  RneEncoder rne;
};

constexpr Variant kVariants[] = {
    {"grid-stride 256x4, packed compares", 256, 4, true, RneEncoder::packed_compares},
    {"grid-stride 256x8, unchecked full tiles, packed compares", 256, 8, true, RneEncoder::packed_compares},
    {"grid-stride 256x8, unchecked full tiles, fp32-add encoder", 256, 8, true, RneEncoder::fp32_add},
    {"one block per 256x4 tile, packed compares", 256, 4, false, RneEncoder::packed_compares},
    {"one block per 256x4 tile, fp32-add encoder", 256, 4, false, RneEncoder::fp32_add},
};
constexpr int kNumVariants = static_cast<int>(sizeof(kVariants) / sizeof(kVariants[0]));

struct TileArgs {
  MxScaleMode mode;
  uint64_t seed;
  uint64_t index_base;  // counter of the tensor's first element (stochastic rounding)
  unsigned long long* nonfinite_blocks;
};

// One tile: `valid` chunks from xt (all kThreads * kChunks when kFull). first_chunk: the tile's flat chunk index.
// Every lane of the block runs it (the shuffles need whole warps); `counted` collects, on lane 0 of each warp,
// the NaN/Inf blocks met.
template <int kThreads, int kChunks, RneEncoder kRne, Rounding kRounding, bool kFull>
__device__ __forceinline__ void quantize_tile(const uint4* __restrict__ xt, int valid, uint64_t first_chunk,
                                             const TileArgs& a, uint32_t* __restrict__ ct, uint8_t* __restrict__ st,
                                             unsigned long long& counted) {
  const int lane = threadIdx.x & 31;
  uint4 v[kChunks];
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int c = j * kThreads + static_cast<int>(threadIdx.x);
    v[j] = (kFull || c < valid) ? __ldcs(xt + c) : make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int c = j * kThreads + static_cast<int>(threadIdx.x);  // valid % 4 == 0: a block is all in or all out
    uint32_t amax_bits = chunk_amax_bits(v[j]);
    amax_bits = max(amax_bits, __shfl_xor_sync(0xFFFFFFFFu, amax_bits, 1));
    amax_bits = max(amax_bits, __shfl_xor_sync(0xFFFFFFFFu, amax_bits, 2));
    const bool nonfinite = amax_bits >= kBf16AbsNonFinite;

    uint32_t packed = 0;  // NaN/Inf block and all-zero block: codes 0
    uint8_t scale = nonfinite ? kUE8M0NaN : 0;
    if (!nonfinite && amax_bits != 0) {
      const int e = block_exponent(amax_bits, a.mode);
      scale = static_cast<uint8_t>(e + kUE8M0Bias);
      if constexpr (kRounding == Rounding::stochastic) {
        packed = encode_chunk_stochastic_fast(v[j], exp2_exact(-e), a.seed,
                                              a.index_base + (first_chunk + static_cast<uint64_t>(c)) * kChunk);
      } else if constexpr (kRne == RneEncoder::fp32_add) {
        packed = encode_chunk_rne_by_add(v[j], exp2_exact(-e));
      } else if (e >= kPackedMinExponent && e <= kPackedMaxExponent) {
        packed = encode_chunk_rne_packed(v[j], e);
      } else {
        packed = encode_chunk_scalar<Rounding::rne>(v[j], exp2_exact(-e), 0, 0);
      }
    }
    const bool in = kFull || c < valid;
    if (in) {
      ct[c] = packed;
      if ((lane & 3) == 0) st[c / 4] = scale;
    }
    if (a.nonfinite_blocks != nullptr) {
      const unsigned ballot = __ballot_sync(0xFFFFFFFFu, in && nonfinite && (lane & 3) == 0);
      counted += static_cast<unsigned long long>(__popc(ballot));
    }
  }
}

template <int kThreads, int kChunks, RneEncoder kRne, Rounding kRounding>
__global__ void __launch_bounds__(kThreads)
bf16_to_mxfp4_row_tiled_kernel(const uint4* __restrict__ x, int64_t num_chunks, TileArgs a,
                               uint32_t* __restrict__ codes, uint8_t* __restrict__ scales) {
  constexpr int kTile = kThreads * kChunks;
  static_assert(kTile % 4 == 0 && kThreads % 32 == 0, "whole MX blocks per tile, whole warps");
  unsigned long long counted = 0;
  // `base` is the same for the whole thread block: every lane runs every tile (shuffles stay legal).
  for (int64_t base = int64_t{blockIdx.x} * kTile; base < num_chunks; base += int64_t{gridDim.x} * kTile) {
    const uint4* xt = x + base;
    uint32_t* ct = codes + base;
    uint8_t* st = scales + base / 4;
    if (num_chunks - base >= kTile)
      quantize_tile<kThreads, kChunks, kRne, kRounding, true>(xt, kTile, base, a, ct, st, counted);
    else
      quantize_tile<kThreads, kChunks, kRne, kRounding, false>(xt, static_cast<int>(num_chunks - base), base, a, ct,
                                                               st, counted);
  }
  if (a.nonfinite_blocks != nullptr && (threadIdx.x & 31) == 0 && counted != 0)
    atomicAdd(a.nonfinite_blocks, counted);
}

template <int kThreads, int kChunks, RneEncoder kRne, Rounding kRounding>
void launch_tiled(bool one_wave, const bf16* x, int64_t M, int64_t K, uint8_t* codes, uint8_t* scales,
                  const TileArgs& a, cudaStream_t stream) {
  constexpr auto kernel = bf16_to_mxfp4_row_tiled_kernel<kThreads, kChunks, kRne, kRounding>;
  const int64_t num_chunks = M * K / kChunk;
  const int64_t tiles = ceil_div(num_chunks, int64_t{kThreads} * kChunks);
  // One block per tile up to the grid limit; beyond it the blocks stride (the kernel loops either way).
  const unsigned grid = one_wave ? mx_grid_blocks<kernel, kThreads>(tiles)
                                 : static_cast<unsigned>(tiles < INT_MAX ? tiles : INT_MAX);
  kernel<<<grid, kThreads, 0, stream>>>(reinterpret_cast<const uint4*>(x), num_chunks, a,
                                        reinterpret_cast<uint32_t*>(codes), scales);
}

template <int kThreads, int kChunks, RneEncoder kRne>
void launch_variant(const Variant& v, const bf16* x, int64_t M, int64_t K, uint8_t* codes, uint8_t* scales,
                    const MxQuantConfig& cfg, unsigned long long* nonfinite_blocks, cudaStream_t stream) {
  const TileArgs a{cfg.scale_mode, cfg.seed, static_cast<uint64_t>(cfg.row_offset) * static_cast<uint64_t>(K),
                   nonfinite_blocks};
  if (cfg.rounding == Rounding::rne)
    launch_tiled<kThreads, kChunks, kRne, Rounding::rne>(v.one_wave, x, M, K, codes, scales, a, stream);
  else
    launch_tiled<kThreads, kChunks, kRne, Rounding::stochastic>(v.one_wave, x, M, K, codes, scales, a, stream);
}

}  // namespace

namespace detail {

int bf16_to_mxfp4_row_variants() { return kNumVariants; }

const char* bf16_to_mxfp4_row_variant_name(int variant) {
  return variant >= 0 && variant < kNumVariants ? kVariants[variant].name : "";
}

void bf16_to_mxfp4_row_variant(int variant, const bf16* x, int64_t M, int64_t K, uint8_t* codes, uint8_t* scales,
                               const MxQuantConfig& cfg, unsigned long long* nonfinite_blocks, cudaStream_t stream) {
  const char* what = "bf16_to_mxfp4_row";
  FP4MOE_CHECK(variant >= 0 && variant < kNumVariants, "{}: variant must be in [0, {}), got {}", what, kNumVariants,
               variant);
  check_bf16_to_mxfp4_row_args(what, x, M, K, codes, scales, cfg, nonfinite_blocks);
  if (M == 0) return;
  const Variant& v = kVariants[variant];
  switch (variant) {
    case 0:
      launch_bf16_to_mxfp4_row_v0(x, M, K, codes, scales, cfg, nonfinite_blocks, stream);
      return;
    case 1:
      launch_variant<256, 8, RneEncoder::packed_compares>(v, x, M, K, codes, scales, cfg, nonfinite_blocks, stream);
      break;
    case 2:
      launch_variant<256, 8, RneEncoder::fp32_add>(v, x, M, K, codes, scales, cfg, nonfinite_blocks, stream);
      break;
    case 3:
      launch_variant<256, 4, RneEncoder::packed_compares>(v, x, M, K, codes, scales, cfg, nonfinite_blocks, stream);
      break;
    default:
      launch_variant<256, 4, RneEncoder::fp32_add>(v, x, M, K, codes, scales, cfg, nonfinite_blocks, stream);
      break;
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace detail
}  // namespace fp4moe
