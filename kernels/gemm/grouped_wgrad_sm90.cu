#include "kernels/gemm/grouped_wgrad_sm90.h"

#include <cuda_bf16.h>
#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <type_traits>

#include "kernels/common/check.h"
#include "kernels/gemm/grouped_gemm_sm90.h"
#include "kernels/gemm/setmaxnreg_check.h"
#include "kernels/gemm/sm90_grouped_device.cuh"
#include "kernels/gemm/sm90_launch.h"
#include "kernels/gemm/sm90_ptx.cuh"
#include "kernels/quant/cp_async.cuh"
#include "kernels/quant/layouts.h"

namespace fp4moe {

namespace {

constexpr int kTile = 128;             // output rows (n) and columns (k) of a tile; tokens per K block and stage
constexpr int kWgmmaK = 32;            // tokens of one m64n128k32 instruction (32 bytes of E4M3)
constexpr int kConsumerThreads = 256;  // warpgroups 0 and 1: rows 0..63 and 64..127 of a tile
constexpr int kThreads = 384;          // + warpgroup 2, the producer
constexpr int kProducerThreads = kThreads - kConsumerThreads;
constexpr int kConsumerWarps = kConsumerThreads / 32;
constexpr int kMaxGroups = 1024;
constexpr uint32_t kProducerRegs = 56, kConsumerRegs = 224;
static_assert(sm90::setmaxnreg_fits(kThreads, kProducerThreads, kProducerRegs, kConsumerRegs),
              "setmaxnreg asks for more registers than the thread block holds");
static_assert(kTile == kFp8Block && kTile % kWgmmaK == 0, "one scale block and whole WGMMA steps per stage");

// Shared memory from a 1024-byte aligned base: per stage the dY tile [128 n][128 tokens] and the X tile
// [128 k][128 tokens] (E4M3, K-major, 128-byte swizzle), the block's 128 dY scales (rows n) and 128 X scales
// (columns k); then the full and empty barriers of each stage; then the safe offsets, P_g and Q_g, [G+1] each.
constexpr int kStages = 6;
// Stages a producer thread keeps in flight before it waits for the oldest and hands it over. It waits on stage
// i's empty barrier having handed over every stage up to i - 1 - kLookahead, and stage i is free once the
// consumers are done with i - kStages: handed over already when kLookahead <= kStages - 1 (no wait on itself).
constexpr int kLookahead = 3;
// The overlapped consumers hold two stages (the block being promoted and the one whose WGMMAs run): the producer,
// waiting for stage i's release, has handed over every stage up to i - 1 - kLookahead, and the consumers release
// stage i - kStages once stage i - kStages + 1 has arrived (so i - kStages + 1 <= i - 1 - kLookahead suffices; one
// stage more is kept as margin).
static_assert(kLookahead >= 0 && kLookahead + 2 <= kStages, "the producer never waits for a stage it still holds");
constexpr uint32_t kOpBytes = kTile * kTile;  // 16 KiB: 128 rows of 128 bytes
constexpr uint32_t kScaleBytes = kTile * sizeof(float);
constexpr uint32_t kOffA = 0;
constexpr uint32_t kOffB = kOffA + kStages * kOpBytes;
constexpr uint32_t kOffSa = kOffB + kStages * kOpBytes;
constexpr uint32_t kOffSb = kOffSa + kStages * kScaleBytes;
constexpr uint32_t kOffBars = kOffSb + kStages * kScaleBytes;
constexpr uint32_t kOffGroups = kOffBars + 2 * kStages * sizeof(uint64_t);
constexpr size_t smem_bytes(int64_t G) { return 1024 + kOffGroups + 3 * sizeof(int32_t) * static_cast<size_t>(G + 1); }
static_assert(kOffB % 1024 == 0 && kOffSa % 1024 == 0 && kOpBytes % 1024 == 0, "tiles on 1024-byte swizzle atoms");
static_assert(kOffSb % 16 == 0 && kOffBars % 8 == 0, "cp.async and mbarrier alignment");
static_assert(smem_bytes(kMaxGroups) <= kSm90MaxSmemPerBlock, "the ring and the largest group table fit one block");

enum class WgradOut { bf16, fp32, fp32_accumulate, fp32_reduce };  // fp32_reduce: accumulate by red

struct WgradParams {
  const int32_t* offsets;  // device [G+1], raw
  int32_t G, M, N, K, pad;
  const uint8_t* dy_codes;
  const float* dy_scales;
  const uint8_t* x_codes;
  const float* x_scales;
  void* out;  // [G, N, K]
};

// Output tile t: group g, rows n0.., columns k0.. of dW_g; the group's 128-token blocks, padded length L_g and
// placement P_g, Q_g.
struct WgradTile {
  int32_t g, n0, k0, blocks, L, P, Q;
};

// Tiles in the order g, then k0, then n0 fastest (CTAs working at the same time share the group's X tile in L2).
__device__ __forceinline__ WgradTile wgrad_tile(int32_t t, const WgradParams& p, const int32_t* s_o,
                                                const int32_t* s_p, const int32_t* s_q) {
  const int32_t n_blocks = p.N / kTile, per_group = n_blocks * (p.K / kTile);
  const int32_t g = t / per_group, local = t - g * per_group;
  const int32_t rows = s_o[g + 1] - s_o[g];
  return WgradTile{g,
                   local % n_blocks * kTile,
                   local / n_blocks * kTile,
                   (rows + kTile - 1) / kTile,
                   (rows + p.pad - 1) / p.pad * p.pad,
                   s_p[g],
                   s_q[g]};
}

// ---- producer warpgroup ----------------------------------------------------------------------------------------

// Thread pt's copies of block b of `tile` into `stage`, one commit group: per pass i (0..7) row r = 16 i + pt / 8
// of both operand tiles, 16-byte chunk c = pt % 8 (tokens 128 b + 16 c ..; the 8 threads of a row read its 128
// contiguous bytes), written where the 128-byte swizzle puts it (chunk c ^ (r % 8) of the row); chunks at or past
// L_g zero-filled and not read. Threads 0..31 copy the 128 dY scales, 32..63 the 128 X scales of the block.
__device__ __forceinline__ void load_stage(const WgradParams& p, uint8_t* smem, int pt, const WgradTile& tile,
                                           int32_t b, uint32_t stage) {
  const int c = pt % 8, r0 = pt / 8;
  const int32_t token = b * kTile + 16 * c;
  const bool valid = token < tile.L;
  const uint8_t* a_src = p.dy_codes + int64_t{p.N} * tile.P + int64_t{tile.n0} * tile.L + token;
  const uint8_t* b_src = p.x_codes + int64_t{p.K} * tile.P + int64_t{tile.k0} * tile.L + token;
  uint8_t* a = smem + kOffA + stage * kOpBytes;
  uint8_t* bt = smem + kOffB + stage * kOpBytes;
  const uint32_t chunk = 16 * static_cast<uint32_t>(c ^ (r0 % 8));  // (16 i + r0) % 8 = r0 % 8
#pragma unroll 2
  for (int i = 0; i < kTile / 16; ++i) {
    const int r = 16 * i + r0;
    const int64_t off = int64_t{r} * tile.L;
    detail::cp_async_16(a + r * kTile + chunk, valid ? a_src + off : p.dy_codes, valid);
    detail::cp_async_16(bt + r * kTile + chunk, valid ? b_src + off : p.x_codes, valid);
  }
  if (pt < 32) {
    const float* src = p.dy_scales + int64_t{p.N} * (tile.Q + b) + tile.n0 + 4 * pt;
    detail::cp_async_16(smem + kOffSa + stage * kScaleBytes + 16 * pt, src, true);
  } else if (pt < 64) {
    const float* src = p.x_scales + int64_t{p.K} * (tile.Q + b) + tile.k0 + 4 * (pt - 32);
    detail::cp_async_16(smem + kOffSb + stage * kScaleBytes + 16 * (pt - 32), src, true);
  }
  detail::cp_async_commit();
}

// This thread's copies of its oldest stage in flight have landed: its writes ordered before the async proxy's
// reads (WGMMA), then one of the 128 arrivals that complete the stage's full barrier.
__device__ __forceinline__ void hand_over(uint64_t* full, sm90::RingPos<kStages>& pos) {
  sm90::fence_proxy_async_shared();
  sm90::mbar_arrive(&full[pos.stage]);
  pos.advance();
}

// All 128 producer threads, every block of every tile of this CTA in the consumers' order: wait for the stage to
// be free, issue its copies; once more than kLookahead are in flight, wait for the oldest and hand it over.
__device__ __forceinline__ void produce(const WgradParams& p, uint8_t* smem, uint64_t* full, uint64_t* empty,
                                        const int32_t* s_o, const int32_t* s_p, const int32_t* s_q, int32_t tiles) {
  const int pt = static_cast<int>(threadIdx.x) - kConsumerThreads;
  sm90::RingPos<kStages> load_pos, ready_pos;
  detail::CpAsyncWindow<kLookahead> window;
  const auto hand_over_oldest = [&] { hand_over(full, ready_pos); };
  for (int32_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const WgradTile tile = wgrad_tile(t, p, s_o, s_p, s_q);
    for (int32_t b = 0; b < tile.blocks; ++b) {
      sm90::mbar_wait(&empty[load_pos.stage], load_pos.phase ^ 1);
      load_stage(p, smem, pt, tile, b, load_pos.stage);
      load_pos.advance();
      window.issued(hand_over_oldest);
    }
  }
  window.drain(hand_over_oldest);
}

// ---- consumer warpgroups ---------------------------------------------------------------------------------------

__device__ __forceinline__ void fence_fragment(float (&f)[64]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) sm90::fence_operand(f[i]);
}

// What a consumer thread works with: its warpgroup's rows of the tile and its lane's fragment coordinates
// (sm90_ptx.cuh: acc[4 j + e] is row row_in_tile + 8 (e / 2), column 8 j + 2 q + e % 2).
struct ConsumerCtx {
  const uint8_t* smem;
  uint64_t* full;
  uint64_t* empty;
  int wg, row_in_tile, q, lane;
};

// partial = dY tile rows (this warpgroup's 64) x X tile^T over the 128 tokens in `stage`: four m64n128k32 WGMMAs,
// committed as one group (asynchronous: wait for the group before reading partial).
__device__ __forceinline__ void issue_block(const ConsumerCtx& c, uint32_t stage, float (&partial)[64]) {
  const uint64_t desc_a = sm90::smem_desc_k_major_sw128(c.smem + kOffA + stage * kOpBytes + 64 * c.wg * kTile);
  const uint64_t desc_b = sm90::smem_desc_k_major_sw128(c.smem + kOffB + stage * kOpBytes);
  fence_fragment(partial);
  sm90::wgmma_fence();
#pragma unroll
  for (int k = 0; k < kTile / kWgmmaK; ++k)  // + 32 bytes along the tokens = + 2 in the descriptor's address field
    sm90::wgmma_m64n128k32_e4m3(partial, desc_a + 2 * k, desc_b + 2 * k, k > 0 ? 1u : 0u);
  sm90::wgmma_commit();
}

// acc[n, k] += partial[n, k] * (dy_scale[n] * x_scale[k]) with the block's scales in `stage`.
__device__ __forceinline__ void promote(const ConsumerCtx& c, uint32_t stage, float (&acc)[64],
                                        const float (&partial)[64]) {
  const float* sa = reinterpret_cast<const float*>(c.smem + kOffSa + stage * kScaleBytes);
  const float2* sb = reinterpret_cast<const float2*>(c.smem + kOffSb + stage * kScaleBytes);
  const float s_lo = sa[c.row_in_tile], s_hi = sa[c.row_in_tile + 8];
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const float2 s = sb[4 * j + c.q];
    acc[4 * j] = __fmaf_rn(partial[4 * j], s_lo * s.x, acc[4 * j]);
    acc[4 * j + 1] = __fmaf_rn(partial[4 * j + 1], s_lo * s.y, acc[4 * j + 1]);
    acc[4 * j + 2] = __fmaf_rn(partial[4 * j + 2], s_hi * s.x, acc[4 * j + 2]);
    acc[4 * j + 3] = __fmaf_rn(partial[4 * j + 3], s_hi * s.y, acc[4 * j + 3]);
  }
}

