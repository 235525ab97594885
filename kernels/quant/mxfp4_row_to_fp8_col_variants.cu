// Variants 1..3 of the fused MXFP4 -> FP8 column conversion (mxfp4_row_to_fp8_col.h,
// detail::mxfp4_row_to_fp8_col_variant) and the variant dispatch.
//
// Variant 0 (mxfp4_row_to_fp8_col.cu) gives each thread block one 128-token block: it first scans the group
// offsets (a dependent global load and a block scan) and only then issues its 16 KB of loads, so every tile
// pays two memory round trips before converting, and the loads of a block are never in flight while it
// converts. Here a thread block takes kSlots consecutive token-block slots of the same 256 features: one scan
// finds them all (ragged_token_runs.cuh), and the loads of the next tile go out into registers right after the
// current tile is staged in shared memory, so they are in flight during its table and conversion phases. The
// phases are variant 0's (mxfp4_fp8_col_tile.cuh); shared memory holds one tile.
#include <climits>

#include "kernels/common/check.h"
#include "kernels/quant/layouts.h"
#include "kernels/quant/mxfp4_fp8_col_tile.cuh"
#include "kernels/quant/mxfp4_row_to_fp8_col.h"
#include "kernels/quant/ragged_token_runs.cuh"

namespace fp4moe {
namespace {

using namespace detail;

struct Variant {
  const char* name;
  int slots;  // consecutive token blocks per thread block
};

constexpr Variant kVariants[] = {
    {"one token block per thread block", 1},
    {"2 token blocks per thread block, one scan, next tile's loads in flight", 2},
    {"4 token blocks per thread block, one scan, next tile's loads in flight", 4},
    {"8 token blocks per thread block, one scan, next tile's loads in flight", 8},
};
constexpr int kNumVariants = static_cast<int>(sizeof(kVariants) / sizeof(kVariants[0]));

template <int kSlots>
struct RunShared {
  union {
    typename TokenBlockRunFinder<kColThreads, kSlots>::TempStorage scan;  // used first, before any tile data
    ColTileTables lut;
  } u;
  ColTileData tile;
  SlotGroup found[kSlots];
};

// Four resident blocks per multiprocessor: 64 registers (the prefetched tile stays live through the conversion;
// unbounded, the compiler takes ~115 and two blocks fit).
template <int kSlots>
__global__ void __launch_bounds__(kColThreads, 4)
mxfp4_row_to_fp8_col_runs_kernel(const uint8_t* __restrict__ in_codes, const uint8_t* __restrict__ in_scales,
                                 int64_t M, int64_t K, const int32_t* __restrict__ offsets, int G,
                                 uint8_t* __restrict__ out_codes, float* __restrict__ out_scales) {
  __shared__ RunShared<kSlots> sh;
  const long long first_slot = static_cast<long long>(blockIdx.x) * kSlots;
  if (!TokenBlockRunFinder<kColThreads, kSlots>::find(offsets, G, M, first_slot, sh.u.scan, sh.found)) return;
  int n = 0;  // slots that exist: a prefix of the run
  while (n < kSlots && sh.found[n].group >= 0) ++n;
  if (n == 0) return;

  const int64_t mx_per_row = K / kMxBlock;
  const int mx0 = blockIdx.y * kColTileMx;
  const int n_mx = static_cast<int>(mx_per_row - mx0 < kColTileMx ? mx_per_row - mx0 : kColTileMx);
  ColTileRegs regs;
  load_col_tile(in_codes, in_scales, K, mx0, n_mx, token_block_of(sh.found[0], first_slot, K), regs);
  for (int i = 0; i < n; ++i) {
    if (i > 0) __syncthreads();  // the previous tile's conversion has read the shared tile and tables
    stage_col_tile(regs, sh.tile);
    if (i + 1 < n)  // in flight during this tile's phases
      load_col_tile(in_codes, in_scales, K, mx0, n_mx, token_block_of(sh.found[i + 1], first_slot + i + 1, K), regs);
    __syncthreads();
    const TokenBlock tb = token_block_of(sh.found[i], first_slot + i, K);
    col_tile_tables(sh.tile, sh.u.lut, tb, mx0, n_mx, out_scales);
    __syncthreads();
    convert_col_tile(sh.tile, sh.u.lut, tb, mx0, n_mx, out_codes);
  }
}

template <int kSlots>
void launch_runs(const uint8_t* in_codes, const uint8_t* in_scales, int64_t M, int64_t K, const int32_t* offsets,
                 int64_t G, uint8_t* out_codes, float* out_scales, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(ceil_div(ceil_div(M, kFp8Block) + G, int64_t{kSlots})),
                  static_cast<unsigned>(ceil_div(K, kColTileMx * kMxBlock)));
  mxfp4_row_to_fp8_col_runs_kernel<kSlots><<<grid, kColThreads, 0, stream>>>(in_codes, in_scales, M, K, offsets,
                                                                              static_cast<int>(G), out_codes,
                                                                              out_scales);
}

}  // namespace

namespace detail {

int mxfp4_row_to_fp8_col_variants() { return kNumVariants; }

const char* mxfp4_row_to_fp8_col_variant_name(int variant) {
  return variant >= 0 && variant < kNumVariants ? kVariants[variant].name : "";
}

void mxfp4_row_to_fp8_col_variant(int variant, const uint8_t* in_codes, const uint8_t* in_scales, int64_t M,
                                  int64_t K, const int32_t* offsets, int64_t G, const int32_t* host_offsets,
                                  uint8_t* out_codes, float* out_scales, cudaStream_t stream) {
  const char* what = "mxfp4_row_to_fp8_col";
  FP4MOE_CHECK(variant >= 0 && variant < kNumVariants, "{}: variant must be in [0, {}), got {}", what, kNumVariants,
               variant);
  check_mxfp4_row_to_fp8_col_args(what, in_codes, in_scales, M, K, offsets, G, host_offsets, out_codes, out_scales);
  if (M == 0) return;  // every group is empty: the layout has no element
  switch (variant) {
    case 0:
      launch_mxfp4_row_to_fp8_col_v0(in_codes, in_scales, M, K, offsets, G, out_codes, out_scales, stream);
      return;
    case 1:
      launch_runs<2>(in_codes, in_scales, M, K, offsets, G, out_codes, out_scales, stream);
      break;
    case 2:
      launch_runs<4>(in_codes, in_scales, M, K, offsets, G, out_codes, out_scales, stream);
      break;
    default:
      launch_runs<8>(in_codes, in_scales, M, K, offsets, G, out_codes, out_scales, stream);
      break;
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace detail
}  // namespace fp4moe
