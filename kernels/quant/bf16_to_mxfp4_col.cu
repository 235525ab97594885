// BF16 -> MXFP4 column quantization (bf16_to_mxfp4_col.h).
// bench_quant times it against the copy ceiling (results: reports/results/h200/README.md).
//
// Four kernels with the same bits (detail::MxColKernel): the block-per-thread kernel with its outputs stored by
// each thread or staged in shared memory (mx_col_block.cuh; the quantizers run one or the other per option,
// mx_col_default_kernel), and two earlier ones kept to be timed beside it: the register-tile kernel, described
// above its definition below, and the shared-tile kernel, which works as follows.
// One thread block per tile of 128 rows (one token block of a group, or of the dense tensor) x 32 columns of X:
// grid (token-block slots, column tiles). The block loads the tile with 16-byte loads (four per row) into shared
// memory, rows padded to 34 BF16 so that the transposed reads below meet no bank conflicts; for stochastic
// rounding it also draws the tile's random bits there, one 64-bit hash per eight consecutive elements of a row of
// X (mx_sr_bits8 of the element's index in X, as the row quantizer draws them). Then each thread gathers chunks of
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
#include "kernels/quant/mx_col_block.cuh"
#include "kernels/quant/mx_col_device.cuh"
#include "kernels/quant/mx_quant_device.cuh"
#include "kernels/quant/mx_row_checks.h"

namespace fp4moe {
namespace {

using detail::MxColParams;
using detail::TokenBlock;

constexpr int kThreads = detail::kMxColThreads;
constexpr int kTileRows = detail::kMxColTileRows;  // rows of X per tile: one token block (4 MX blocks along M)
constexpr int kTileCols = 32;   // columns of X per tile
constexpr int kLd = kTileCols + 2;  // shared row length in BF16: 17 words, so 8-row strides fall on distinct banks
constexpr int kLoadsPerThread = kTileRows * kTileCols / 8 / kThreads;
constexpr int kChunksPerThread = kTileRows * kTileCols / detail::kMxChunk / kThreads;
constexpr int kHashesPerThread = kTileRows * kTileCols / 8 / kThreads;
constexpr int kDrawLd = kTileCols + 4;  // shared row length of the draws in bytes (a multiple of 4)
static_assert(kLoadsPerThread == 2 && kChunksPerThread == 2 && kHashesPerThread == 2, "tile shape");
static_assert(kThreads / 32 * kChunksPerThread == (kTileRows / kMxBlock) * (kTileCols / 8),
              "one warp-iteration per (MX block, 8 columns) of the tile");

// Writes a chunk's codes to `code` and, on lane q = 0 of its MX block, the block's scale to `scale`, when `in`;
// counts its NaN/Inf block on the warp. Every lane calls it (ballot).
__device__ __forceinline__ void store_chunk_at(bool in, const detail::ChunkCodes& out, const MxColParams& p,
                                               uint32_t* __restrict__ code, uint8_t* __restrict__ scale,
                                               unsigned long long& counted) {
  if (in) {
    *code = out.packed;
    if ((threadIdx.x & 3) == 0) *scale = out.scale;
  }
  if (p.nonfinite_blocks != nullptr) detail::count_nonfinite_blocks(in, out.nonfinite, counted);
}

// store_chunk_at for the chunk at column k, rows r0 .. r0 + 7 of the token block.
__device__ __forceinline__ void store_col_chunk(bool in, const detail::ChunkCodes& out, const MxColParams& p,
                                                const TokenBlock& tb, int64_t k, int r0,
                                                uint8_t* __restrict__ codes, uint8_t* __restrict__ scales,
                                                unsigned long long& counted) {
  const int64_t e = detail::col_layout_offset(tb, k, r0);
  store_chunk_at(in, out, p, reinterpret_cast<uint32_t*>(codes) + e / 8, scales + e / kMxBlock, counted);
}

template <Rounding kRounding, HadamardTransform kTransform, bool kRagged>
__global__ void __launch_bounds__(kThreads)
bf16_to_mxfp4_col_kernel(const bf16* __restrict__ x, MxColParams p, uint8_t* __restrict__ codes,
                         uint8_t* __restrict__ scales) {
  TokenBlock tb;
  if (!detail::find_col_token_block<kRagged>(p, blockIdx.x, tb)) return;
  const int64_t k_tile = int64_t{blockIdx.y} * kTileCols;
  const int padded_rows = detail::padded_tile_rows(tb);

  __shared__ __align__(4) uint16_t tile[kTileRows][kLd];
  __shared__ __align__(4) uint8_t draws[kRounding == Rounding::stochastic ? kTileRows : 1][kDrawLd];
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
      const int r = h / 4, c = 8 * (h % 4);
      // (row, c .. c + 7) are eight consecutive flat indices starting at a multiple of 8 (K % 8 == 0): one hash.
      const uint64_t index = (p.row_offset + static_cast<uint64_t>(tb.row0 + r)) * static_cast<uint64_t>(p.K) +
                             static_cast<uint64_t>(k_tile + c);
      const uint64_t word = mx_sr_hash64(p.seed, index / 8);  // element c + i: byte i
      auto* row_words = reinterpret_cast<uint32_t*>(&draws[r][0]) + c / 4;
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
          for (int i = 0; i < detail::kMxChunk; ++i) d.word[i / 4] |= uint32_t{draws[r0 + i][col]} << (8 * (i % 4));
          return d;
        });
    store_col_chunk(in, out, p, tb, k_tile + col, r0, codes, scales, counted);
  }
  if (p.nonfinite_blocks != nullptr && lane == 0 && counted != 0) atomicAdd(p.nonfinite_blocks, counted);
}