// This warp is done with `stage` (its WGMMAs that read it complete, its scales read): one of the kConsumerWarps
// arrivals that let the producer refill it.
__device__ __forceinline__ void release_stage(const ConsumerCtx& c, uint32_t stage) {
  __syncwarp();
  if (c.lane == 0) sm90::mbar_arrive(&c.empty[stage]);
}

// Main loop, serial: per block, the WGMMAs, waited for, then the promotion.
__device__ __forceinline__ void mainloop_serial(const ConsumerCtx& c, int32_t blocks, sm90::RingPos<kStages>& pos,
                                                float (&acc)[64], float (&partial)[64]) {
  for (int32_t b = 0; b < blocks; ++b) {
    sm90::mbar_wait(&c.full[pos.stage], pos.phase);
    issue_block(c, pos.stage, partial);
    sm90::wgmma_wait<0>();
    fence_fragment(partial);
    promote(c, pos.stage, acc, partial);
    release_stage(c, pos.stage);
    pos.advance();
  }
}

// One step of the overlapped main loop: the block in stage `held` has its WGMMAs (into `cur`) in flight; issue the
// next block's into `next` from the stage at `pos`, wait until only those are pending, promote `cur` from `held`'s
// scales while the next block runs on the tensor cores, release `held`.
__device__ __forceinline__ void overlapped_step(const ConsumerCtx& c, sm90::RingPos<kStages>& pos, uint32_t& held,
                                                float (&acc)[64], float (&cur)[64], float (&next)[64]) {
  sm90::mbar_wait(&c.full[pos.stage], pos.phase);
  issue_block(c, pos.stage, next);
  sm90::wgmma_wait<1>();  // groups complete in order: the held block's is done, the next may run
  fence_fragment(cur);
  promote(c, held, acc, cur);
  release_stage(c, held);
  held = pos.stage;
  pos.advance();
}

