#include "kernels/gemm/grouped_gemm.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <string>
#include <vector>

#include "kernels/common/check.h"
#include "kernels/common/offsets.h"
#include "kernels/gemm/group_row_scales.h"
#include "kernels/gemm/grouped_gemm_heuristics.h"
#include "kernels/gemm/grouped_gemm_simt.h"
#include "kernels/gemm/grouped_gemm_sm90.h"
#include "kernels/gemm/grouped_wgrad_sm90.h"
#include "kernels/gemm/grouped_runs.h"
#include "kernels/quant/layouts.h"

namespace fp4moe {

namespace {

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

size_t out_elem_bytes(GemmOutType t) { return t == GemmOutType::fp32 ? 4 : 2; }
cudaDataType_t out_cuda_type(GemmOutType t) { return t == GemmOutType::fp32 ? CUDA_R_32F : CUDA_R_16BF; }

// Offsets of the scratch regions (16-byte aligned each): the packed scales, then one 4-row tail slot per stream.
struct ScratchLayout {
  size_t packed_scales = 0, tail_codes = 0, tail_scales = 0, tail_out = 0, slot_bytes = 0, total = 0;
  ScratchLayout(int64_t M, int64_t R, int64_t P, int64_t G, int64_t slots) {
    auto up16 = [](size_t b) { return (b + 15) / 16 * 16; };
    const int64_t nb = ceil_div(R, kFp8Block);
    packed_scales = 0;
    tail_codes = up16(sizeof(float) * static_cast<size_t>(packed_group_scales_capacity(M, R, G)));
    tail_scales = tail_codes + up16(static_cast<size_t>(4 * R));
    tail_out = tail_scales + up16(sizeof(float) * static_cast<size_t>(4 * nb));
    slot_bytes = tail_out + up16(sizeof(float) * static_cast<size_t>(4 * P)) - tail_codes;
    total = tail_codes + slot_bytes * static_cast<size_t>(slots);
  }
};

// Shared argument checks of every entry point; returns M (host_offsets[G], or, without a host copy, split.rows,
// which then must be >= 0 unless rows_optional).
int64_t check_common(const char* what, int64_t N, int64_t K, const GroupSplit& split, const GemmOutput& out,
                     bool wgrad, bool rows_optional = false) {
  FP4MOE_CHECK(N >= 16 && K >= 16 && N % 16 == 0 && K % 16 == 0,
               "{}: N and K must be positive multiples of 16 (FP8 tensor-core rows), got N={} K={}", what, N, K);
  FP4MOE_CHECK(split.G >= 1 && split.G <= 65535, "{}: expected 1 <= G <= 65535 groups, got G={}", what, split.G);
  FP4MOE_CHECK(split.offsets != nullptr, "{}: device group offsets are null", what);
  int64_t M = split.rows;
  if (split.host_offsets != nullptr) {
    M = split.host_offsets[split.G];
    validate_group_offsets(split.host_offsets, split.G, M, what);
  } else {
    FP4MOE_CHECK(rows_optional || (split.rows >= 0 && split.rows <= INT32_MAX),
                 "{}: a split without the host copy of its offsets must give its token count (rows in [0, 2^31)), "
                 "got rows={}",
                 what, split.rows);
  }
  FP4MOE_CHECK(out.data != nullptr && aligned16(out.data), "{}: output must be a non-null 16-byte aligned pointer, "
               "got {}", what, out.data);
  FP4MOE_CHECK(!out.accumulate || out.type == GemmOutType::fp32,
               "{}: accumulation needs an FP32 output (the master gradient), got a BF16 output", what);
  FP4MOE_CHECK(!out.accumulate || wgrad,
               "{}: accumulation is only offered for Wgrad (Fprop/Dgrad write their ragged tails in place)", what);
  return M;
}

// Whether the Hopper Fprop/Dgrad kernel takes a call apart from the automatic rule, for a split without its host
// copy (the CUDA-core kernels of grouped_gemm_simt.h take the others). P: output width, R: reduction dimension.
bool sm90_takes_rows(const GroupedGemmTuning& tuning, int64_t P, int64_t R, int64_t G, const GemmOutput& out) {
  return tuning.sm90 != Sm90Path::never && out.type == GemmOutType::bf16 && !out.accumulate &&
         grouped_gemm_sm90_unsupported(P, R, G).empty();
}

void check_ptr(const char* what, const char* name, const void* p) {
  FP4MOE_CHECK(p != nullptr && aligned16(p), "{}: {} must be a non-null 16-byte aligned device pointer, got {}", what,
               name, p);
}

// The pointers of an FP8 row operand times each expert's weights (Fprop, Dgrad).
void check_fp8_rows_ptrs(const char* what, Fp8RowOperand rows, const uint8_t* w_codes, const float* w_scales) {
  check_ptr(what, "row operand codes", rows.codes);
  check_ptr(what, "row operand scales", rows.scales);
  check_ptr(what, "weight codes", w_codes);
  check_ptr(what, "weight scales", w_scales);
}

// An FP8 row operand [M, R] times each expert's weights [P, R]^T on the CUDA-core kernel, from the device offsets.
void rows_simt_fp8(const char* what, Fp8RowOperand rows, const uint8_t* w_codes, const float* w_scales,
                   SimtWeightScales w_kind, int64_t M, int64_t P, int64_t R, const GroupSplit& split,
                   const GemmOutput& out, cudaStream_t stream) {
  check_fp8_rows_ptrs(what, rows, w_codes, w_scales);
  grouped_rows_simt(SimtRowsProblem{true, rows.codes, rows.scales, w_codes, w_scales, w_kind, false, M, P, R},
                    split.offsets, split.G, out, stream);
}

LtOutput lt_out(const GemmOutput& out, size_t byte_offset, int64_t ld) {
  LtOutput d;
  d.data = static_cast<char*>(out.data) + byte_offset;
  d.type = out_cuda_type(out.type);
  d.ld = ld;
  d.accumulate = out.accumulate;
  return d;
}

// Empty Wgrad groups: zero, or untouched when accumulating.
void zero_empty_wgrad(const GemmOutput& dw, int64_t g, int64_t N, int64_t K, cudaStream_t stream) {
  if (dw.accumulate) return;
  const size_t bytes = static_cast<size_t>(N * K) * out_elem_bytes(dw.type);
  CUDA_CHECK(cudaMemsetAsync(static_cast<char*>(dw.data) + static_cast<size_t>(g) * bytes, 0, bytes, stream));
}

// One stream's 4-row scratch (ScratchLayout): codes [4, R], scales [ceil(R/128), 4], output [4, P].
struct TailSlot {
  uint8_t* codes;
  float* scales;
  void* out;
};

TailSlot tail_slot(void* scratch, const ScratchLayout& sl, int slot) {
  char* base = static_cast<char*>(scratch) + static_cast<size_t>(slot) * sl.slot_bytes;
  return TailSlot{reinterpret_cast<uint8_t*>(base + sl.tail_codes), reinterpret_cast<float*>(base + sl.tail_scales),
                  base + sl.tail_out};
}

// Rows [first, first + count) (count 1..4) of the FP8 row operand [M, R] times one expert's block tensor [P, R]^T
// (`a`), through a zero-padded 4-row copy in `slot`, computed there and copied out to rows first.. of `out`.
void rows_through_slot(CublasLtMatmul& lt, const TailSlot& slot, Fp8RowOperand rows, const LtOperand& a, int64_t P,
                       int64_t R, int64_t M, int64_t first, int64_t count, const GemmOutput& out,
                       cudaStream_t stream) {
  const int64_t nb = ceil_div(R, kFp8Block);
  const size_t es = out_elem_bytes(out.type);
  CUDA_CHECK(cudaMemsetAsync(slot.codes, 0, static_cast<size_t>(4 * R), stream));
  CUDA_CHECK(cudaMemcpyAsync(slot.codes, rows.codes + first * R, static_cast<size_t>(count * R),
                             cudaMemcpyDeviceToDevice, stream));
  CUDA_CHECK(cudaMemsetAsync(slot.scales, 0, sizeof(float) * static_cast<size_t>(4 * nb), stream));
  CUDA_CHECK(cudaMemcpy2DAsync(slot.scales, 4 * sizeof(float), rows.scales + first,
                               sizeof(float) * static_cast<size_t>(fp8_row_scale_ld(M)),
                               sizeof(float) * static_cast<size_t>(count), static_cast<size_t>(nb),
                               cudaMemcpyDeviceToDevice, stream));
  LtOperand b{slot.codes, CUDA_R_8F_E4M3, false, R, slot.scales, LtScaleMode::vec128};
  GemmOutput scratch_out{slot.out, out.type, false};
  lt.matmul(P, 4, R, a, b, lt_out(scratch_out, 0, P), RaggedDim::none, stream);
  CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(out.data) + static_cast<size_t>(first * P) * es, slot.out,
                             static_cast<size_t>(count * P) * es, cudaMemcpyDeviceToDevice, stream));
}

}  // namespace

