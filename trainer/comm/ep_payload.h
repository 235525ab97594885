// Rows of the expert-parallel exchanges (DESIGN.md "Expert parallelism"): the row formats that travel, their wire
// layout, and the pack / unpack kernels that move rows between a tensor in its storage layout and a wire buffer.
// The payload is moved, never recomputed: a row packed and unpacked again has the same bits.
//
// Row formats (storage layouts of kernels/common/layouts.h), one row = one routed (token, expert) pair, hidden d:
//   bf16  codes [rows, d] BF16                                              wire 2 d bytes
//   fp8   codes [rows, d] E4M3, scales FP32 [ceil(d/128), round_up(rows, 4)] (1x128 row blocks, block-major)
//                                                                           wire d + 4 ceil(d/128) bytes
//   mxfp4 codes [rows, d/2] packed E2M1, scales [rows, d/32] UE8M0 (OCP MX v1.0; d % 32 == 0)
//                                                                           wire d/2 + d/32 bytes
// The wire row bytes are expert_parallel_row_bytes' (trainer/memory/estimate.h), which ep_wire_row_bytes returns.
// A wire row is the row's code bytes, then its scales in block order (each scale's bytes as stored), rows
// back to back with no padding; a wire buffer of n rows holds n * ep_wire_row_bytes bytes.
//
// Which format travels where (recipe = the routed experts' recipe, trainer/model/recipe.h):
//   forward dispatch    the recipe's storage format (ep_dispatch_format): bf16, fp8 or mxfp4
//   forward combine     bf16 (expert outputs, summed at the token's rank with the top-k weights)
//   backward dispatch   the gradient feeding the experts' fc2 Dgrad / Wgrad: fp8 for the fp8 and mxfp4 recipes, bf16
//                       for bf16 (ep_backward_dispatch_format)
//   backward combine    bf16: the experts' input gradient, summed over the token's k slots at its rank (FP32 sum
//                       of BF16 rows, kernels/nn/permute.h permute_backward), as on one GPU
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/types.h"
#include "kernels/quant/layouts.h"
#include "trainer/model/recipe.h"