// The last block of a tile, in `cur`: wait for it, promote, release its stage.
__device__ __forceinline__ void overlapped_finish(const ConsumerCtx& c, uint32_t held, float (&acc)[64],
                                                  float (&cur)[64]) {
  sm90::wgmma_wait<0>();
  fence_fragment(cur);
  promote(c, held, acc, cur);
  release_stage(c, held);
}

// Main loop, overlapped: two partials used alternately over the blocks (block b in p0 for even b, in p1 for odd b:
// two calls per turn keep every register index static), so that block b + 1's WGMMAs run while block b is promoted.
// The same products, promotions and order as mainloop_serial: the same bits. blocks >= 1.
__device__ __forceinline__ void mainloop_overlapped(const ConsumerCtx& c, int32_t blocks, sm90::RingPos<kStages>& pos,
                                                    float (&acc)[64], float (&p0)[64], float (&p1)[64]) {
  sm90::mbar_wait(&c.full[pos.stage], pos.phase);
  issue_block(c, pos.stage, p0);
  uint32_t held = pos.stage;
  pos.advance();
  for (int32_t b = 0;; b += 2) {
    if (b + 1 == blocks) {
      overlapped_finish(c, held, acc, p0);
      break;
    }
    overlapped_step(c, pos, held, acc, p0, p1);
    if (b + 2 == blocks) {
      overlapped_finish(c, held, acc, p1);
      break;
    }
    overlapped_step(c, pos, held, acc, p1, p0);
  }
}

