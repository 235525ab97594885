// CPU reference of the direct MXFP4 -> FP8 column conversion (mxfp4_row_to_fp8_col.h), written straight from
// the rule element by element with e2m1_to_e4m3_shifted (no lookup tables, no tiles).
#include <algorithm>
#include <climits>

#include "kernels/common/check.h"
#include "kernels/common/offsets.h"
#include "kernels/formats/formats.h"
#include "kernels/quant/fp8_col_groups.h"
#include "kernels/quant/layouts.h"
#include "kernels/quant/mxfp4_row_to_fp8_col.h"

namespace fp4moe {

void mxfp4_row_to_fp8_col_ref(const uint8_t* in_codes, const uint8_t* in_scales, int64_t M, int64_t K,
                              const int32_t* offsets, int64_t G, uint8_t* out_codes, float* out_scales) {
  const char* what = "mxfp4_row_to_fp8_col_ref";
  FP4MOE_CHECK(M >= 0 && M <= INT32_MAX, "{}: M must be in [0, 2^31) (int32 offsets), got in [M, K] = [{}, {}]",
               what, M, K);
  FP4MOE_CHECK(K > 0 && K % kMxBlock == 0,
               "{}: K must be a positive multiple of 32 (MX block), got in [M, K] = [{}, {}]", what, M, K);
  validate_group_offsets(offsets, G, M, what);
  FP4MOE_CHECK(out_codes != nullptr && out_scales != nullptr, "{}: output pointers are null", what);
  FP4MOE_CHECK(M == 0 || (in_codes != nullptr && in_scales != nullptr), "{}: input pointers are null", what);

  const int64_t mx_per_row = K / kMxBlock;
  for (const Fp8ColGroup& grp : fp8_col_groups(offsets, G, K)) {
    for (int64_t k = 0; k < K; ++k) {
      uint8_t* codes_k = out_codes + grp.codes_offset + k * grp.ld;
      for (int64_t b = 0; b < grp.token_blocks; ++b) {
        const int64_t t0 = b * kFp8Block, t1 = std::min(grp.rows, t0 + kFp8Block);
        // E: the largest exponent of the tokens' MX blocks holding feature k, NaN blocks excluded.
        bool any = false;
        int E = 0;
        for (int64_t t = t0; t < t1; ++t) {
          uint8_t sb = in_scales[(grp.row0 + t) * mx_per_row + k / kMxBlock];
          if (sb == kUE8M0NaN) continue;
          int e = static_cast<int>(sb) - kUE8M0Bias;
          E = any ? std::max(E, e) : e;
          any = true;
        }
        const int s = any ? direct_group_scale_exponent(E) : 0;  // only NaN blocks: scale 1
        out_scales[grp.scales_offset + b * K + k] = exp2_exact(s);
        for (int64_t t = t0; t < t1; ++t) {
          const int64_t row = grp.row0 + t;
          uint8_t sb = in_scales[row * mx_per_row + k / kMxBlock];
          uint8_t byte = in_codes[row * (K / 2) + k / 2];
          uint8_t code = (k % 2 == 0) ? (byte & 0xF) : (byte >> 4);
          codes_k[t] = sb == kUE8M0NaN ? kE4M3NaN
                                       : e2m1_to_e4m3_shifted(code, static_cast<int>(sb) - kUE8M0Bias - s);
        }
      }
      for (int64_t t = grp.rows; t < grp.ld; ++t) codes_k[t] = 0;  // zero padding columns
    }
  }
}

}  // namespace fp4moe