GroupedGemm::~GroupedGemm() {
  if (scratch_) cudaFree(scratch_);
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
  for (cudaStream_t st : side_streams_) cudaStreamDestroy(st);
}

size_t GroupedGemm::scratch_bytes(int64_t M, int64_t R, int64_t P, int64_t G, int streams) {
  return ScratchLayout(M, R, P, G, streams).total;
}

CublasLtMatmul& GroupedGemm::lt() {
  if (lt0_ == nullptr) {
    own_lt_ = std::make_unique<CublasLtMatmul>();
    lt0_ = own_lt_.get();
  }
  return *lt0_;
}

void GroupedGemm::ensure_scratch(size_t bytes) {
  if (bytes <= scratch_capacity_) return;
  if (scratch_) CUDA_CHECK(cudaFree(scratch_));  // synchronises: no queued work still uses the old buffer
  scratch_ = nullptr;
  scratch_capacity_ = 0;
  CUDA_CHECK(cudaMalloc(&scratch_, bytes));
  scratch_capacity_ = bytes;
}

void GroupedGemm::reserve(int64_t M, int64_t R, int64_t P, int64_t G) {
  FP4MOE_CHECK(M >= 0 && R > 0 && P > 0 && G >= 1, "GroupedGemm::reserve: bad bounds M={} R={} P={} G={}", M, R, P,
               G);
  reserved_[0] = M;
  reserved_[1] = R;
  reserved_[2] = P;
  reserved_[3] = G;
  ensure_scratch(scratch_bytes(M, R, P, G, tuning_.streams));
}

