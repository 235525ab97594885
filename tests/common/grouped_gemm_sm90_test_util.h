// Checks shared by the tests of the Hopper grouped GEMM (tests/gemm/test_grouped_gemm_sm90*_gpu.cpp): the skip
// on devices other than compute capability 9.0, per-group errors against a reference, the rows written (and only
// those), bit-for-bit comparison of two outputs, the kernel's variants (Sm90GemmConfig) run beside a case's width.
#pragma once

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/gemm/grouped_gemm_sm90.h"
#include "tests/common/grouped_gemm_test_util.h"

namespace fp4moe::test {

constexpr double kTol = 1e-2;

// The kernel runs on compute capability 9.0 only (sm_90a code); elsewhere its tests are skipped with the reason.
#define REQUIRE_SM90()                                                                              \
  do {                                                                                              \
    FP4MOE_REQUIRE_DEVICE();                                                                        \
    const std::string why = grouped_gemm_sm90_unsupported(128, 128, 1);                             \
    if (!why.empty()) GTEST_SKIP() << why;                                                          \
  } while (0)

// Worst expert group of an output [rows, P] over the compared rows.
struct Errors {
  double rel_l2 = 0;     // the worst group's relative L2 error
  int64_t group = -1;    // that group
  double max_abs = 0;    // max |got - want| over all compared elements
  double max_ref = 0;    // max |want|
  double max_rel() const { return max_ref > 0 ? max_abs / max_ref : max_abs; }
  std::string str() const {
    return fmt::format("worst group {} rel L2 {:.3e}, max |err| / max |ref| {:.3e}", group, rel_l2,
                       max_ref > 0 ? max_abs / max_ref : max_abs);
  }
};

inline Errors errors_of(const std::vector<float>& got, const std::vector<float>& want, int64_t P,
                        const std::vector<int32_t>& offsets, const std::vector<int64_t>& rows) {
  Errors e;
  const int64_t G = static_cast<int64_t>(offsets.size()) - 1;
  for (int64_t g = 0; g < G; ++g) {
    std::vector<float> gg, ww;
    group_rows(got, want, P, offsets, rows, g, gg, ww);
    if (gg.empty()) continue;
    const double err = relative_l2_error(gg.data(), ww.data(), static_cast<int64_t>(gg.size()));
    if (e.group < 0 || !(err <= e.rel_l2)) {
      e.rel_l2 = err;
      e.group = g;
    }
    for (size_t i = 0; i < gg.size(); ++i) {
      e.max_abs = std::max(e.max_abs, std::fabs(static_cast<double>(gg[i]) - ww[i]));
      e.max_ref = std::max(e.max_ref, std::fabs(static_cast<double>(ww[i])));
    }
  }
  return e;
}

// Every row of a group finite (except the rows marked in `nan_rows`, when given: rows with a NaN input); every
// other row of the M-row output still NaN (the poison).
inline void expect_written_rows(const std::string& what, const std::vector<float>& got, int64_t M, int64_t P,
                                const std::vector<int32_t>& offsets, const std::vector<bool>* nan_rows = nullptr) {
  const int64_t G = static_cast<int64_t>(offsets.size()) - 1;
  for (int64_t r = 0; r < M; ++r) {
    const bool in_group = r >= offsets[0] && r < offsets[G];
    const bool may_be_nan = nan_rows != nullptr && (*nan_rows)[static_cast<size_t>(r)];
    for (int64_t c = 0; c < P; ++c) {
      const float v = got[r * P + c];
      if (in_group && !may_be_nan && !std::isfinite(v)) {
        const auto g = std::upper_bound(offsets.begin(), offsets.end(), r) - offsets.begin() - 1;
        ADD_FAILURE() << what << ": element (" << r << ", " << c << ") of expert group " << g
                      << " is NaN/Inf (poison left unwritten, or a NaN read): " << v;
        return;
      }
      if (!in_group && !std::isnan(v)) {
        ADD_FAILURE() << what << ": element (" << r << ", " << c << ") outside every group was written: " << v;
        return;
      }
    }
  }
}

// Index of the first element whose bits differ between two outputs of the same size, or -1.
inline int64_t first_bit_difference(const std::vector<float>& a, const std::vector<float>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return static_cast<int64_t>(i);
  return -1;
}

// The kernel's variants (Sm90GemmConfig) checked beside a case's block_n: the direct epilogue at that width and,
// unless it is 256, the overlapped promotion (the 128-wide tile) with either epilogue.
inline std::vector<Sm90GemmConfig> variants_of(int block_n) {
  std::vector<Sm90GemmConfig> v{{block_n, false, false}};
  if (block_n != 256) {
    v.push_back({block_n, true, false});
    v.push_back({block_n, true, true});
  }
  return v;
}

inline std::string variant_name(const Sm90GemmConfig& v) {
  return fmt::format("block_n {}{}{}", v.block_n, v.overlap_promotion ? " overlap" : "",
                     v.coalesced_epilogue ? " coalesced epilogue" : "");
}

}  // namespace fp4moe::test
