// BF16 -> MXFP4 column quantization (bf16_to_mxfp4_col.h).
// bench_quant times it against the copy ceiling (results: reports/results/h200/README.md).
//
// One thread block per tile of 128 rows (one token block of a group, or of the dense tensor) x 32 columns of X:
// grid (token-block slots, column tiles). The block loads the tile with 16-byte loads (four per row) into shared
// memory, rows padded to 34 BF16 so that the transposed reads below meet no bank conflicts; for stochastic
// rounding it also draws the tile's random bits there, one 64-bit hash per four consecutive elements of a row of
// X (mx_sr_bits16 of the element's index in X, as the row quantizer draws them). Then each thread gathers chunks of
// 8 consecutive rows of one column (a chunk of a row of X^T): lane = 4 a + q holds rows 8q .. 8q + 7 of the
// warp's 32-row MX block in column 8 (warp mod 4) + a, so four consecutive lanes hold one MX block as in the row
// quantizer, and quantize_chunk (mx_quant_device.cuh) applies the same rule with the same instructions. Each lane
// writes its 4 bytes of codes to the row of X^T and lane q = 0 the block's scale. The ragged form finds its
// group's token block from the device offsets (ragged_token_blocks.cuh, groups padded to 32 tokens); rows of the
// tile past the group's tokens are zeros, blocks past round_up(M_g, 32) are not written.
#include <cuda_bf16.h>

#include "kernels/common/offsets.h"
#include "kernels/quant/bf16_to_mxfp4_col.h"
#include "kernels/quant/layouts.h"
#include "kernels/quant/mx_quant_device.cuh"
#include "kernels/quant/mx_row_checks.h"
#include "kernels/quant/ragged_token_blocks.cuh"

namespace fp4moe {
namespace {

constexpr int kThreads = 256;
constexpr int kTileRows = 128;  // rows of X per tile: one token block (4 MX blocks along M)
constexpr int kTileCols = 32;   // columns of X per tile
constexpr int kLd = kTileCols + 2;  // shared row length in BF16: 17 words, so 8-row strides fall on distinct banks
constexpr int kLoadsPerThread = kTileRows * kTileCols / 8 / kThreads;
constexpr int kChunksPerThread = kTileRows * kTileCols / detail::kMxChunk / kThreads;
constexpr int kHashesPerThread = kTileRows * kTileCols / 4 / kThreads;
static_assert(kLoadsPerThread == 2 && kChunksPerThread == 2 && kHashesPerThread == 4, "tile shape");
static_assert(kThreads / 32 * kChunksPerThread == (kTileRows / kMxBlock) * (kTileCols / 8),
              "one warp-iteration per (MX block, 8 columns) of the tile");

struct ColParams {
  MxScaleMode mode;
  uint64_t seed;
  uint64_t row_offset;  // stochastic rounding: index of x's first row in the full tensor
  uint64_t rht_seed;
  int64_t M;
  int64_t K;
  const int32_t* offsets;  // ragged only
  int G;
  unsigned long long* nonfinite_blocks;
};

template <Rounding kRounding, HadamardTransform kTransform, bool kRagged>
__global__ void __launch_bounds__(kThreads)
bf16_to_mxfp4_col_kernel(const bf16* __restrict__ x, ColParams p, uint8_t* __restrict__ codes,
                         uint8_t* __restrict__ scales) {
  detail::TokenBlock tb;
  if constexpr (kRagged) {
    if (!detail::TokenBlockFinder<kThreads, kMxBlock>::find_by_warp(p.offsets, p.G, p.M, p.K, blockIdx.x, tb)) return;
  } else {
    tb.row0 = int64_t{blockIdx.x} * kTileRows;
    tb.rows = static_cast<int>(p.M - tb.row0 < kTileRows ? p.M - tb.row0 : kTileRows);
    tb.ld = p.M;
    tb.col0 = static_cast<int>(tb.row0);
    tb.codes_offset = 0;
  }
  const int64_t k_tile = int64_t{blockIdx.y} * kTileCols;
  const int64_t group_start = tb.codes_offset / p.K;  // P_g: the group's first padded token
  const int padded_rows = static_cast<int>(tb.ld - tb.col0 < kTileRows ? tb.ld - tb.col0 : kTileRows);  // % 32 == 0

  __shared__ __align__(4) uint16_t tile[kTileRows][kLd];
  __shared__ __align__(4) uint16_t draws[kRounding == Rounding::stochastic ? kTileRows : 1][kLd];
#pragma unroll
  for (int j = 0; j < kLoadsPerThread; ++j) {
    const int l = j * kThreads + static_cast<int>(threadIdx.x);
    const int r = l / 4, c = 8 * (l % 4);
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r < tb.rows && k_tile + c < p.K)  // K % 8 == 0: a 16-byte load is all in or all out
      v = __ldcs(reinterpret_cast<const uint4*>(x + (tb.row0 + r) * p.K + k_tile + c));
    // Rows of kLd = 34 BF16 start at multiples of 4 bytes and c is even: four 32-bit stores (element c + 2i in the
    // low half of word i, as in the input).
    auto* row_words = reinterpret_cast<uint32_t*>(&tile[r][0]) + c / 2;
    row_words[0] = v.x;
    row_words[1] = v.y;
    row_words[2] = v.z;
    row_words[3] = v.w;
  }
  if constexpr (kRounding == Rounding::stochastic) {
#pragma unroll
    for (int j = 0; j < kHashesPerThread; ++j) {
      const int h = j * kThreads + static_cast<int>(threadIdx.x);
      const int r = h / 8, c = 4 * (h % 8);
      // (row, c .. c + 3) are four consecutive flat indices starting at a multiple of 4 (K % 8 == 0): one hash.
      const uint64_t index = (p.row_offset + static_cast<uint64_t>(tb.row0 + r)) * static_cast<uint64_t>(p.K) +
                             static_cast<uint64_t>(k_tile + c);
      const uint64_t word = splitmix64_at(p.seed, index / 4);  // element c + i: bits 16 i .. 16 i + 15
      auto* row_words = reinterpret_cast<uint32_t*>(&draws[r][0]) + c / 2;
      row_words[0] = static_cast<uint32_t>(word);
      row_words[1] = static_cast<uint32_t>(word >> 32);
    }
  }
  __syncthreads();