// The register-tile kernel: 8 warps, each 64 rows x 32 columns of the token block (the tile: 128 rows x 128
// columns). Lane = 8 a + 4 b + q loads rows r0 .. r0 + 7 (r0 = 64 (warp % 2) + 32 b + 8 q) of columns
// k0 .. k0 + 7 (k0 = 32 (warp / 2) + 8 a): eight 16-byte loads in flight, each load instruction of a warp reading
// 8 rows x 64 contiguous bytes. The 8 x 8 BF16 tile is transposed in registers (one byte permutation per pair of
// elements): chunk c = column k0 + c, rows r0 .. r0 + 7, the four lanes q = 0..3 holding one MX block as
// quantize_chunk needs. A store instruction writes 4 rows of X^T x 32 contiguous bytes. Stochastic rounding draws
// the same hashes as the shared-tile kernel: row r0 + i's flat index over 8 for columns k0 .. k0 + 7 (eight per
// thread: one per eight elements), byte c of each handed to the chunk of column k0 + c.
// Grid: (column tiles, token-block slots over y and z): consecutive thread blocks take adjacent column tiles of the
// same 128 rows, so that the blocks resident at once read whole rows of X (long DRAM bursts) rather than one
// narrow column strip of many rows, as the shared-tile kernel's grid (slots, column tiles) does.
constexpr int kRegTileCols = 128;  // columns of X per tile (register-tile kernel)
static_assert(kThreads == 256 && kTileRows == 2 * 64 && kRegTileCols == 4 * 32, "8 warps of 64 rows x 32 columns");

