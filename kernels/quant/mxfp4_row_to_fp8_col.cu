// FP4RowToFP8Col: cached MXFP4 rows -> FP8 E4M3 columns over ragged expert groups, for Wgrad (the paper's
// fused conversion). One thread block per (group, 128-token block, 256 features), found on the device.
// Its grid order (feature tiles fastest, so blocks in flight share token rows and their scale sectors) and per-warp
// token-block find were chosen among variants timed by bench_quant against the copy ceiling (runs listed in
// reports/results/h200/README.md).
//
//   0. each warp finds the block's group and token block from the device offsets (find_by_warp: no barrier).
//   1. load: 128 token rows x 8 MX blocks, one 16-byte load per MX block (its 32 packed E2M1 codes) plus its
//      UE8M0 byte; codes go to shared memory with an XOR swizzle on 16-token chunks, scale bytes transposed.
//   2. per MX column (one warp): E = max exponent over the block's tokens (NaN blocks skipped),
//      s = max(E - 6, -126); 32 scales written; one packed lookup table per token with the E4M3 codes of the
//      eight E2M1 magnitudes times 2^(e_t - s) (e2m1_e4m3_lut.h), 0x7F for a NaN MX block.
//   3. each thread converts 8 features x 16 tokens with byte permutes (table lookup, sign, 4x4 transposes) and
//      writes 8 rows of 16 tokens: 8 neighbouring lanes write 128 contiguous bytes of one feature row.
#include "kernels/quant/mxfp4_row_to_fp8_col.h"

#include <climits>

#include "kernels/common/check.h"
#include "kernels/common/offsets.h"
#include "kernels/quant/e2m1_e4m3_lut.h"
#include "kernels/quant/fp8_shape_checks.h"
#include "kernels/quant/layouts.h"
#include "kernels/quant/ragged_token_blocks.cuh"

namespace fp4moe {
namespace {

constexpr int kThreads = 256;
constexpr int kTileTokens = kFp8Block;   // 128 tokens: one FP8 block along tokens
constexpr int kTileMx = 8;               // MX blocks (of 32 features) per tile: 256 features
constexpr int kRowWords = kTileMx * 4;   // 32-bit words of packed codes per tile row (8 nibbles each)
constexpr int kScaleRowPad = 4;          // padding of the transposed scale bytes (spreads the banks of stores)
static_assert(kThreads == kTileMx * 32, "one warp per MX column in the exponent and conversion phases");
static_assert(kTileTokens * kTileMx == 4 * kThreads, "four 16-byte loads per thread");

using Finder = detail::TokenBlockFinder<kThreads>;

struct Shared {
  E2M1ToE4M3Lut lut[kTileMx][kTileTokens];        // per (MX column, token), rotated within 16-token chunks
  uint32_t codes[kTileTokens * kRowWords];         // word w of token t at t * 32 + (w ^ (4 * chunk(t)))
  uint8_t scale_bytes[kTileMx][kTileTokens + kScaleRowPad];
};

// Position of token t's table in a column: rotated by its 16-token chunk so that the 8 chunks read by one warp
// at the same step fall in distinct banks.
__device__ __forceinline__ int lut_slot(int t) { return (t & ~15) | ((t + (t >> 4)) & 15); }

// 4x4 byte transpose: out[f] byte i = in[i] byte f.
__device__ __forceinline__ void transpose_bytes_4x4(const uint32_t (&in)[4], uint32_t (&out)[4]) {
  uint32_t t0 = __byte_perm(in[0], in[1], 0x5140), t1 = __byte_perm(in[0], in[1], 0x7362);
  uint32_t t2 = __byte_perm(in[2], in[3], 0x5140), t3 = __byte_perm(in[2], in[3], 0x7362);
  out[0] = __byte_perm(t0, t2, 0x5410);
  out[1] = __byte_perm(t0, t2, 0x7632);
  out[2] = __byte_perm(t1, t3, 0x5410);
  out[3] = __byte_perm(t1, t3, 0x7632);
}

// The grid is (256-feature tiles, token blocks): the thread blocks in flight together share token rows (their
// scale bytes' sectors come from L2 once). Past 65535 token blocks (ceil(M/128) + G: about 8.3M tokens) the grid
// is transposed (kTokensOnX), the same kernel otherwise.
template <bool kTokensOnX>
__global__ void __launch_bounds__(kThreads)
mxfp4_row_to_fp8_col_kernel(const uint8_t* __restrict__ in_codes, const uint8_t* __restrict__ in_scales,
                            int64_t M, int64_t K, const int32_t* __restrict__ offsets, int G,
                            uint8_t* __restrict__ out_codes, float* __restrict__ out_scales) {
  __shared__ Shared sh;
  detail::TokenBlock tb;
  const unsigned token_block = kTokensOnX ? blockIdx.x : blockIdx.y;
  const unsigned feature_tile = kTokensOnX ? blockIdx.y : blockIdx.x;
  if (!Finder::find_by_warp(offsets, G, M, K, token_block, tb)) return;  // the same answer in every warp

  const int64_t mx_per_row = K / kMxBlock;
  const int mx0 = feature_tile * kTileMx;
  const int n_mx = static_cast<int>(mx_per_row - mx0 < kTileMx ? mx_per_row - mx0 : kTileMx);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

  // 1. Load: thread (token t, MX block m) for four (t, m); 8 lanes read one row's 128 contiguous bytes.
  uint4 v[4];
  uint32_t sb[4];
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    int idx = tid + r * kThreads, t = idx >> 3, m = idx & 7;
    v[r] = make_uint4(0, 0, 0, 0);
    sb[r] = 0;
    if (t < tb.rows && m < n_mx) {
      int64_t row = tb.row0 + t;
      v[r] = __ldg(reinterpret_cast<const uint4*>(in_codes + row * (K / 2) + int64_t{mx0 + m} * (kMxBlock / 2)));
      sb[r] = in_scales[row * mx_per_row + mx0 + m];
    }
  }
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    int idx = tid + r * kThreads, t = idx >> 3, m = idx & 7;
    *reinterpret_cast<uint4*>(&sh.codes[t * kRowWords + 4 * (m ^ ((t >> 4) & 7))]) = v[r];
    sh.scale_bytes[m][t] = static_cast<uint8_t>(sb[r]);
  }
  __syncthreads();

