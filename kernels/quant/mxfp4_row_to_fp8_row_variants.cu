// Variants 1..4 of the direct MXFP4 -> FP8 row conversion (mxfp4_row_to_fp8_row.h,
// detail::mxfp4_row_to_fp8_row_variant) and the variant dispatch.
//
// Variant 0 (mxfp4_row_to_fp8_row.cu) strides one wave of thread blocks over a flat sequence of units, divides
// each unit index by the units per row, and writes each group's fp32 scale from the group's first thread: the
// scales of one warp land 4 bytes apart every round_up(M, 4) floats. Here one thread block converts a tile of
// rows x one 1x128 group (grid: groups x row tiles, groups fastest so that neighbouring blocks write neighbouring
// bytes of the same rows): no division, no grid-stride loop, and the tile's scales form one contiguous run of
// floats (block-major scale layout), written by the first thread of each group row. The conversion itself is
// variant 0's (convert16 through the block's packed table).
#include <cstdint>
#include <type_traits>

#include "kernels/common/check.h"
#include "kernels/quant/layouts.h"
#include "kernels/quant/mxfp4_fp8_row_device.cuh"
#include "kernels/quant/mxfp4_row_to_fp8_row.h"

namespace fp4moe {
namespace {

using namespace detail;

constexpr int kThreads = 256;

struct Variant {
  const char* name;
  int unit;             // elements per thread and row: 16 (8 bytes in) or 32 (one MX block, 16 bytes in)
  int rows_per_thread;  // rows of the tile each thread converts, all loads issued before the first store
  bool streaming;       // ld.global.cs / st.global.cs, else default caching
};

constexpr Variant kVariants[] = {
    {"grid-stride units of 16, one wave", 16, 4, true},
    {"tile 128 rows x 1 group, units of 16, 4 rows per thread, streaming hints", 16, 4, true},
    {"tile 256 rows x 1 group, units of 16, 8 rows per thread, streaming hints", 16, 8, true},
    {"tile 128 rows x 1 group, units of 16, 4 rows per thread, default caching", 16, 4, false},
    {"tile 256 rows x 1 group, units of 32, 4 rows per thread, streaming hints", 32, 4, true},
};
constexpr int kNumVariants = static_cast<int>(sizeof(kVariants) / sizeof(kVariants[0]));

template <int kUnit>
using CodesIn = std::conditional_t<kUnit == 16, uint2, uint4>;  // kUnit / 2 bytes of packed E2M1

template <bool kStreaming, typename T>
__device__ __forceinline__ T load(const T* p) {
  if constexpr (kStreaming) return __ldcs(p);
  else return __ldg(p);
}
template <bool kStreaming>
__device__ __forceinline__ void store(uint4* p, const uint4& v) {
  if constexpr (kStreaming) __stcs(p, v);
  else *p = v;
}

// Block (g, y): rows y * kRowsPerCta .. + kRowsPerCta - 1 of group g. Thread: u = its unit within the group row,
// slot = its first row; rows slot + kSlots * i. kWholeGroups: K % 128 == 0 and in_scales 4-byte aligned (a
// group's scale bytes are one aligned word).
template <int kUnit, int kRowsPerThread, bool kStreaming, bool kWholeGroups>
__global__ void __launch_bounds__(kThreads)
mxfp4_row_to_fp8_row_tile_kernel(const uint8_t* __restrict__ in_codes, const uint8_t* __restrict__ in_scales,
                                 int64_t M, int64_t K, uint8_t* __restrict__ out_codes, float* __restrict__ out_scales) {
  constexpr int kThreadsPerGroup = kFp8Block / kUnit;  // 8 or 4
  constexpr int kSlots = kThreads / kThreadsPerGroup;  // rows converted at once: 32 or 64
  constexpr int kRowsPerCta = kSlots * kRowsPerThread;
  static_assert(kUnit == 16 || kUnit == 32, "units of 16 elements or whole MX blocks");

  const int64_t g = blockIdx.x;
  const int u = static_cast<int>(threadIdx.x) % kThreadsPerGroup;
  const int slot = static_cast<int>(threadIdx.x) / kThreadsPerGroup;
  const int64_t row0 = int64_t{blockIdx.y} * kRowsPerCta + slot;
  const int64_t blocks_per_row = K / kMxBlock;
  const int64_t scale_ld = fp8_row_scale_ld(M);
  const int64_t first_block = g * (kFp8Block / kMxBlock);
  const int n_blocks = static_cast<int>(blocks_per_row - first_block < 4 ? blocks_per_row - first_block : 4);
  const bool active = u * kUnit < n_blocks * kMxBlock;  // a short last group has fewer units
  const int own_block = u * kUnit / kMxBlock;

  CodesIn<kUnit> codes[kRowsPerThread];
  uint32_t group_scales[kRowsPerThread];  // the group's scale bytes, 0xFF where the group has no block
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int64_t r = row0 + int64_t{kSlots} * i;
    if (r >= M) continue;
    if (active)
      codes[i] = load<kStreaming>(
          reinterpret_cast<const CodesIn<kUnit>*>(in_codes + r * (K / 2) + g * (kFp8Block / 2) + u * (kUnit / 2)));
    const uint8_t* s = in_scales + r * blocks_per_row + first_block;
    if constexpr (kWholeGroups) {
      group_scales[i] = __ldg(reinterpret_cast<const uint32_t*>(s));
    } else {
      uint32_t word = 0;
#pragma unroll
      for (int b = 0; b < 4; ++b) word |= (b < n_blocks ? uint32_t{__ldg(s + b)} : uint32_t{kUE8M0NaN}) << (8 * b);
      group_scales[i] = word;
    }
  }
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int64_t r = row0 + int64_t{kSlots} * i;
    if (r >= M) {
      if (u == 0 && r < scale_ld) out_scales[g * scale_ld + r] = 1.0f;  // padding rows of the scale layout
      continue;
    }
    const int s = group_scale_exponent(group_scales[i]);
    if (active) {
      const uint32_t own = (group_scales[i] >> (8 * own_block)) & 0xFFu;
      auto* dst = reinterpret_cast<uint4*>(out_codes + r * K + g * kFp8Block + u * kUnit);
      if constexpr (kUnit == 16) {
        store<kStreaming>(dst, convert16_block(codes[i].x, codes[i].y, own, s));
      } else {
        store<kStreaming>(dst, convert16_block(codes[i].x, codes[i].y, own, s));
        store<kStreaming>(dst + 1, convert16_block(codes[i].z, codes[i].w, own, s));
      }
    }
    if (u == 0) out_scales[g * scale_ld + r] = exp2_exact(s);
  }
}