template <Rounding kRounding, HadamardTransform kTransform, bool kRagged>
__global__ void __launch_bounds__(kThreads)
bf16_to_mxfp4_col_regs_kernel(const bf16* __restrict__ x, MxColParams p, uint8_t* __restrict__ codes,
                              uint8_t* __restrict__ scales) {
  constexpr int kRows = detail::kMxChunk;  // rows per thread = elements per chunk
  TokenBlock tb;
  if (!detail::find_col_token_block<kRagged>(p, detail::col_grid_slot(), tb)) return;
  const int padded_rows = detail::padded_tile_rows(tb);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) & 31;
  const int r0 = 64 * (warp & 1) + 32 * ((lane >> 2) & 1) + 8 * (lane & 3);  // first row within the token block
  const int64_t k0 = int64_t{blockIdx.x} * kRegTileCols + 32 * (warp >> 1) + 8 * (lane >> 3);  // first column
  const bool cols_in = k0 < p.K;  // K % 8 == 0: the thread's 8 columns are all in or all out
  uint32_t v[kRows][4];           // row i, BF16 columns 2j (low half) and 2j + 1 (high half) of word j
  // Row r0 + i's 16 bytes are i rows past the first (K < 2^21: one 32-bit multiply-add per load).
  const bf16* const x0 = x + (tb.row0 + r0) * p.K + k0;
  const uint32_t row_elems = static_cast<uint32_t>(p.K);
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    uint4 u = make_uint4(0, 0, 0, 0);  // rows past the group's tokens are zeros
    if (cols_in && r0 + i < tb.rows) u = __ldcs(reinterpret_cast<const uint4*>(x0 + i * row_elems));
    v[i][0] = u.x;
    v[i][1] = u.y;
    v[i][2] = u.z;
    v[i][3] = u.w;
  }
  // Whole MX blocks only: the four lanes of a block share r0 - 8 q and k0, so `in` is the same for them.
  const bool in = cols_in && r0 < padded_rows;
  const uint32_t t0 = static_cast<uint32_t>(tb.col0 + r0);  // position along the group's tokens (rht signs)
  // Stochastic rounding: element (r0 + i, k0 + c) has flat index 8 (n0 + i K / 8) + c (K % 8 == 0, k0 % 8 == 0):
  // byte c of mx_sr_hash64(p.seed, n0 + i K / 8), its counter advanced by one addition per row.
  uint64_t word[kRows] = {};
  if constexpr (kRounding == Rounding::stochastic) {
    const uint64_t n0 = ((p.row_offset + static_cast<uint64_t>(tb.row0 + r0)) * static_cast<uint64_t>(p.K) +
                         static_cast<uint64_t>(k0)) / 8;
    uint64_t counter = mx_sr_counter(p.seed, n0);
    const uint64_t row_counter_step = static_cast<uint64_t>(p.K) / 8 * kMxSrWeyl;
#pragma unroll
    for (int i = 0; i < kRows; ++i, counter += row_counter_step) word[i] = detail::sr_hash_once(counter);
  }
  // Chunk c (column k0 + c) is c rows of X^T past the thread's first chunk: its codes ld / 8 words and its scale
  // ld / 32 bytes further per column (ld = L_g or M: a multiple of 32 below 2^31).
  const int64_t e0 = detail::col_layout_offset(tb, k0, r0);
  uint32_t* const code0 = reinterpret_cast<uint32_t*>(codes) + e0 / 8;
  uint8_t* const scale0 = scales + e0 / kMxBlock;
  const uint32_t ld = static_cast<uint32_t>(tb.ld), ld_words = ld / 8, ld_scales = ld / kMxBlock;
  unsigned long long counted = 0;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int cc = 0; cc < 4; ++cc) {
      const int c = 4 * h + cc;
      const uint32_t halves = (c & 1) ? 0x7632u : 0x5410u;  // the high or the low BF16 of both words
      uint32_t w[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) w[j] = __byte_perm(v[2 * j][c / 2], v[2 * j + 1][c / 2], halves);
      const detail::ChunkCodes out = detail::quantize_chunk<kRounding, kTransform>(
          make_uint4(w[0], w[1], w[2], w[3]), t0, p.rht_seed, p.mode, [&] {
            // Rows 4 j .. 4 j + 3: byte cc of the 32-bit half h of their hashes, three byte permutations per word.
            detail::ChunkDraws d;
#pragma unroll
            for (int j = 0; j < kRows / 4; ++j) {
              uint32_t r[4];
#pragma unroll
              for (int t = 0; t < 4; ++t) r[t] = static_cast<uint32_t>(word[4 * j + t] >> (32 * h));
              const uint32_t pick = static_cast<uint32_t>(cc | (4 + cc) << 4);  // byte cc of both operands
              d.word[j] = __byte_perm(__byte_perm(r[0], r[1], pick), __byte_perm(r[2], r[3], pick), 0x5410);
            }
            return d;
          });
      store_chunk_at(in, out, p, code0 + c * ld_words, scale0 + c * ld_scales, counted);
    }
  }
  if (p.nonfinite_blocks != nullptr && lane == 0 && counted != 0) atomicAdd(p.nonfinite_blocks, counted);
}

