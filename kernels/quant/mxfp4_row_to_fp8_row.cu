// Direct MXFP4 -> FP8 1x128 row conversion (mxfp4_row_to_fp8_row.h) and the naive two-pass baseline.
//
// The tensor is walked as a flat sequence of 16-element units: one thread reads 8 bytes of packed codes (whole
// bytes, half an MX block) and writes 16 E4M3 codes with one 16-byte store; a warp reads 256 and writes 512
// contiguous bytes. The thread also reads the (up to) four scale bytes of its 1x128 group, finds the group's
// largest non-NaN exponent with packed byte maxima (integer operations), and converts four codes at a time with
// one byte permute through the per-shift table of e2m1_e4m3_lut.h, the sign bits moved into place by shifts and
// masks. No float arithmetic touches the values. The first thread of each group writes its fp32 scale.
#include <type_traits>

#include "kernels/quant/bf16_to_fp8.h"
#include "kernels/quant/e2m1_e4m3_lut.h"
#include "kernels/quant/layouts.h"
#include "kernels/quant/mx_row_checks.h"
#include "kernels/quant/mx_row_launch.cuh"
#include "kernels/quant/mxfp4_fp8_row_device.cuh"
#include "kernels/quant/mxfp4_row_to_fp8_row.h"
#include "kernels/quant/mxfp4_to_bf16.h"