void GroupedGemm::set_tuning(const GroupedGemmTuning& tuning) {
  FP4MOE_CHECK(tuning.streams >= 1 && tuning.streams <= 8, "GroupedGemm::set_tuning: streams must be in [1, 8], got {}",
               tuning.streams);
  while (static_cast<int>(side_streams_.size()) < tuning.streams - 1) {
    auto lt = std::make_unique<CublasLtMatmul>();  // may throw: nothing half-added
    cudaStream_t st = nullptr;
    CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    side_lt_.push_back(std::move(lt));
    side_streams_.push_back(st);
  }
  while (static_cast<int>(events_.size()) < tuning.streams) {
    cudaEvent_t e = nullptr;
    CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    events_.push_back(e);
  }
  tuning_ = tuning;
  // A reserve() made for fewer streams: the tail slots of the new ones now, not inside a later call.
  if (reserved_[3] > 0)
    ensure_scratch(scratch_bytes(reserved_[0], reserved_[1], reserved_[2], reserved_[3], tuning.streams));
}

void GroupedGemm::fork(cudaStream_t caller, int runs) {
  if (runs <= 1) return;
  CUDA_CHECK(cudaEventRecord(events_[0], caller));
  for (int s = 1; s < runs; ++s) CUDA_CHECK(cudaStreamWaitEvent(stream_of(s, caller), events_[0], 0));
}

void GroupedGemm::join(cudaStream_t caller, int runs) {
  for (int s = 1; s < runs; ++s) {
    CUDA_CHECK(cudaEventRecord(events_[static_cast<size_t>(s)], stream_of(s, caller)));
    CUDA_CHECK(cudaStreamWaitEvent(caller, events_[static_cast<size_t>(s)], 0));
  }
}