using ColKernelFn = void (*)(const bf16*, MxColParams, uint8_t*, uint8_t*);

template <bool kRagged, Rounding kRounding, HadamardTransform kTransform>
ColKernelFn col_kernel(detail::MxColKernel kernel) {
  switch (kernel) {
    case detail::MxColKernel::shared_tile:
      return bf16_to_mxfp4_col_kernel<kRounding, kTransform, kRagged>;
    case detail::MxColKernel::register_tile:
      return bf16_to_mxfp4_col_regs_kernel<kRounding, kTransform, kRagged>;
    case detail::MxColKernel::block_staged:
      return detail::bf16_to_mxfp4_col_block_kernel<kRounding, kTransform, kRagged, true>;
    default:
      return detail::bf16_to_mxfp4_col_block_kernel<kRounding, kTransform, kRagged, false>;
  }
}

// Threads per block.
int block_threads(detail::MxColKernel kernel) {
  return kernel == detail::MxColKernel::block_per_thread || kernel == detail::MxColKernel::block_staged
             ? detail::kColBlockThreads
             : kThreads;
}

// Columns of X per thread block (the grid's first dimension: column tiles).
int64_t tile_cols(detail::MxColKernel kernel) {
  switch (kernel) {
    case detail::MxColKernel::shared_tile:
      return kTileCols;
    case detail::MxColKernel::register_tile:
      return kRegTileCols;
    default:
      return detail::kColBlockTileCols;
  }
}

template <bool kRagged, Rounding kRounding>
ColKernelFn col_kernel(detail::MxColKernel kernel, HadamardTransform t) {
  switch (t) {
    case HadamardTransform::h16:
      return col_kernel<kRagged, kRounding, HadamardTransform::h16>(kernel);
    case HadamardTransform::h32:
      return col_kernel<kRagged, kRounding, HadamardTransform::h32>(kernel);
    case HadamardTransform::rht:
      return col_kernel<kRagged, kRounding, HadamardTransform::rht>(kernel);
    default:
      return col_kernel<kRagged, kRounding, HadamardTransform::none>(kernel);
  }
}