// This thread's two rows of the tile into dW_g: pairs of columns, FP32 (written, added to after reading the old
// pair, or added to by reductions in global memory) or BF16.
template <WgradOut kOut>
__device__ __forceinline__ void store_tile(const WgradParams& p, const WgradTile& tile, int row_in_tile, int q,
                                           const float (&acc)[64]) {
  const int64_t lo = (int64_t{tile.g} * p.N + tile.n0 + row_in_tile) * p.K + tile.k0 + 2 * q;
  const int64_t hi = lo + 8 * int64_t{p.K};
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    if constexpr (kOut == WgradOut::bf16) {
      bf16* out = static_cast<bf16*>(p.out);
      *reinterpret_cast<__nv_bfloat162*>(out + lo + 8 * j) = __floats2bfloat162_rn(acc[4 * j], acc[4 * j + 1]);
      *reinterpret_cast<__nv_bfloat162*>(out + hi + 8 * j) = __floats2bfloat162_rn(acc[4 * j + 2], acc[4 * j + 3]);
    } else {
      float2* out_lo = reinterpret_cast<float2*>(static_cast<float*>(p.out) + lo + 8 * j);
      float2* out_hi = reinterpret_cast<float2*>(static_cast<float*>(p.out) + hi + 8 * j);
      float2 v_lo = make_float2(acc[4 * j], acc[4 * j + 1]), v_hi = make_float2(acc[4 * j + 2], acc[4 * j + 3]);
      if constexpr (kOut == WgradOut::fp32_reduce) {  // the adds at the L2: no read of the old pairs here
        sm90::red_add_global_v2(&out_lo->x, v_lo.x, v_lo.y);
        sm90::red_add_global_v2(&out_hi->x, v_hi.x, v_hi.y);
        continue;
      }
      if constexpr (kOut == WgradOut::fp32_accumulate) {
        const float2 o_lo = *out_lo, o_hi = *out_hi;
        v_lo = make_float2(o_lo.x + v_lo.x, o_lo.y + v_lo.y);
        v_hi = make_float2(o_hi.x + v_hi.x, o_hi.y + v_hi.y);
      }
      *out_lo = v_lo;
      *out_hi = v_hi;
    }
  }
}

