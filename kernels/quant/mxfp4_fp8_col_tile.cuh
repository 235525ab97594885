// The phases of one FP4RowToFP8Col tile (mxfp4_row_to_fp8_col.cu and its variants): 128 tokens of one ragged
// group x 8 MX blocks (256 features), 256 threads.
//   1. load: 128 token rows x 8 MX blocks, one 16-byte load per MX block (its 32 packed E2M1 codes) plus its
//      UE8M0 byte, into registers (load_col_tile); then into shared memory (stage_col_tile): codes with an XOR
//      swizzle on 16-token chunks, scale bytes transposed.
//   2. per MX column (one warp): E = max exponent over the block's tokens (NaN blocks skipped),
//      s = max(E - 6, -126); 32 scales written; one packed lookup table per token with the E4M3 codes of the
//      eight E2M1 magnitudes times 2^(e_t - s) (e2m1_e4m3_lut.h), 0x7F for a NaN MX block (col_tile_tables).
//   3. each thread converts 8 features x 16 tokens with byte permutes (table lookup, sign, 4x4 transposes) and
//      writes 8 rows of 16 tokens: 8 neighbouring lanes write 128 contiguous bytes of one feature row
//      (convert_col_tile).
// A __syncthreads separates 1 from 2 and 2 from 3.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/formats/formats.h"
#include "kernels/quant/e2m1_e4m3_lut.h"
#include "kernels/quant/layouts.h"
#include "kernels/quant/ragged_token_blocks.cuh"

namespace fp4moe::detail {

// Argument checks of mxfp4_row_to_fp8_col (every variant) and the launch of variant 0 (mxfp4_row_to_fp8_col.cu).
void check_mxfp4_row_to_fp8_col_args(const char* what, const uint8_t* in_codes, const uint8_t* in_scales, int64_t M,
                                     int64_t K, const int32_t* offsets, int64_t G, const int32_t* host_offsets,
                                     const uint8_t* out_codes, const float* out_scales);
void launch_mxfp4_row_to_fp8_col_v0(const uint8_t* in_codes, const uint8_t* in_scales, int64_t M, int64_t K,
                                    const int32_t* offsets, int64_t G, uint8_t* out_codes, float* out_scales,
                                    cudaStream_t stream);

constexpr int kColThreads = 256;
constexpr int kColTileTokens = kFp8Block;    // 128 tokens: one FP8 block along tokens
constexpr int kColTileMx = 8;                // MX blocks (of 32 features) per tile: 256 features
constexpr int kColRowWords = kColTileMx * 4;  // 32-bit words of packed codes per tile row (8 nibbles each)
constexpr int kColScaleRowPad = 4;           // padding of the transposed scale bytes (spreads the banks of stores)
static_assert(kColThreads == kColTileMx * 32, "one warp per MX column in the exponent and conversion phases");
static_assert(kColTileTokens * kColTileMx == 4 * kColThreads, "four 16-byte loads per thread");

// Per (MX column, token) tables of phase 2, rotated within 16-token chunks.
using ColTileTables = E2M1ToE4M3Lut[kColTileMx][kColTileTokens];

struct ColTileData {
  uint32_t codes[kColTileTokens * kColRowWords];  // word w of token t at t * 32 + (w ^ (4 * chunk(t)))
  uint8_t scale_bytes[kColTileMx][kColTileTokens + kColScaleRowPad];
};

// The tile's registers between load and staging: thread (token t, MX block m) for four (t, m).
struct ColTileRegs {
  uint4 v[4];
  uint32_t sb[4];
};

// Position of token t's table in a column: rotated by its 16-token chunk so that the 8 chunks read by one warp
// at the same step fall in distinct banks.
__device__ __forceinline__ int col_lut_slot(int t) { return (t & ~15) | ((t + (t >> 4)) & 15); }

// 4x4 byte transpose: out[f] byte i = in[i] byte f.
__device__ __forceinline__ void transpose_bytes_4x4(const uint32_t (&in)[4], uint32_t (&out)[4]) {
  uint32_t t0 = __byte_perm(in[0], in[1], 0x5140), t1 = __byte_perm(in[0], in[1], 0x7362);
  uint32_t t2 = __byte_perm(in[2], in[3], 0x5140), t3 = __byte_perm(in[2], in[3], 0x7362);
  out[0] = __byte_perm(t0, t2, 0x5410);
  out[1] = __byte_perm(t0, t2, 0x7632);
  out[2] = __byte_perm(t1, t3, 0x5410);
  out[3] = __byte_perm(t1, t3, 0x7632);
}

// Phase 1a: loads of the tile's codes and scale bytes (zeros past the group's rows and the tensor's features);
// 8 lanes read one row's 128 contiguous bytes.
__device__ __forceinline__ void load_col_tile(const uint8_t* __restrict__ in_codes,
                                              const uint8_t* __restrict__ in_scales, int64_t K, int mx0, int n_mx,
                                              const TokenBlock& tb, ColTileRegs& r) {
  const int64_t mx_per_row = K / kMxBlock;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    int idx = static_cast<int>(threadIdx.x) + i * kColThreads, t = idx >> 3, m = idx & 7;
    r.v[i] = make_uint4(0, 0, 0, 0);
    r.sb[i] = 0;
    if (t < tb.rows && m < n_mx) {
      int64_t row = tb.row0 + t;
      r.v[i] = __ldg(reinterpret_cast<const uint4*>(in_codes + row * (K / 2) + int64_t{mx0 + m} * (kMxBlock / 2)));
      r.sb[i] = in_scales[row * mx_per_row + mx0 + m];
    }
  }
}

