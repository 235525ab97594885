// Row formats of the expert-parallel exchanges, argument checks, and the CPU references of pack / unpack
// (ep_payload.h).
#include <cstring>
#include <limits>

#include "kernels/common/check.h"
#include "kernels/formats/formats.h"
#include "trainer/comm/ep_payload.h"
#include "trainer/memory/estimate.h"

namespace fp4moe {

const char* ep_row_format_name(EpRowFormat f) {
  return f == EpRowFormat::bf16 ? "bf16" : f == EpRowFormat::fp8 ? "fp8" : "mxfp4";
}

EpRowFormat ep_dispatch_format(const Recipe& routed) {
  FP4MOE_CHECK(is_preset_recipe(routed),
               "expert-parallel dispatch: the routed experts' recipe ({}) is not one of the presets bf16, fp8, mxfp4; "
               "the exchange carries only those",
               recipe_name(routed));
  return routed == Recipe::bf16 ? EpRowFormat::bf16 : routed == Recipe::fp8 ? EpRowFormat::fp8 : EpRowFormat::mxfp4;
}

EpRowFormat ep_backward_dispatch_format(const Recipe& routed) {
  return ep_dispatch_format(routed) == EpRowFormat::bf16 ? EpRowFormat::bf16 : EpRowFormat::fp8;
}

int64_t ep_wire_row_bytes(EpRowFormat f, int64_t d) {
  FP4MOE_CHECK(d >= 1, "ep_wire_row_bytes: hidden size d must be >= 1, got {}", d);
  FP4MOE_CHECK(f != EpRowFormat::mxfp4 || d % kMxBlock == 0,
               "ep_wire_row_bytes: mxfp4 rows need d a multiple of {}, got d={}", kMxBlock, d);
  const Recipe recipe = f == EpRowFormat::bf16 ? Recipe::bf16 : f == EpRowFormat::fp8 ? Recipe::fp8 : Recipe::mxfp4;
  return expert_parallel_row_bytes(recipe, d).dispatch;
}

int64_t ep_rows_code_bytes(EpRowFormat f, int64_t rows, int64_t d) {
  ep_wire_row_bytes(f, d);
  FP4MOE_CHECK(rows >= 0, "ep_rows_code_bytes: rows must be >= 0, got {}", rows);
  return rows * ep_detail::row_code_bytes(f, d);
}

int64_t ep_rows_scale_bytes(EpRowFormat f, int64_t rows, int64_t d) {
  ep_wire_row_bytes(f, d);
  FP4MOE_CHECK(rows >= 0, "ep_rows_scale_bytes: rows must be >= 0, got {}", rows);
  if (f == EpRowFormat::fp8) return 4 * fp8_row_scale_count(rows, d);
  return rows * ep_detail::scales_per_row(f, d);
}

namespace ep_detail {

static void check_rows(const char* what, const EpRows& t, int64_t n) {
  ep_wire_row_bytes(t.format, t.d);
  FP4MOE_CHECK(n >= 0 && n <= std::numeric_limits<int32_t>::max(), "{}: row count n must be in [0, 2^31), got {}",
               what, n);
  FP4MOE_CHECK(t.rows >= 0, "{}: tensor rows must be >= 0, got {}", what, t.rows);
  if (n == 0 && t.rows == 0) return;
  FP4MOE_CHECK(t.codes, "{}: null codes pointer for {} rows", what, t.rows);
  FP4MOE_CHECK(t.format == EpRowFormat::bf16 || t.scales, "{}: null scales pointer for {} rows of format {}", what,
               t.rows, ep_row_format_name(t.format));
}

void check_pack(const EpRows& src, const int32_t* gather, int64_t divisor, int64_t n, const uint8_t* wire) {
  check_rows("ep_pack_rows", src, n);
  FP4MOE_CHECK(divisor >= 1, "ep_pack_rows: divisor must be >= 1, got {}", divisor);
  if (n == 0) return;
  FP4MOE_CHECK(wire, "ep_pack_rows: null wire buffer for {} rows", n);
  FP4MOE_CHECK(src.rows >= 1, "ep_pack_rows: {} rows to pack from a tensor of 0 rows", n);
  FP4MOE_CHECK(gather || n <= src.rows, "ep_pack_rows: {} rows without a gather map from a tensor of {} rows", n,
               src.rows);
}

void check_unpack(const uint8_t* wire, int64_t n, const EpRows& dst) {
  check_rows("ep_unpack_rows", dst, n);
  FP4MOE_CHECK(dst.rows >= n, "ep_unpack_rows: {} rows into a tensor of {} rows", n, dst.rows);
  FP4MOE_CHECK(n == 0 || wire, "ep_unpack_rows: null wire buffer for {} rows", n);
}

void check_fp8_to_bf16(const EpRows& src, const bf16* dst) {
  FP4MOE_CHECK(src.format == EpRowFormat::fp8, "ep_fp8_rows_to_bf16: rows in {}, expected fp8",
               ep_row_format_name(src.format));
  FP4MOE_CHECK(src.d >= 1 && src.rows >= 0, "ep_fp8_rows_to_bf16: need rows >= 0 and d >= 1, got [{}, {}]", src.rows,
               src.d);
  FP4MOE_CHECK(src.rows == 0 || (src.codes && src.scales && dst),
               "ep_fp8_rows_to_bf16: null codes, scales or output for {} rows", src.rows);
}

}  // namespace ep_detail

// One row's bytes between a tensor row and a wire row; to_wire picks the direction.
static void move_row(const EpRows& t, int64_t r, uint8_t* wire_row, bool to_wire) {
  using namespace ep_detail;
  const int64_t cb = row_code_bytes(t.format, t.d), ss = scale_size(t.format);
  uint8_t* codes = static_cast<uint8_t*>(t.codes) + r * cb;
  if (to_wire) std::memcpy(wire_row, codes, static_cast<size_t>(cb));
  else std::memcpy(codes, wire_row, static_cast<size_t>(cb));
  for (int64_t b = 0; b < scales_per_row(t.format, t.d); ++b) {
    uint8_t* s = static_cast<uint8_t*>(t.scales) + scale_offset(t.format, r, b, t.rows, t.d);
    uint8_t* w = wire_row + cb + b * ss;
    if (to_wire) std::memcpy(w, s, static_cast<size_t>(ss));
    else std::memcpy(s, w, static_cast<size_t>(ss));
  }
}

void ep_pack_rows_ref(const EpRows& src, const int32_t* gather, int64_t divisor, int64_t n, uint8_t* wire) {
  ep_detail::check_pack(src, gather, divisor, n, wire);
  const int64_t rb = ep_wire_row_bytes(src.format, src.d);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = gather ? gather[i] / divisor : i;
    FP4MOE_CHECK(r >= 0 && r < src.rows, "ep_pack_rows_ref: wire row {} gathers row {}, outside [0, {})", i, r,
                 src.rows);
    move_row(src, r, wire + i * rb, true);
  }
}