template <WgradOut kOut, bool kOverlap>
__global__ void __launch_bounds__(kThreads, 1) grouped_wgrad_sm90_kernel(const WgradParams p) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (sm90::smem_addr(smem_raw) & 1023)) & 1023);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kOffBars);
  uint64_t* empty = full + kStages;
  int32_t* s_o = reinterpret_cast<int32_t*>(smem + kOffGroups);
  int32_t* s_p = s_o + p.G + 1;
  int32_t* s_q = s_p + p.G + 1;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      sm90::mbar_init(&full[s], kProducerThreads);  // every producer thread hands each stage over once
      sm90::mbar_init(&empty[s], kConsumerWarps);   // one arrival per consumer warp
    }
    sm90::mbar_init_fence();
  }
  for (int i = threadIdx.x; i <= p.G; i += kThreads) s_o[i] = p.offsets[i];
  __syncthreads();
  if (threadIdx.x < 32) {
    sm90::safe_offsets_warp(s_o, p.G, p.M);
    const int32_t pad = p.pad;
    sm90::exclusive_sum_warp(p.G, [&](int g) { return (s_o[g + 1] - s_o[g] + pad - 1) / pad * pad; }, s_p);
    sm90::exclusive_sum_warp(p.G, [&](int g) { return (s_o[g + 1] - s_o[g] + kTile - 1) / kTile; }, s_q);
  }
  __syncthreads();
  const int32_t tiles = p.G * (p.N / kTile) * (p.K / kTile);

  if (threadIdx.x >= kConsumerThreads) {
    sm90::warpgroup_regs_dec<kProducerRegs>();
    produce(p, smem, full, empty, s_o, s_p, s_q, tiles);
    return;
  }

  sm90::warpgroup_regs_inc<kConsumerRegs>();
  const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const ConsumerCtx c{smem, full, empty, wg, 64 * wg + 16 * warp + lane / 4, lane % 4, lane};
  float partial[kOverlap ? 2 : 1][64];
#pragma unroll
  for (int b = 0; b < (kOverlap ? 2 : 1); ++b)
#pragma unroll
    for (int i = 0; i < 64; ++i) partial[b][i] = 0.0f;
  sm90::RingPos<kStages> pos;
  for (int32_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const WgradTile tile = wgrad_tile(t, p, s_o, s_p, s_q);
    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
    if (tile.blocks == 0) {
      if (kOut == WgradOut::fp32_accumulate || kOut == WgradOut::fp32_reduce) continue;  // dW_g unchanged
    } else if constexpr (kOverlap) {
      mainloop_overlapped(c, tile.blocks, pos, acc, partial[0], partial[kOverlap ? 1 : 0]);
    } else {
      mainloop_serial(c, tile.blocks, pos, acc, partial[0]);
    }
    store_tile<kOut>(p, tile, c.row_in_tile, c.q, acc);
  }
}

template <WgradOut kOut, bool kOverlap>
void launch(const WgradParams& p, cudaStream_t stream) {
  const auto kernel = grouped_wgrad_sm90_kernel<kOut, kOverlap>;
  const size_t smem = smem_bytes(p.G);
  const int optin = current_device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
  FP4MOE_CHECK(smem <= static_cast<size_t>(optin),
               "grouped Wgrad (sm90): the kernel needs {} bytes of shared memory per block, the device offers {}", smem,
               optin);
  check_setmaxnreg_pool(reinterpret_cast<const void*>(kernel), "grouped_wgrad_sm90_kernel", kThreads,
                        {kConsumerRegs, kConsumerRegs, kProducerRegs});
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const int64_t tiles = int64_t{p.G} * (p.N / kTile) * (p.K / kTile);
  const int64_t grid = std::min<int64_t>(current_device_attribute(cudaDevAttrMultiProcessorCount), tiles);
  kernel<<<static_cast<unsigned>(grid), kThreads, smem, stream>>>(p);
  CUDA_CHECK_LAUNCH();
}