  unsigned long long counted = 0;
  const int lane = static_cast<int>(threadIdx.x) & 31, q = lane & 3, a = lane >> 2;
#pragma unroll
  for (int j = 0; j < kChunksPerThread; ++j) {
    const int warp_item = j * (kThreads / 32) + static_cast<int>(threadIdx.x) / 32;  // 0 .. 15
    const int col = 8 * (warp_item % 4) + a;          // column within the tile
    const int r0 = kMxBlock * (warp_item / 4) + 8 * q;  // first row of the chunk within the tile
    // Whole MX blocks only: the four lanes of a block share col and warp_item, so `in` is the same for them.
    const bool in = r0 < padded_rows && k_tile + col < p.K;
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = tile[r0 + 2 * i][col] | (uint32_t{tile[r0 + 2 * i + 1][col]} << 16);
    const uint32_t t0 = static_cast<uint32_t>(tb.col0 + r0);  // position along the group's tokens (rht signs)
    const detail::ChunkCodes out = detail::quantize_chunk<kRounding, kTransform>(
        make_uint4(w[0], w[1], w[2], w[3]), t0, p.rht_seed, p.mode, [&] {
          detail::ChunkDraws d{{0, 0}};
#pragma unroll
          for (int i = 0; i < detail::kMxChunk; ++i)
            d.word[i / 4] |= static_cast<uint64_t>(draws[r0 + i][col]) << (16 * (i % 4));
          return d;
        });
    if (in) {
      // Element offset of the chunk in the layout: the group's K * P_g, its row k of X^T (length L_g), its token.
      const int64_t e = p.K * group_start + (k_tile + col) * tb.ld + tb.col0 + r0;
      reinterpret_cast<uint32_t*>(codes)[e / 8] = out.packed;
      if (q == 0) scales[e / kMxBlock] = out.scale;
    }
    if (p.nonfinite_blocks != nullptr) detail::count_nonfinite_blocks(in, out.nonfinite, counted);
  }
  if (p.nonfinite_blocks != nullptr && lane == 0 && counted != 0) atomicAdd(p.nonfinite_blocks, counted);
}

template <bool kRagged, Rounding kRounding>
void launch_for_transform(HadamardTransform t, dim3 grid, cudaStream_t stream, const bf16* x, const ColParams& p,
                          uint8_t* codes, uint8_t* scales) {
  switch (t) {
    case HadamardTransform::none:
      bf16_to_mxfp4_col_kernel<kRounding, HadamardTransform::none, kRagged><<<grid, kThreads, 0, stream>>>(
          x, p, codes, scales);
      break;
    case HadamardTransform::h16:
      bf16_to_mxfp4_col_kernel<kRounding, HadamardTransform::h16, kRagged><<<grid, kThreads, 0, stream>>>(
          x, p, codes, scales);
      break;
    case HadamardTransform::h32:
      bf16_to_mxfp4_col_kernel<kRounding, HadamardTransform::h32, kRagged><<<grid, kThreads, 0, stream>>>(
          x, p, codes, scales);
      break;
    case HadamardTransform::rht:
      bf16_to_mxfp4_col_kernel<kRounding, HadamardTransform::rht, kRagged><<<grid, kThreads, 0, stream>>>(
          x, p, codes, scales);
      break;
  }
}

// Pointer checks and the launch of both forms (arguments already checked).
template <bool kRagged>
void launch_col(const char* what, const bf16* x, int64_t M, int64_t K, const int32_t* offsets, int64_t G,
                uint8_t* codes, uint8_t* scales, const MxQuantConfig& cfg, unsigned long long* nonfinite_blocks,
                cudaStream_t stream) {
  detail::check_mx_pointer(what, "x", x, 16);
  detail::check_mx_pointer(what, "codes", codes, 16);
  detail::check_mx_pointer(what, "scales", scales, 1);
  if (nonfinite_blocks != nullptr) detail::check_mx_pointer(what, "nonfinite_blocks", nonfinite_blocks, 8);
  const ColParams p{cfg.scale_mode, cfg.seed, static_cast<uint64_t>(cfg.row_offset), cfg.rht_seed, M, K, offsets,
                    static_cast<int>(G), nonfinite_blocks};
  const dim3 grid(static_cast<unsigned>(ceil_div(M, int64_t{kTileRows}) + (kRagged ? G : 0)),
                  static_cast<unsigned>(ceil_div(K, int64_t{kTileCols})));
  if (cfg.rounding == Rounding::rne)
    launch_for_transform<kRagged, Rounding::rne>(cfg.transform, grid, stream, x, p, codes, scales);
  else
    launch_for_transform<kRagged, Rounding::stochastic>(cfg.transform, grid, stream, x, p, codes, scales);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void bf16_to_mxfp4_col(const bf16* x, int64_t M, int64_t K, uint8_t* codes, uint8_t* scales,
                       const MxQuantConfig& cfg, unsigned long long* nonfinite_blocks, cudaStream_t stream) {
  const char* what = "bf16_to_mxfp4_col";
  detail::check_mx_col_config(what, M, K, false, cfg);
  if (M == 0) return;
  launch_col<false>(what, x, M, K, nullptr, 1, codes, scales, cfg, nonfinite_blocks, stream);
}

void bf16_to_mxfp4_col_ragged(const bf16* x, int64_t M, int64_t K, const int32_t* offsets, int64_t G,
                              const int32_t* host_offsets, uint8_t* codes, uint8_t* scales,
                              const MxQuantConfig& cfg, unsigned long long* nonfinite_blocks, cudaStream_t stream) {
  const char* what = "bf16_to_mxfp4_col_ragged";
  detail::check_mx_col_config(what, M, K, true, cfg);
  FP4MOE_CHECK(G >= 1 && G <= detail::kMaxColGroups, "{}: G must be in [1, {}], got G={}", what,
               detail::kMaxColGroups, G);
  FP4MOE_CHECK(offsets != nullptr, "{}: device group offsets are null (expected int32 [G+1] = [{}])", what, G + 1);
  if (host_offsets != nullptr) validate_group_offsets(host_offsets, G, M, what);
  if (M == 0) return;  // every group is empty: the layout has no element
  launch_col<true>(what, x, M, K, offsets, G, codes, scales, cfg, nonfinite_blocks, stream);
}

}  // namespace fp4moe