// false when the shape is past the variant's grid (the caller then runs variant 0).
template <int kUnit, int kRowsPerThread, bool kStreaming>
bool launch_tiles(const uint8_t* in_codes, const uint8_t* in_scales, int64_t M, int64_t K, uint8_t* out_codes,
                  float* out_scales, cudaStream_t stream) {
  constexpr int kRowsPerCta = kThreads / (kFp8Block / kUnit) * kRowsPerThread;
  const int64_t row_tiles = ceil_div(M, int64_t{kRowsPerCta});  // covers the padding rows too (kRowsPerCta % 4 == 0)
  const int64_t groups = ceil_div(K, int64_t{kFp8Block});
  if (row_tiles > 65535 || groups > INT32_MAX) return false;
  const dim3 grid(static_cast<unsigned>(groups), static_cast<unsigned>(row_tiles));
  const bool whole_groups = K % kFp8Block == 0 && (reinterpret_cast<uintptr_t>(in_scales) & 3u) == 0;
  if (whole_groups)
    mxfp4_row_to_fp8_row_tile_kernel<kUnit, kRowsPerThread, kStreaming, true>
        <<<grid, kThreads, 0, stream>>>(in_codes, in_scales, M, K, out_codes, out_scales);
  else
    mxfp4_row_to_fp8_row_tile_kernel<kUnit, kRowsPerThread, kStreaming, false>
        <<<grid, kThreads, 0, stream>>>(in_codes, in_scales, M, K, out_codes, out_scales);
  return true;
}

}  // namespace

namespace detail {

int mxfp4_row_to_fp8_row_variants() { return kNumVariants; }

const char* mxfp4_row_to_fp8_row_variant_name(int variant) {
  return variant >= 0 && variant < kNumVariants ? kVariants[variant].name : "";
}

void mxfp4_row_to_fp8_row_variant(int variant, const uint8_t* in_codes, const uint8_t* in_scales, int64_t M,
                                  int64_t K, uint8_t* out_codes, float* out_scales, cudaStream_t stream) {
  const char* what = "mxfp4_row_to_fp8_row";
  FP4MOE_CHECK(variant >= 0 && variant < kNumVariants, "{}: variant must be in [0, {}), got {}", what, kNumVariants,
               variant);
  check_mxfp4_row_to_fp8_row_args(what, in_codes, in_scales, M, K, out_codes, out_scales);
  if (M == 0) return;
  bool launched = false;
  switch (variant) {
    case 0:
      break;
    case 1:
      launched = launch_tiles<16, 4, true>(in_codes, in_scales, M, K, out_codes, out_scales, stream);
      break;
    case 2:
      launched = launch_tiles<16, 8, true>(in_codes, in_scales, M, K, out_codes, out_scales, stream);
      break;
    case 3:
      launched = launch_tiles<16, 4, false>(in_codes, in_scales, M, K, out_codes, out_scales, stream);
      break;
    default:
      launched = launch_tiles<32, 4, true>(in_codes, in_scales, M, K, out_codes, out_scales, stream);
      break;
  }
  if (!launched) {
    launch_mxfp4_row_to_fp8_row_v0(in_codes, in_scales, M, K, out_codes, out_scales, stream);
    return;
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace detail
}  // namespace fp4moe