// Phase 1b: registers -> shared memory.
__device__ __forceinline__ void stage_col_tile(const ColTileRegs& r, ColTileData& d) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    int idx = static_cast<int>(threadIdx.x) + i * kColThreads, t = idx >> 3, m = idx & 7;
    *reinterpret_cast<uint4*>(&d.codes[t * kColRowWords + 4 * (m ^ ((t >> 4) & 7))]) = r.v[i];
    d.scale_bytes[m][t] = static_cast<uint8_t>(r.sb[i]);
  }
}

// Phase 2: warp = MX column; lane holds tokens 4 lane .. 4 lane + 3. Writes the block's 32 scales of this column.
__device__ __forceinline__ void col_tile_tables(const ColTileData& d, ColTileTables& lut, const TokenBlock& tb,
                                                int mx0, int n_mx, float* __restrict__ out_scales) {
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  if (warp >= n_mx) return;
  uint32_t four = *reinterpret_cast<const uint32_t*>(&d.scale_bytes[warp][4 * lane]);
  uint32_t best = 0;  // UE8M0 byte + 1 of the largest non-NaN exponent, 0 if none
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    uint32_t b = (four >> (8 * i)) & 0xFFu;
    if (4 * lane + i < tb.rows && b != kUE8M0NaN) best = max(best, b + 1);
  }
  best = __reduce_max_sync(0xFFFFFFFFu, best);
  const int s = best == 0 ? 0 : direct_group_scale_exponent(static_cast<int>(best) - 1 - kUE8M0Bias);
  out_scales[tb.scales_offset + int64_t{mx0 + warp} * kMxBlock + lane] = exp2_exact(s);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    int t = 4 * lane + i;
    uint32_t b = (four >> (8 * i)) & 0xFFu;
    E2M1ToE4M3Lut table{0u, 0u};  // tokens past the group: codes 0 (the layout's zero padding)
    if (t < tb.rows) table = b == kUE8M0NaN ? E2M1ToE4M3Lut{0x7F7F7F7Fu, 0x7F7F7F7Fu}
                                            : e2m1_to_e4m3_lut(static_cast<int>(b) - kUE8M0Bias - s);
    lut[warp][col_lut_slot(t)] = table;
  }
}

// Phase 3: lane = chunk + 8 j; word wi = 4 warp + j holds features 8 wi .. 8 wi + 7 of the tile.
__device__ __forceinline__ void convert_col_tile(const ColTileData& d, const ColTileTables& lut, const TokenBlock& tb,
                                                 int mx0, int n_mx, uint8_t* __restrict__ out_codes) {
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int c = lane & 7, wi = 4 * warp + (lane >> 3);
  if (warp >= n_mx || tb.col0 + 16 * c >= tb.ld) return;  // no feature here, or past the padded group
  uint32_t out[8][4];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    uint32_t lo4[4], hi4[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      int t = 16 * c + 4 * q + i;
      uint32_t wd = d.codes[t * kColRowWords + (wi ^ (c << 2))];
      E2M1ToE4M3Lut table = lut[warp][16 * c + ((4 * q + i + c) & 15)];
      uint32_t mag = wd & 0x77777777u;               // 3-bit magnitudes: prmt selectors without sign mode
      uint32_t sel = (wd >> 3) & 0x11111111u;        // sign bits as selectors: byte 0 (0x00) or byte 1 (0x80)
      uint32_t sign_src = (table.lo & 0xFFu) ? 0u : 0x8000u;  // a NaN table (0x7F..) takes no sign
      lo4[i] = __byte_perm(table.lo, table.hi, mag) | __byte_perm(sign_src, 0u, sel);
      hi4[i] = __byte_perm(table.lo, table.hi, mag >> 16) | __byte_perm(sign_src, 0u, sel >> 16);
    }
    uint32_t tlo[4], thi[4];
    transpose_bytes_4x4(lo4, tlo);
    transpose_bytes_4x4(hi4, thi);
#pragma unroll
    for (int f = 0; f < 4; ++f) {
      out[f][q] = tlo[f];
      out[4 + f][q] = thi[f];
    }
  }
  uint8_t* dst = out_codes + tb.codes_offset + (int64_t{mx0} * kMxBlock + 8 * wi) * tb.ld + tb.col0 + 16 * c;
#pragma unroll
  for (int f = 0; f < 8; ++f)
    *reinterpret_cast<uint4*>(dst + f * tb.ld) = make_uint4(out[f][0], out[f][1], out[f][2], out[f][3]);
}

}  // namespace fp4moe::detail