void GroupedGemm::join_after_error(cudaStream_t caller, int runs) noexcept {
  for (int s = 1; s < runs; ++s)
    if (cudaEventRecord(events_[static_cast<size_t>(s)], stream_of(s, caller)) == cudaSuccess)
      (void)cudaStreamWaitEvent(caller, events_[static_cast<size_t>(s)], 0);
}

template <typename PerGroup>
void GroupedGemm::for_each_group(const GroupSplit& split, cudaStream_t caller, PerGroup&& per_group) {
  const std::vector<int64_t> runs = group_runs(split.host_offsets, split.G, tuning_.streams);
  fork(caller, tuning_.streams);
  try {
    for (int s = 0; s < tuning_.streams; ++s)
      for (int64_t g = runs[s]; g < runs[s + 1]; ++g)
        per_group(s, g, int64_t{split.host_offsets[g + 1]} - split.host_offsets[g], lt_of(s), stream_of(s, caller));
  } catch (...) {
    // The work already queued on the side streams still uses the caller's buffers: the caller's stream waits for
    // it before the error leaves, as it would have without one.
    join_after_error(caller, tuning_.streams);
    throw;
  }
  join(caller, tuning_.streams);
}

// ---- BF16 --------------------------------------------------------------------------------------------------------

void GroupedGemm::fprop_bf16(const bf16* x, const bf16* w, int64_t N, int64_t K, const GroupSplit& split,
                             GemmOutput y, cudaStream_t stream) {
  const char* what = "grouped fprop_bf16";
  const int64_t M = check_common(what, N, K, split, y, false);
  check_ptr(what, "x", x);
  check_ptr(what, "w", w);
  if (split.host_offsets == nullptr)
    return grouped_rows_simt(SimtRowsProblem{false, x, nullptr, w, nullptr, SimtWeightScales::none, false, M, N, K},
                             split.offsets, split.G, y, stream);
  for_each_group(split, stream, [&](int, int64_t g, int64_t Mg, CublasLtMatmul& lt, cudaStream_t st) {
    if (Mg == 0) return;
    const int64_t off = split.host_offsets[g];
    // Column-major: Y_g^T [N x M_g] = (W_g stored K x N)^T * (X_g stored K x M_g).
    LtOperand a{w + g * N * K, CUDA_R_16BF, true, K, nullptr, LtScaleMode::none};
    LtOperand b{x + off * K, CUDA_R_16BF, false, K, nullptr, LtScaleMode::none};
    lt.matmul(N, Mg, K, a, b, lt_out(y, static_cast<size_t>(off * N) * out_elem_bytes(y.type), N), RaggedDim::n, st);
  });
}

void GroupedGemm::dgrad_bf16(const bf16* dy, const bf16* w, int64_t N, int64_t K, const GroupSplit& split,
                             GemmOutput dx, cudaStream_t stream) {
  const char* what = "grouped dgrad_bf16";
  const int64_t M = check_common(what, N, K, split, dx, false);
  check_ptr(what, "dy", dy);
  check_ptr(what, "w", w);
  if (split.host_offsets == nullptr)  // dX_g = dY_g W_g: W_g [N, K] read as the transposed [K, N] weight
    return grouped_rows_simt(SimtRowsProblem{false, dy, nullptr, w, nullptr, SimtWeightScales::none, true, M, K, N},
                             split.offsets, split.G, dx, stream);
  for_each_group(split, stream, [&](int, int64_t g, int64_t Mg, CublasLtMatmul& lt, cudaStream_t st) {
    if (Mg == 0) return;
    const int64_t off = split.host_offsets[g];
    // Column-major: dX_g^T [K x M_g] = (W_g stored K x N) * (dY_g stored N x M_g).
    LtOperand a{w + g * N * K, CUDA_R_16BF, false, K, nullptr, LtScaleMode::none};
    LtOperand b{dy + off * N, CUDA_R_16BF, false, N, nullptr, LtScaleMode::none};
    lt.matmul(K, Mg, N, a, b, lt_out(dx, static_cast<size_t>(off * K) * out_elem_bytes(dx.type), K), RaggedDim::n,
              st);
  });
}

