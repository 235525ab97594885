// CPU reference of BF16 -> MXFP4 column quantization (bf16_to_mxfp4_col.h): each column of each group, zero-padded
// to a multiple of 32 rows, goes through the row quantizer's reference steps (mx_transform_rows_bf16_ref, then
// mx_quantize_values_ref with the element's index in X as its stochastic-rounding counter).
#include <vector>

#include "kernels/common/offsets.h"
#include "kernels/quant/bf16_to_mxfp4_col.h"
#include "kernels/quant/layouts.h"
#include "kernels/quant/mx_row_checks.h"

namespace fp4moe {

namespace detail {
void check_mx_col_config(const char* what, int64_t M, int64_t K, bool ragged, const MxQuantConfig& cfg) {
  FP4MOE_CHECK(M >= 0 && M < (int64_t{1} << 31) && (ragged || M % kMxBlock == 0),
               "{}: M must be in [0, 2^31){} (blocks of 32 rows), got shape [M, K] = [{}, {}]", what,
               ragged ? "" : " and a multiple of 32", M, K);
  FP4MOE_CHECK(K > 0 && K % 8 == 0 && K <= kMxColMaxK,
               "{}: K must be a positive multiple of 8 (16-byte rows) and at most {}, got shape [M, K] = [{}, {}]",
               what, kMxColMaxK, M, K);
  check_mx_quant_options(what, cfg);
}
}  // namespace detail

namespace {

// Group rows [row0, row0 + rows) of x [*, K] -> the MXFP4 row tensor of the zero-padded [K, L] transpose.
int64_t quantize_group(const bf16* x, int64_t K, int64_t row0, int64_t rows, uint8_t* codes, uint8_t* scales,
                       const MxQuantConfig& cfg) {
  const int64_t L = mxfp4_col_group_ld(rows);
  if (L == 0) return 0;  // an empty group has no element
  std::vector<bf16> column(static_cast<size_t>(L));
  std::vector<float> v(static_cast<size_t>(L));
  int64_t nonfinite = 0;
  for (int64_t k = 0; k < K; ++k) {
    for (int64_t j = 0; j < L; ++j) column[j] = j < rows ? x[(row0 + j) * K + k] : bf16_from_bits(0);
    mx_transform_rows_bf16_ref(column.data(), 1, L, cfg.transform, cfg.rht_seed, v.data());
    const uint64_t base = static_cast<uint64_t>(cfg.row_offset + row0) * static_cast<uint64_t>(K) + k;
    nonfinite += detail::mx_quantize_values_ref(v.data(), L, base, static_cast<uint64_t>(K), codes + k * L / 2,
                                                scales + k * L / kMxBlock, cfg);
  }
  return nonfinite;
}

}  // namespace

int64_t bf16_to_mxfp4_col_ref(const bf16* x, int64_t M, int64_t K, uint8_t* codes, uint8_t* scales,
                              const MxQuantConfig& cfg) {
  const char* what = "bf16_to_mxfp4_col_ref";
  detail::check_mx_col_config(what, M, K, false, cfg);
  if (M == 0) return 0;
  detail::check_mx_host_pointer(what, "x", x);
  detail::check_mx_host_pointer(what, "codes", codes);
  detail::check_mx_host_pointer(what, "scales", scales);
  return quantize_group(x, K, 0, M, codes, scales, cfg);
}

int64_t bf16_to_mxfp4_col_ragged_ref(const bf16* x, int64_t M, int64_t K, const int32_t* offsets, int64_t G,
                                     uint8_t* codes, uint8_t* scales, const MxQuantConfig& cfg) {
  const char* what = "bf16_to_mxfp4_col_ragged_ref";
  detail::check_mx_col_config(what, M, K, true, cfg);
  validate_group_offsets(offsets, G, M, what);
  if (M == 0) return 0;
  detail::check_mx_host_pointer(what, "x", x);
  detail::check_mx_host_pointer(what, "codes", codes);
  detail::check_mx_host_pointer(what, "scales", scales);
  int64_t nonfinite = 0, P = 0;
  for (int64_t g = 0; g < G; ++g) {
    const int64_t rows = int64_t{offsets[g + 1]} - offsets[g];
    nonfinite += quantize_group(x, K, offsets[g], rows, codes + K * P / 2, scales + K * P / kMxBlock, cfg);
    P += mxfp4_col_group_ld(rows);
  }
  return nonfinite;
}

}  // namespace fp4moe
