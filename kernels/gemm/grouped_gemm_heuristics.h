// Which path runs a grouped FP8 Fprop or Dgrad with 128x128 block weights and a BF16 output (GroupedGemm's
// fprop_fp8 / dgrad_fp8): our Hopper kernel (grouped_gemm_sm90.h: one launch for all experts, offsets read on the
// device) or one cuBLASLt call per expert. The rule, kept apart from both launchers, comes from H200 timings of the
// two paths in the same benchmark runs (bench_grouped_gemm's `fp8` and `fp8_sm90` rows at mean groups of about
// 512, 1024 and 2048 rows and one group of 16384; reports/results/h200/gemm-sm90-20261202/): the smaller the groups,
// the more the one persistent launch gains over the per-expert calls (which leave SMs idle at each group's end);
// at about 2048 rows the two are even for Fprop and ours leads for Dgrad; with one large group cuBLASLt's kernel
// is the faster. The threshold is the largest measured mean group size where ours was not slower.
#pragma once

#include <cstdint>

namespace fp4moe {

// Largest mean rows per group for which the Hopper kernel runs.
constexpr int64_t kSm90MaxMeanGroupRows = 2048;

// Whether the Hopper kernel is preferred for M rows over G groups (the caller still checks that it takes the
// problem: grouped_gemm_sm90_unsupported).
inline bool grouped_gemm_prefers_sm90(int64_t M, int64_t G) { return G > 0 && M <= kSm90MaxMeanGroupRows * G; }

// Whether the Hopper Wgrad kernel (grouped_wgrad_sm90.h) is preferred under Sm90Path::automatic for an (N, K, G)
// problem: never for now. On the H200 it runs at 0.46-0.77x of the cuBLASLt path at the V3 shapes
// (bench_grouped_gemm's wgrad/fp8_sm90 rows beside wgrad/fp8, reports/results/h200/wgrad-quant-20261203/), so
// automatic keeps Wgrad on cuBLASLt. A rule that replaces this one takes no host offsets (the kernel needs none).
inline bool grouped_wgrad_prefers_sm90(int64_t N, int64_t K, int64_t G) {
  (void)N;
  (void)K;
  (void)G;
  return false;
}

}  // namespace fp4moe