void GroupedGemm::wgrad_bf16(const bf16* dy, const bf16* x, int64_t N, int64_t K, const GroupSplit& split,
                             GemmOutput dw, cudaStream_t stream) {
  const char* what = "grouped wgrad_bf16";
  const int64_t M = check_common(what, N, K, split, dw, true);
  check_ptr(what, "dy", dy);
  check_ptr(what, "x", x);
  if (split.host_offsets == nullptr)
    return grouped_wgrad_simt(SimtWgradProblem{false, dy, nullptr, x, nullptr, M, N, K, 0}, split.offsets, split.G,
                              dw, stream);
  for_each_group(split, stream, [&](int, int64_t g, int64_t Mg, CublasLtMatmul& lt, cudaStream_t st) {
    if (Mg == 0) return zero_empty_wgrad(dw, g, N, K, st);
    const int64_t off = split.host_offsets[g];
    // Column-major: dW_g^T [K x N] = (X_g stored K x M_g) * (dY_g stored N x M_g)^T.
    LtOperand a{x + off * K, CUDA_R_16BF, false, K, nullptr, LtScaleMode::none};
    LtOperand b{dy + off * N, CUDA_R_16BF, true, N, nullptr, LtScaleMode::none};
    lt.matmul(K, N, Mg, a, b, lt_out(dw, static_cast<size_t>(g * N * K) * out_elem_bytes(dw.type), K), RaggedDim::k,
              st);
  });
}

// ---- FP8 ---------------------------------------------------------------------------------------------------------

void GroupedGemm::row_times_weights_fp8(const char* what, Fp8RowOperand rows, const uint8_t* w_codes,
                                        const float* w_scales, bool w_rows, int64_t P, int64_t R,
                                        const GroupSplit& split, GemmOutput out, cudaStream_t stream) {
  const int64_t M = split.host_offsets[split.G];
  check_fp8_rows_ptrs(what, rows, w_codes, w_scales);
  if (M == 0) return;

  int64_t max_rows = 0;
  for (int64_t g = 0; g < split.G; ++g)
    max_rows = std::max<int64_t>(max_rows, split.host_offsets[g + 1] - split.host_offsets[g]);
  const int S = tuning_.streams;
  const ScratchLayout sl(M, R, P, split.G, S);
  ensure_scratch(sl.total);
  float* packed = reinterpret_cast<float*>(static_cast<char*>(scratch_) + sl.packed_scales);

  pack_group_row_scales(rows.scales, M, R, split.offsets, split.G, max_rows, packed, stream);

  const int64_t nb = ceil_div(R, kFp8Block);
  // Scales per expert: a 128x128 block tensor's, or a 1x128 row tensor's [ceil(R/128), round_up(P, 4)].
  const int64_t w_scale_count = w_rows ? fp8_row_scale_count(P, R) : fp8_block_scale_count(P, R);
  const size_t es = out_elem_bytes(out.type);
  auto weights = [&](int64_t g) {
    // Column-major: out_g^T [P x n] = (weight codes stored R x P)^T * (row codes stored R x n).
    return LtOperand{w_codes + g * P * R, CUDA_R_8F_E4M3, true, R, w_scales + g * w_scale_count,
                     w_rows ? LtScaleMode::vec128 : LtScaleMode::blk128x128};
  };
  std::vector<int64_t> packed_first(static_cast<size_t>(split.G) + 1, 0);  // sum of group_main_rows before g
  for (int64_t g = 0; g < split.G; ++g) {
    const int64_t off = split.host_offsets[g];
    packed_first[g + 1] = packed_first[g] + group_main_rows(off, split.host_offsets[g + 1] - off, M);
  }
  for_each_group(split, stream, [&](int s, int64_t g, int64_t Mg, CublasLtMatmul& lt, cudaStream_t st) {
    if (Mg == 0) return;
    const int64_t off = split.host_offsets[g], n_main = group_main_rows(off, Mg, M);
    if (n_main > 0) {
      LtOperand b{rows.codes + off * R, CUDA_R_8F_E4M3, false, R, packed + nb * packed_first[g], LtScaleMode::vec128};
      lt.matmul(P, n_main, R, weights(g), b, lt_out(out, static_cast<size_t>(off * P) * es, P), RaggedDim::n, st);
    }
    // The last 1..3 rows at the end of the tensor: through this stream's 4-row scratch.
    if (Mg > n_main)
      rows_through_slot(lt, tail_slot(scratch_, sl, s), rows, weights(g), P, R, M, off + n_main, Mg - n_main, out, st);
  });
  // Rows a run wrote past its last group belong to a later run, which may have written them first: their own
  // groups compute them again (grouped_runs.h).
  if (S > 1)
    for (const GroupRows& r :
         rows_to_recompute(split.host_offsets, split.G, group_runs(split.host_offsets, split.G, S))) {
      rows_through_slot(lt(), tail_slot(scratch_, sl, 0), rows, weights(r.group), P, R, M, r.first, r.count, out,
                        stream);
      rows_recomputed_ += r.count;
    }
}