// Pointer checks and the launch of both forms (arguments already checked).
template <bool kRagged>
void launch_col(detail::MxColKernel kernel, const char* what, const bf16* x, int64_t M, int64_t K,
                const int32_t* offsets, int64_t G, uint8_t* codes, uint8_t* scales, const MxQuantConfig& cfg,
                unsigned long long* nonfinite_blocks, cudaStream_t stream) {
  detail::check_mx_pointer(what, "x", x, 16);
  detail::check_mx_pointer(what, "codes", codes, 16);
  detail::check_mx_pointer(what, "scales", scales, 1);
  if (nonfinite_blocks != nullptr) detail::check_mx_pointer(what, "nonfinite_blocks", nonfinite_blocks, 8);
  const MxColParams p{cfg.scale_mode, cfg.seed, static_cast<uint64_t>(cfg.row_offset), cfg.rht_seed, M, K, offsets,
                      static_cast<int>(G), nonfinite_blocks};
  const int64_t slots = ceil_div(M, int64_t{kTileRows}) + (kRagged ? G : 0);
  const int64_t max_y = detail::kMxColMaxGridY;
  const ColKernelFn fn = cfg.rounding == Rounding::rne
                             ? col_kernel<kRagged, Rounding::rne>(kernel, cfg.transform)
                             : col_kernel<kRagged, Rounding::stochastic>(kernel, cfg.transform);
  const dim3 grid = kernel == detail::MxColKernel::shared_tile
                        ? dim3(static_cast<unsigned>(slots), static_cast<unsigned>(ceil_div(K, int64_t{kTileCols})))
                        : dim3(static_cast<unsigned>(ceil_div(K, tile_cols(kernel))),
                               static_cast<unsigned>(slots < max_y ? slots : max_y),
                               static_cast<unsigned>(ceil_div(slots, max_y)));
  fn<<<grid, block_threads(kernel), 0, stream>>>(x, p, codes, scales);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

namespace detail {

MxColKernel mx_col_default_kernel(Rounding rounding, HadamardTransform transform) {
  // The block-per-thread kernel for every option: its SASS needs fewer instructions per element than register_tile's
  // (the block rule once per MX block instead of per chunk of 8 over shuffles, no transpose, the transform without
  // shuffles; reports/results/h200/quant-speed-ranks-20261202/NOTES-speed.md). Its outputs go through shared memory
  // (block_staged) where that was faster: RNE without a transform, 0.81-0.91 of copy against 0.74-0.84 with each
  // thread storing its own. With a transform or stochastic rounding the kernel is bound by its instructions: with a
  // transform the two are within 0.02 either way (staged ahead by at most 0.008 with the current RNE encoder), with
  // stochastic rounding the direct stores ahead by 0.005-0.024 (reports/results/h200/quant-col-staged-20261203/).
  // bench_quant times the others beside it (bf16_to_mxfp4_col_blocks/, _staged/, _regs/, _shared/).
  return rounding == Rounding::rne && transform == HadamardTransform::none ? MxColKernel::block_staged
                                                                           : MxColKernel::block_per_thread;
}

void bf16_to_mxfp4_col_using(MxColKernel kernel, const bf16* x, int64_t M, int64_t K, uint8_t* codes,
                             uint8_t* scales, const MxQuantConfig& cfg, unsigned long long* nonfinite_blocks,
                             cudaStream_t stream) {
  const char* what = "bf16_to_mxfp4_col";
  check_mx_col_config(what, M, K, false, cfg);
  if (M == 0) return;
  launch_col<false>(kernel, what, x, M, K, nullptr, 1, codes, scales, cfg, nonfinite_blocks, stream);
}

void bf16_to_mxfp4_col_ragged_using(MxColKernel kernel, const bf16* x, int64_t M, int64_t K, const int32_t* offsets,
                                    int64_t G, const int32_t* host_offsets, uint8_t* codes, uint8_t* scales,
                                    const MxQuantConfig& cfg, unsigned long long* nonfinite_blocks,
                                    cudaStream_t stream) {
  const char* what = "bf16_to_mxfp4_col_ragged";
  check_mx_col_config(what, M, K, true, cfg);
  FP4MOE_CHECK(G >= 1 && G <= kMaxColGroups, "{}: G must be in [1, {}], got G={}", what, kMaxColGroups, G);
  FP4MOE_CHECK(offsets != nullptr, "{}: device group offsets are null (expected int32 [G+1] = [{}])", what, G + 1);
  if (host_offsets != nullptr) validate_group_offsets(host_offsets, G, M, what);
  if (M == 0) return;  // every group is empty: the layout has no element
  launch_col<true>(kernel, what, x, M, K, offsets, G, codes, scales, cfg, nonfinite_blocks, stream);
}

}  // namespace detail

void bf16_to_mxfp4_col(const bf16* x, int64_t M, int64_t K, uint8_t* codes, uint8_t* scales,
                       const MxQuantConfig& cfg, unsigned long long* nonfinite_blocks, cudaStream_t stream) {
  detail::bf16_to_mxfp4_col_using(detail::mx_col_default_kernel(cfg.rounding, cfg.transform), x, M, K, codes, scales,
                                  cfg, nonfinite_blocks, stream);
}

void bf16_to_mxfp4_col_ragged(const bf16* x, int64_t M, int64_t K, const int32_t* offsets, int64_t G,
                              const int32_t* host_offsets, uint8_t* codes, uint8_t* scales,
                              const MxQuantConfig& cfg, unsigned long long* nonfinite_blocks, cudaStream_t stream) {
  detail::bf16_to_mxfp4_col_ragged_using(detail::mx_col_default_kernel(cfg.rounding, cfg.transform), x, M, K, offsets,
                                         G, host_offsets, codes, scales, cfg, nonfinite_blocks, stream);
}

}  // namespace fp4moe