namespace fp4moe {

enum class EpRowFormat { bf16, fp8, mxfp4 };
const char* ep_row_format_name(EpRowFormat f);

// The forward dispatch format of a preset recipe (bf16 -> bf16, fp8 -> fp8, mxfp4 -> mxfp4), and the backward
// dispatch format (bf16 -> bf16, fp8 and mxfp4 -> fp8). Reject (fp4moe::Error) a recipe that is not a preset.
EpRowFormat ep_dispatch_format(const Recipe& routed);
EpRowFormat ep_backward_dispatch_format(const Recipe& routed);

// Bytes of one wire row of `f` at hidden d (expert_parallel_row_bytes of the recipe whose dispatch format is f).
// Rejects d < 1, and d % 32 != 0 for mxfp4.
int64_t ep_wire_row_bytes(EpRowFormat f, int64_t d);

// A row tensor [rows, d] in format f's storage layout (above). codes: BF16, E4M3 or packed E2M1 bytes; scales:
// null for bf16, FP32 for fp8, UE8M0 bytes for mxfp4. Device or host memory as the function says.
struct EpRows {
  EpRowFormat format = EpRowFormat::bf16;
  int64_t rows = 0, d = 0;
  void* codes = nullptr;
  void* scales = nullptr;
};
// Bytes of codes and of scales an EpRows of `rows` rows holds (fp8: the padded scale tensor, round_up(rows, 4) per
// block). Rejects what ep_wire_row_bytes rejects and rows < 0.
int64_t ep_rows_code_bytes(EpRowFormat f, int64_t rows, int64_t d);
int64_t ep_rows_scale_bytes(EpRowFormat f, int64_t rows, int64_t d);

// Pack: wire row i (0 <= i < n) = row src_row(i) of src, with src_row(i) = gather[i] / divisor, or i when gather
// is null. The forward dispatch gathers token rows (gather = the permutation's assignment_of, divisor = top-k: row i
// of the expert-sorted order is token assignment_of[i] / k, kernels/nn/permute.h); a combine gathers grouped rows
// (divisor 1). Every src_row(i) must lie in [0, src.rows) (the CPU reference checks, the device does not).
// Unpack: row dst_row(i) of dst = wire row i, with dst_row(i) = scatter[i] or i; dst_row must be one-to-one into
// [0, dst.rows). fp8: unpack also writes 1.0 into dst's padding scales (rows dst.rows .. round_up(dst.rows, 4)).
// Both reject (fp4moe::Error, before any launch): n < 0, n > 0 with null wire or src/dst codes (or scales for fp8,
// mxfp4), d < 1 or d not a multiple of 32 for mxfp4, n > 0 with src.rows < 1 (pack), dst.rows < n (unpack), divisor
// < 1, n beyond int32. Device versions (ep_payload.cu): device pointers, asynchronous on `stream`, n = 0 launches
// nothing (unpack still writes fp8 padding scales when dst.rows > 0).
void ep_pack_rows(const EpRows& src, const int32_t* gather, int64_t divisor, int64_t n, uint8_t* wire,
                  cudaStream_t stream);
void ep_unpack_rows(const uint8_t* wire, int64_t n, const int32_t* scatter, const EpRows& dst, cudaStream_t stream);
// CPU references (ep_payload_ref.cpp), host pointers, same rules.
void ep_pack_rows_ref(const EpRows& src, const int32_t* gather, int64_t divisor, int64_t n, uint8_t* wire);
void ep_unpack_rows_ref(const uint8_t* wire, int64_t n, const int32_t* scatter, const EpRows& dst);

// FP8 rows back to BF16, for a receiver whose Group Linear takes BF16 rows and quantizes them itself (the fp8 recipe's
// forward dispatch, the backward dispatch of the fp8 and mxfp4 recipes): dst [rows, d] BF16, element j of row r =
// e4m3(code) * the scale of its 1x128 block, rounded to BF16 (RNE: exact for the power-of-two scales of the layers'
// default scale mode, so a second bf16_to_fp8_row of dst gives the same values). Rejects (fp4moe::Error, before any
// launch) a format other than fp8, rows < 0, d < 1, and null codes, scales or dst where rows exist. Device:
// asynchronous on `stream`, rows = 0 launches nothing. The reference: host pointers, same rules.
void ep_fp8_rows_to_bf16(const EpRows& src, bf16* dst, cudaStream_t stream);
void ep_fp8_rows_to_bf16_ref(const EpRows& src, bf16* dst);

namespace ep_detail {
// The argument checks of pack and unpack (above), shared by the device versions and the references.
void check_pack(const EpRows& src, const int32_t* gather, int64_t divisor, int64_t n, const uint8_t* wire);
void check_unpack(const uint8_t* wire, int64_t n, const EpRows& dst);
void check_fp8_to_bf16(const EpRows& src, const bf16* dst);
// Code bytes of one row; scales per row; bytes per scale; byte offset of scale `block` of row r in the scale tensor
// of `rows` rows (no checks: callers validate first).
FP4MOE_HD int64_t row_code_bytes(EpRowFormat f, int64_t d) {
  return f == EpRowFormat::bf16 ? 2 * d : f == EpRowFormat::fp8 ? d : d / 2;
}
FP4MOE_HD int64_t scales_per_row(EpRowFormat f, int64_t d) {
  return f == EpRowFormat::bf16 ? 0 : f == EpRowFormat::fp8 ? (d + kFp8Block - 1) / kFp8Block : d / kMxBlock;
}
FP4MOE_HD int64_t scale_size(EpRowFormat f) { return f == EpRowFormat::fp8 ? 4 : 1; }
FP4MOE_HD int64_t scale_offset(EpRowFormat f, int64_t r, int64_t block, int64_t rows, int64_t d) {
  return f == EpRowFormat::fp8 ? 4 * fp8_row_scale_index(r, block, rows) : r * (d / kMxBlock) + block;
}
}  // namespace ep_detail

}  // namespace fp4moe