namespace fp4moe {
namespace {

using namespace detail;  // convert16 (mxfp4_fp8_row_device.cuh)

constexpr int kThreads = 256;
constexpr int kUnitsPerThread = 4;  // independent 8-byte loads in flight per thread
constexpr int kUnit = 16;                           // elements per unit: 8 code bytes in, 16 E4M3 bytes out
constexpr int kUnitsPerBlock = kMxBlock / kUnit;    // 2
constexpr int kUnitsPerGroup = kFp8Block / kUnit;   // 8
constexpr int kBlocksPerGroup = kFp8Block / kMxBlock;  // 4
static_assert(kBlocksPerGroup == 4, "the group's scale bytes are handled as one 32-bit word");

// Division of a 32-bit unit index n < 2^31 by a fixed d >= 2 with one multiply-high and one shift (Granlund and
// Montgomery 1994, theorem 4.2 with N = 31): L = ceil(log2 d), m = ceil(2^(31 + L) / d) < 2^32 (2^31 when d is
// a power of two), and n / d = (n * m) >> (31 + L) = umulhi(n, m) >> (L - 1) for every n < 2^31.
struct UnitDivider {
  uint32_t multiplier = 0, shift = 0;
  static UnitDivider make(uint32_t d) {
    int L = 0;
    while ((uint64_t{1} << L) < d) ++L;
    return {static_cast<uint32_t>(((uint64_t{1} << (31 + L)) + d - 1) / d), static_cast<uint32_t>(L - 1)};
  }
  __device__ __forceinline__ uint32_t divide(uint32_t n) const { return __umulhi(n, multiplier) >> shift; }
};

// Index: the integer type of unit indices, 32-bit when every index fits (division by units per row through
// UnitDivider), else 64-bit (plain division).
// kWholeGroups: K % 128 == 0 and in_scales 4-byte aligned, so a group's four scale bytes are one aligned word.
template <typename Index, bool kWholeGroups>
__global__ void __launch_bounds__(kThreads)
mxfp4_row_to_fp8_row_kernel(const uint2* __restrict__ in_codes, const uint8_t* __restrict__ in_scales,
                            Index M, Index units_per_row, UnitDivider row_of_unit, Index num_units,
                            uint4* __restrict__ out_codes, float* __restrict__ out_scales) {
  const Index blocks_per_row = units_per_row / kUnitsPerBlock;  // K / 32
  const Index scale_ld = (M + 3) / 4 * 4;                       // fp8_row_scale_ld(M)
  const Index sweep = static_cast<Index>(gridDim.x) * kThreads * kUnitsPerThread;
  for (Index base = static_cast<Index>(blockIdx.x) * kThreads * kUnitsPerThread; base < num_units; base += sweep) {
    uint2 codes[kUnitsPerThread];
    uint32_t group_scales[kUnitsPerThread];  // the group's scale bytes, 0xFF where the group has no block
    Index row[kUnitsPerThread], unit_in_row[kUnitsPerThread];
#pragma unroll
    for (int j = 0; j < kUnitsPerThread; ++j) {
      const Index u = base + j * kThreads + threadIdx.x;
      if (u >= num_units) continue;
      if constexpr (std::is_same_v<Index, uint32_t>)
        row[j] = row_of_unit.divide(u);
      else
        row[j] = u / units_per_row;
      unit_in_row[j] = u - row[j] * units_per_row;
      codes[j] = __ldcs(in_codes + u);
      const Index first_block = unit_in_row[j] / kUnitsPerGroup * kBlocksPerGroup;
      const uint8_t* s = in_scales + row[j] * blocks_per_row + first_block;
      if constexpr (kWholeGroups) {
        group_scales[j] = __ldg(reinterpret_cast<const uint32_t*>(s));
      } else {
        uint32_t word = 0;
#pragma unroll
        for (int i = 0; i < kBlocksPerGroup; ++i)
          word |= (first_block + i < blocks_per_row ? uint32_t{__ldg(s + i)} : uint32_t{kUE8M0NaN}) << (8 * i);
        group_scales[j] = word;
      }
    }
#pragma unroll
    for (int j = 0; j < kUnitsPerThread; ++j) {
      const Index u = base + j * kThreads + threadIdx.x;
      if (u >= num_units) continue;
      // Byte b + 1 (mod 256) puts NaN blocks (0xFF) at 0, below every finite exponent byte (0..254 -> 1..255).
      const uint32_t biased = __vadd4(group_scales[j], 0x01010101u);
      uint32_t top = __vmaxu4(biased, biased >> 16);
      top = max(top & 0xFFu, (top >> 8) & 0xFFu);
      const int s = top == 0u ? 0 : direct_group_scale_exponent(static_cast<int>(top) - 1 - kUE8M0Bias);

      const uint32_t own = (group_scales[j] >> (8 * (unit_in_row[j] / kUnitsPerBlock % kBlocksPerGroup))) & 0xFFu;
      uint4 out;
      if (own == kUE8M0NaN) {
        out = make_uint4(0x7F7F7F7Fu, 0x7F7F7F7Fu, 0x7F7F7F7Fu, 0x7F7F7F7Fu);
      } else {
        out = convert16(codes[j].x, codes[j].y, e2m1_to_e4m3_lut(static_cast<int>(own) - kUE8M0Bias - s));
      }
      __stcs(out_codes + u, out);

      if (unit_in_row[j] % kUnitsPerGroup == 0) {
        const Index g = unit_in_row[j] / kUnitsPerGroup;
        out_scales[g * scale_ld + row[j]] = exp2_exact(s);
        if (row[j] == M - 1)
          for (Index r = M; r < scale_ld; ++r) out_scales[g * scale_ld + r] = 1.0f;  // layout padding rows
      }
    }
  }
}

}  // namespace

namespace detail {

void check_mxfp4_row_to_fp8_row_args(const char* what, const uint8_t* in_codes, const uint8_t* in_scales, int64_t M,
                                     int64_t K, const uint8_t* out_codes, const float* out_scales) {
  check_mx_row_shape(what, M, K);
  if (M == 0) return;
  check_mx_pointer(what, "in_codes", in_codes, 16);
  check_mx_pointer(what, "in_scales", in_scales, 1);
  check_mx_pointer(what, "out_codes", out_codes, 16);
  check_mx_pointer(what, "out_scales", out_scales, 4);
}

// Variant 0: the grid-stride kernel above. Arguments already checked, M > 0.
void launch_mxfp4_row_to_fp8_row_v0(const uint8_t* in_codes, const uint8_t* in_scales, int64_t M, int64_t K,
                                    uint8_t* out_codes, float* out_scales, cudaStream_t stream) {
  const int64_t units_per_row = K / kUnit, num_units = M * units_per_row;
  const int64_t blocks_needed = ceil_div(num_units, int64_t{kThreads} * kUnitsPerThread);
  const auto* codes8 = reinterpret_cast<const uint2*>(in_codes);
  auto* out16 = reinterpret_cast<uint4*>(out_codes);
  // 32-bit indices while every index the kernel forms (unit, scale entry, sweep step) stays below 2^31.
  const int64_t scale_entries = fp8_row_scale_count(M, K);
  // The sweep (grid * kThreads * kUnitsPerThread) is at most blocks_needed * kThreads * kUnitsPerThread.
  const int64_t max_index = num_units + blocks_needed * kThreads * kUnitsPerThread;
  const bool narrow = max_index < (int64_t{1} << 31) && scale_entries < (int64_t{1} << 31);
  const bool whole_groups = K % kFp8Block == 0 && (reinterpret_cast<uintptr_t>(in_scales) & 3u) == 0;
  const UnitDivider row_of_unit = narrow ? UnitDivider::make(static_cast<uint32_t>(units_per_row)) : UnitDivider{};
  auto launch = [&](auto index_zero, auto whole_groups_tag) {
    using Index = decltype(index_zero);
    constexpr auto kernel = mxfp4_row_to_fp8_row_kernel<Index, decltype(whole_groups_tag)::value>;
    const unsigned grid = mx_grid_blocks<kernel, kThreads>(blocks_needed);
    kernel<<<grid, kThreads, 0, stream>>>(codes8, in_scales, static_cast<Index>(M), static_cast<Index>(units_per_row),
                                          row_of_unit, static_cast<Index>(num_units), out16, out_scales);
  };
  if (narrow && whole_groups) launch(uint32_t{0}, std::true_type{});
  else if (narrow) launch(uint32_t{0}, std::false_type{});
  else if (whole_groups) launch(int64_t{0}, std::true_type{});
  else launch(int64_t{0}, std::false_type{});
  CUDA_CHECK_LAUNCH();
}

}  // namespace detail

void mxfp4_row_to_fp8_row(const uint8_t* in_codes, const uint8_t* in_scales, int64_t M, int64_t K,
                          uint8_t* out_codes, float* out_scales, cudaStream_t stream) {
  detail::mxfp4_row_to_fp8_row_variant(0, in_codes, in_scales, M, K, out_codes, out_scales, stream);
}

void mxfp4_row_to_fp8_row_naive(const uint8_t* in_codes, const uint8_t* in_scales, int64_t M, int64_t K,
                                bf16* workspace, uint8_t* out_codes, float* out_scales, cudaStream_t stream) {
  const char* what = "mxfp4_row_to_fp8_row_naive";
  detail::check_mx_row_shape(what, M, K);
  if (M == 0) return;
  detail::check_mx_pointer(what, "workspace", workspace, 16);
  // Everything the second launch needs is checked before the first one runs.
  detail::check_mx_pointer(what, "out_codes", out_codes, 16);
  detail::check_mx_pointer(what, "out_scales", out_scales, 16);
  mxfp4_to_bf16(in_codes, in_scales, M, K, workspace, stream);
  bf16_to_fp8_row(workspace, M, K, Fp8ScaleMode::pow2, out_codes, out_scales, nullptr, stream);
}

}  // namespace fp4moe