  // 2. Exponents: warp = MX column; lane holds tokens 4 lane .. 4 lane + 3.
  if (warp < n_mx) {
    uint32_t four = *reinterpret_cast<const uint32_t*>(&sh.scale_bytes[warp][4 * lane]);
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
      E2M1ToE4M3Lut lut{0u, 0u};  // tokens past the group: codes 0 (the layout's zero padding)
      if (t < tb.rows) lut = b == kUE8M0NaN ? E2M1ToE4M3Lut{0x7F7F7F7Fu, 0x7F7F7F7Fu}
                                            : e2m1_to_e4m3_lut(static_cast<int>(b) - kUE8M0Bias - s);
      sh.lut[warp][lut_slot(t)] = lut;
    }
  }
  __syncthreads();

  // 3. Convert: lane = chunk + 8 j; word wi = 4 warp + j holds features 8 wi .. 8 wi + 7 of the tile.
  const int c = lane & 7, wi = 4 * warp + (lane >> 3);
  if (warp >= n_mx || tb.col0 + 16 * c >= tb.ld) return;  // no feature here, or past the padded group
  uint32_t out[8][4];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    uint32_t lo4[4], hi4[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      int t = 16 * c + 4 * q + i;
      uint32_t wd = sh.codes[t * kRowWords + (wi ^ (c << 2))];
      E2M1ToE4M3Lut lut = sh.lut[warp][16 * c + ((4 * q + i + c) & 15)];
      uint32_t mag = wd & 0x77777777u;               // 3-bit magnitudes: prmt selectors without sign mode
      uint32_t sel = (wd >> 3) & 0x11111111u;        // sign bits as selectors: byte 0 (0x00) or byte 1 (0x80)
      uint32_t sign_src = (lut.lo & 0xFFu) ? 0u : 0x8000u;  // a NaN table (0x7F..) takes no sign
      lo4[i] = __byte_perm(lut.lo, lut.hi, mag) | __byte_perm(sign_src, 0u, sel);
      hi4[i] = __byte_perm(lut.lo, lut.hi, mag >> 16) | __byte_perm(sign_src, 0u, sel >> 16);
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

}  // namespace

void mxfp4_row_to_fp8_col(const uint8_t* in_codes, const uint8_t* in_scales, int64_t M, int64_t K,
                          const int32_t* offsets, int64_t G, const int32_t* host_offsets, uint8_t* out_codes,
                          float* out_scales, cudaStream_t stream) {
  const char* what = "mxfp4_row_to_fp8_col";
  FP4MOE_CHECK(M >= 0 && M <= INT32_MAX, "{}: M must be in [0, 2^31) (int32 offsets), got in [M, K] = [{}, {}]",
               what, M, K);
  FP4MOE_CHECK(K > 0 && K % kMxBlock == 0,
               "{}: K must be a positive multiple of 32 (MX block), got in [M, K] = [{}, {}]", what, M, K);
  FP4MOE_CHECK(ceil_div(K, kTileMx * kMxBlock) <= 65535, "{}: K={} too large (at most {} features)", what, K,
               65535 * kTileMx * kMxBlock);
  FP4MOE_CHECK(G >= 1 && G <= detail::kMaxColGroups, "{}: G must be in [1, {}], got G={}", what,
               detail::kMaxColGroups, G);
  FP4MOE_CHECK(offsets != nullptr, "{}: device group offsets are null (expected int32 [G+1] = [{}])", what, G + 1);
  FP4MOE_CHECK(out_codes != nullptr && out_scales != nullptr, "{}: output pointers are null", what);
  FP4MOE_CHECK(M == 0 || (in_codes != nullptr && in_scales != nullptr), "{}: input pointers are null", what);
  FP4MOE_CHECK(detail::aligned16(in_codes) && detail::aligned16(out_codes),
               "{}: in_codes and out_codes must be 16-byte aligned (16-byte loads and stores)", what);
  FP4MOE_CHECK((reinterpret_cast<uintptr_t>(out_scales) & 3u) == 0, "{}: out_scales must be 4-byte aligned", what);
  if (host_offsets) validate_group_offsets(host_offsets, G, M, what);
  if (M == 0) return;  // every group is empty: the layout has no element

  const int64_t token_blocks = ceil_div(M, kFp8Block) + G, feature_tiles = ceil_div(K, kTileMx * kMxBlock);
  if (token_blocks <= 65535) {
    dim3 grid(static_cast<unsigned>(feature_tiles), static_cast<unsigned>(token_blocks));
    mxfp4_row_to_fp8_col_kernel<false><<<grid, kThreads, 0, stream>>>(in_codes, in_scales, M, K, offsets,
                                                                       static_cast<int>(G), out_codes, out_scales);
  } else {
    dim3 grid(static_cast<unsigned>(token_blocks), static_cast<unsigned>(feature_tiles));
    mxfp4_row_to_fp8_col_kernel<true><<<grid, kThreads, 0, stream>>>(in_codes, in_scales, M, K, offsets,
                                                                      static_cast<int>(G), out_codes, out_scales);
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace fp4moe