void ep_unpack_rows_ref(const uint8_t* wire, int64_t n, const int32_t* scatter, const EpRows& dst) {
  ep_detail::check_unpack(wire, n, dst);
  const int64_t rb = ep_wire_row_bytes(dst.format, dst.d);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = scatter ? scatter[i] : i;
    FP4MOE_CHECK(r >= 0 && r < dst.rows, "ep_unpack_rows_ref: wire row {} scatters to row {}, outside [0, {})", i, r,
                 dst.rows);
    move_row(dst, r, const_cast<uint8_t*>(wire) + i * rb, false);
  }
  if (dst.format == EpRowFormat::fp8)
    for (int64_t b = 0; b < ep_detail::scales_per_row(dst.format, dst.d); ++b)
      for (int64_t r = dst.rows; r < fp8_row_scale_ld(dst.rows); ++r)
        static_cast<float*>(dst.scales)[fp8_row_scale_index(r, b, dst.rows)] = 1.0f;
}

void ep_fp8_rows_to_bf16_ref(const EpRows& src, bf16* dst) {
  ep_detail::check_fp8_to_bf16(src, dst);
  const auto* codes = static_cast<const uint8_t*>(src.codes);
  const auto* scales = static_cast<const float*>(src.scales);
  for (int64_t r = 0; r < src.rows; ++r)
    for (int64_t j = 0; j < src.d; ++j) {
      const float v = e4m3_to_f32(codes[r * src.d + j]) * scales[fp8_row_scale_index(r, j / kFp8Block, src.rows)];
      dst[r * src.d + j] = bf16_from_bits(v != v ? uint16_t{0x7FC0} : f32_to_bf16_bits(v));  // NaN: 0x7FC0
    }
}

}  // namespace fp4moe