bool GroupedGemm::runs_sm90(int64_t M, int64_t P, int64_t R, int64_t G, const GemmOutput& out) const {
  return sm90_takes_rows(tuning_, P, R, G, out) &&
         (tuning_.sm90 != Sm90Path::automatic || grouped_gemm_prefers_sm90(M, G));
}

std::string wgrad_token_pad_problem(int64_t token_pad) {
  if (token_pad == kColAlign || token_pad == kMxBlock) return {};
  return fmt::format("token_pad must be {} (FP8 column tensor) or {} (converted MXFP4 column tensor), got {}",
                     kColAlign, kMxBlock, token_pad);
}

bool GroupedGemm::runs_sm90_wgrad(int64_t N, int64_t K, int64_t G, int64_t token_pad) const {
  if (tuning_.sm90 == Sm90Path::never) return false;
  if (tuning_.sm90 == Sm90Path::automatic && !grouped_wgrad_prefers_sm90(N, K, G)) return false;
  return grouped_wgrad_sm90_unsupported(N, K, G, token_pad).empty();
}

void GroupedGemm::fprop_fp8(Fp8RowOperand x, Fp8BlockStack w, int64_t N, int64_t K, const GroupSplit& split,
                            GemmOutput y, cudaStream_t stream) {
  const char* what = "grouped fprop_fp8";
  const int64_t M = check_common(what, N, K, split, y, false);
  if (split.host_offsets == nullptr && !sm90_takes_rows(tuning_, N, K, split.G, y))
    return rows_simt_fp8(what, x, w.codes, w.scales, SimtWeightScales::block128, M, N, K, split, y, stream);
  if (split.host_offsets != nullptr && !runs_sm90(M, N, K, split.G, y))
    return row_times_weights_fp8(what, x, w.codes, w.scales, false, N, K, split, y, stream);
  grouped_fprop_fp8_sm90(x, w, M, N, K, split.offsets, split.G, static_cast<bf16*>(y.data), stream);
}

void GroupedGemm::fprop_fp8_row_weights(Fp8RowOperand x, Fp8RowStack w, int64_t N, int64_t K,
                                        const GroupSplit& split, GemmOutput y, cudaStream_t stream) {
  const char* what = "grouped fprop_fp8 (1x128 weights)";
  const int64_t M = check_common(what, N, K, split, y, false);
  if (split.host_offsets == nullptr)
    return rows_simt_fp8(what, x, w.codes, w.scales, SimtWeightScales::row128, M, N, K, split, y, stream);
  row_times_weights_fp8(what, x, w.codes, w.scales, true, N, K, split, y, stream);
}

void GroupedGemm::dgrad_fp8(Fp8RowOperand dy, Fp8BlockStack w_t, int64_t N, int64_t K, const GroupSplit& split,
                            GemmOutput dx, cudaStream_t stream) {
  const char* what = "grouped dgrad_fp8";
  const int64_t M = check_common(what, N, K, split, dx, false);
  if (split.host_offsets == nullptr && !sm90_takes_rows(tuning_, K, N, split.G, dx))
    return rows_simt_fp8(what, dy, w_t.codes, w_t.scales, SimtWeightScales::block128, M, K, N, split, dx, stream);
  if (split.host_offsets != nullptr && !runs_sm90(M, K, N, split.G, dx))
    return row_times_weights_fp8(what, dy, w_t.codes, w_t.scales, false, K, N, split, dx, stream);
  grouped_dgrad_fp8_sm90(dy, w_t, M, N, K, split.offsets, split.G, static_cast<bf16*>(dx.data), stream);
}