std::string shape_problem(int64_t N, int64_t K, int64_t G, int64_t token_pad) {
  if (N < kTile || K < kTile || N % kTile != 0 || K % kTile != 0)
    return fmt::format("N and K must be positive multiples of {} (the kernel's tile), got N={} K={}", kTile, N, K);
  if (G < 1 || G > kMaxGroups) return fmt::format("expected 1 <= G <= {} groups, got G={}", kMaxGroups, G);
  if (N > INT32_MAX || K > INT32_MAX || G * (N / kTile) * (K / kTile) > INT32_MAX)
    return fmt::format("G * (N / 128) * (K / 128) tiles must fit int32, got G={} N={} K={}", G, N, K);
  return wgrad_token_pad_problem(token_pad);
}

}  // namespace

std::string grouped_wgrad_sm90_unsupported(int64_t N, int64_t K, int64_t G, int64_t token_pad) {
  const std::string shape = shape_problem(N, K, G, token_pad);
  return shape.empty() ? sm90_device_unsupported() : shape;
}

void grouped_wgrad_fp8_sm90(Fp8ColOperand dy, Fp8ColOperand x, int64_t M, int64_t N, int64_t K,
                            const int32_t* offsets, int64_t G, GemmOutput dw, cudaStream_t stream,
                            int64_t token_pad, Sm90WgradConfig config) {
  const char* what = "grouped_wgrad_fp8_sm90";
  // Every argument check before the first CUDA call.
  const std::string shape = shape_problem(N, K, G, token_pad);
  FP4MOE_CHECK(shape.empty(), "{}: {}", what, shape);
  FP4MOE_CHECK(M >= 0 && M <= kWgradSm90MaxTokens, "{}: expected 0 <= M <= {} tokens, got M={}", what,
               kWgradSm90MaxTokens, M);
  FP4MOE_CHECK(offsets != nullptr && reinterpret_cast<uintptr_t>(offsets) % 4 == 0,
               "{}: device group offsets must be a non-null 4-byte aligned int32 pointer, got {}", what,
               static_cast<const void*>(offsets));
  FP4MOE_CHECK(!dw.accumulate || dw.type == GemmOutType::fp32,
               "{}: accumulation needs an FP32 output (the master gradient), got a BF16 output", what);
  FP4MOE_CHECK(nonnull_aligned16(dy.codes) && nonnull_aligned16(dy.scales) && nonnull_aligned16(x.codes) &&
                   nonnull_aligned16(x.scales) && nonnull_aligned16(dw.data),
               "{}: operands and output must be non-null 16-byte aligned device pointers, got dy codes {} scales {}, "
               "x codes {} scales {}, output {}", what, static_cast<const void*>(dy.codes),
               static_cast<const void*>(dy.scales), static_cast<const void*>(x.codes),
               static_cast<const void*>(x.scales), dw.data);
  const std::string device = sm90_device_unsupported();
  FP4MOE_CHECK(device.empty(), "{}: {}", what, device);
  const WgradParams p{offsets,
                      static_cast<int32_t>(G),
                      static_cast<int32_t>(M),
                      static_cast<int32_t>(N),
                      static_cast<int32_t>(K),
                      static_cast<int32_t>(token_pad),
                      dy.codes,
                      dy.scales,
                      x.codes,
                      x.scales,
                      dw.data};
  const auto run = [&](auto overlap) {
    constexpr bool kOverlap = decltype(overlap)::value;
    if (dw.type == GemmOutType::bf16) launch<WgradOut::bf16, kOverlap>(p, stream);
    else if (dw.accumulate && config.reduce_accumulate) launch<WgradOut::fp32_reduce, kOverlap>(p, stream);
    else if (dw.accumulate) launch<WgradOut::fp32_accumulate, kOverlap>(p, stream);
    else launch<WgradOut::fp32, kOverlap>(p, stream);
  };
  if (config.overlap_promotion) run(std::true_type{});
  else run(std::false_type{});
}

}  // namespace fp4moe