void GroupedGemm::dgrad_fp8_row_weights(Fp8RowOperand dy, Fp8RowStack w_t, int64_t N, int64_t K,
                                        const GroupSplit& split, GemmOutput dx, cudaStream_t stream) {
  const char* what = "grouped dgrad_fp8 (1x128 weights)";
  const int64_t M = check_common(what, N, K, split, dx, false);
  if (split.host_offsets == nullptr)
    return rows_simt_fp8(what, dy, w_t.codes, w_t.scales, SimtWeightScales::row128, M, K, N, split, dx, stream);
  row_times_weights_fp8(what, dy, w_t.codes, w_t.scales, true, K, N, split, dx, stream);
}

void GroupedGemm::wgrad_fp8(Fp8ColOperand dy, Fp8ColOperand x, int64_t N, int64_t K, const GroupSplit& split,
                            GemmOutput dw, cudaStream_t stream, int64_t token_pad) {
  const char* what = "grouped wgrad_fp8";
  const bool sm90_takes = tuning_.sm90 != Sm90Path::never &&
                          grouped_wgrad_sm90_unsupported(N, K, split.G, token_pad).empty();
  if (split.host_offsets == nullptr ? sm90_takes : runs_sm90_wgrad(N, K, split.G, token_pad)) {
    // One launch from the device offsets. With a host copy, the split is validated as on every path and its M
    // bounds the kernel's reads; without one (a caller with no host synchronisation), split.rows, or the kernel's
    // largest token bound where rows < 0, and the split must be valid. The kernel checks the other arguments.
    const int64_t M = check_common(what, N, K, split, dw, true, /*rows_optional=*/true);
    grouped_wgrad_fp8_sm90(dy, x, M >= 0 ? M : kWgradSm90MaxTokens, N, K, split.offsets, split.G, dw, stream,
                           token_pad);
    return;
  }
  const int64_t M = check_common(what, N, K, split, dw, true);
  const std::string pad_problem = wgrad_token_pad_problem(token_pad);
  FP4MOE_CHECK(pad_problem.empty(), "{}: {}", what, pad_problem);
  check_ptr(what, "dy codes", dy.codes);
  check_ptr(what, "dy scales", dy.scales);
  check_ptr(what, "x codes", x.codes);
  check_ptr(what, "x scales", x.scales);
  if (split.host_offsets == nullptr)  // the CUDA-core kernel from the device offsets (any shape)
    return grouped_wgrad_simt(SimtWgradProblem{true, dy.codes, dy.scales, x.codes, x.scales, M, N, K, token_pad},
                              split.offsets, split.G, dw, stream);
  const auto padded = [&](int64_t Mg) { return ceil_div(Mg, token_pad) * token_pad; };
  const size_t es = out_elem_bytes(dw.type);
  std::vector<int64_t> P(static_cast<size_t>(split.G) + 1, 0), Q(P);  // padded tokens, 128-token blocks before g
  for (int64_t g = 0; g < split.G; ++g) {
    const int64_t Mg = split.host_offsets[g + 1] - split.host_offsets[g];
    P[g + 1] = P[g] + padded(Mg);
    Q[g + 1] = Q[g] + ceil_div(Mg, kFp8Block);
  }
  for_each_group(split, stream, [&](int, int64_t g, int64_t Mg, CublasLtMatmul& lt, cudaStream_t st) {
    if (Mg == 0) return zero_empty_wgrad(dw, g, N, K, st);
    const int64_t L = padded(Mg);
    // Column-major: dW_g^T [K x N] = (X_g^T stored L x K)^T * (dY_g^T stored L x N); k = L (zero tail).
    LtOperand a{x.codes + K * P[g], CUDA_R_8F_E4M3, true, L, x.scales + K * Q[g], LtScaleMode::vec128};
    LtOperand b{dy.codes + N * P[g], CUDA_R_8F_E4M3, false, L, dy.scales + N * Q[g], LtScaleMode::vec128};
    lt.matmul(K, N, L, a, b, lt_out(dw, static_cast<size_t>(g * N * K) * es, K), RaggedDim::k, st);
  });
}

}  // namespace fp4moe
