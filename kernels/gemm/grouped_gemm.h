// Grouped GEMMs of the MoE experts (Group Linear) over ragged token groups: cuBLASLt per expert, our Hopper kernels
// (grouped_gemm_sm90.h, grouped_wgrad_sm90.h), and CUDA-core kernels for splits without a host copy
// (grouped_gemm_simt.h).
//
// Per expert g with M_g = offsets[g+1] - offsets[g] routed tokens (rows offsets[g] .. offsets[g+1]-1):
//   Fprop  Y_g  = X_g  W_g^T    X [M, K], W [G, N, K], Y  [M, N]
//   Dgrad  dX_g = dY_g W_g      dY [M, N], W [G, N, K], dX [M, K]
//   Wgrad  dW_g = dY_g^T X_g    dY [M, N], X [M, K],    dW [G, N, K]   (M_g = 0 gives dW_g = 0)
// All row-major, FP32 accumulation. Outputs BF16, or FP32, where Wgrad may also accumulate into an FP32 master
// gradient (dW_g += ...; an empty group then leaves dW_g unchanged).
//
// Precisions (DESIGN.md "Recipes"; DeepSeek-V3's fine-grained FP8 scheme, TransformerEngine Float8BlockScaling):
//   bf16: BF16 operands as they are.
//   fp8:  E4M3 operands with FP32 scales in the layouts of kernels/quant/layouts.h:
//         Fprop: X as an FP8 1x128 row tensor, W as G stacked FP8 128x128 block tensors [N, K]
//                (cuBLASLt VEC128_32F x BLK128x128_32F);
//         Dgrad: dY as an FP8 1x128 row tensor [M, N], W^T as G stacked 128x128 block tensors [K, N]
//                (bf16_to_fp8_block128 with transpose = true);
//         Wgrad: dY and X as FP8 column tensors over the same split (1x128 blocks along tokens, each group
//                zero-padded to a multiple of 16 tokens; VEC128_32F x VEC128_32F).
//         Stacked block tensors: expert g's codes at g * rows * cols bytes, its scales at
//         g * fp8_block_scale_count(rows, cols) floats.
//
// Routing counts on the host: each entry point takes the device offsets and ONE host copy of the same offsets
// (GroupSplit; every entry point also takes a split without it, "Without a host copy" below). The caller fetches that
// copy once per MoE layer and step, where the token counts per expert become known (after the dispatch's count
// exchange, before the expert GEMMs), and passes the same copy to the Fprop, Dgrad and Wgrad of all the layer's expert
// GEMMs. The GEMMs themselves never synchronise: one cuBLASLt call per non-empty expert (plus at most three small 4-row
// calls for the ragged tails at the end of the tensor, and with several streams the recomputed rows below), launched
// back to back.
//
// Hopper path: fprop_fp8 and dgrad_fp8 into a BF16 output run as one launch of our kernel (grouped_gemm_sm90.h,
// which reads the device offsets) instead of the per-expert calls where tuning().sm90 and the rule of
// grouped_gemm_heuristics.h choose it and the kernel takes the shape (N, K multiples of 128, compute capability 9.0).
// wgrad_fp8 (any output: BF16, FP32, FP32 accumulated) runs as one launch of the Hopper Wgrad kernel
// (grouped_wgrad_sm90.h: tokens grouped by expert, offsets read on the device) where tuning().sm90 is always and
// the kernel takes the problem (N, K multiples of 128, G <= 1024, compute capability 9.0). automatic keeps cuBLASLt
// for Wgrad: the kernel runs at about half of cuBLASLt's rate (grouped_gemm_heuristics.h grouped_wgrad_prefers_sm90).
//
// Without a host copy (a caller with no host synchronisation, e.g. a step captured in a CUDA graph): a split whose
// host_offsets is null, with its token count in `rows`, is taken by every entry point. fprop_fp8 and dgrad_fp8 (into
// a BF16 output without accumulation) and wgrad_fp8 run the Hopper kernels whenever tuning().sm90 is not never and
// the kernel takes the problem (whatever the automatic rule prefers: cuBLASLt needs the counts on the host); every
// other call (BF16 operands, 1x128 weights, FP32 outputs, shapes or devices the Hopper kernels do not take,
// Sm90Path::never) runs the CUDA-core kernels of grouped_gemm_simt.h, which read the device offsets at any shape
// and are slow (plain FP32 tiles, for small problems and graph capture; G <= 2048, M <= 2^30). The device offsets
// must then be a valid split of `rows` tokens; the kernels never read or write past them either way (an invalid
// split writes nothing from a group it cannot place). The Hopper wgrad_fp8 path also takes rows < 0, its reads
// bounded by the kernel's largest token count. A given host copy is validated as everywhere.
//
// Shape rules: N % 16 == 0 and K % 16 == 0 (FP8 tensor cores read 16-byte rows; the quantizers impose the same);
// any M_g >= 0. All device pointers 16-byte aligned. Rejected with fp4moe::Error before anything is launched:
// bad shapes, null or misaligned pointers, host offsets that are not a valid split (kernels/common/offsets.h),
// accumulation into a BF16 output, and accumulation for Fprop/Dgrad (their ragged tails are computed in place).
//
// Ragged groups with FP8 (cuBLASLt refuses block-scaled GEMMs whose token count is not a multiple of 4):
// group g's GEMM covers round_up(M_g, 4) rows; the 1..3 extra rows belong to later groups, which are computed
// afterwards on the same stream and overwrite them. Where those rows would run past the end of the tensor, the
// last 1..3 rows are copied to a zero-padded 4-row scratch, computed there and copied out. Every output row is
// written exactly by its own group in the end; nothing past M is read or written.
//
// Streams (set_tuning, default 1): with S > 1 the groups are cut into S runs of consecutive groups, run s starting
// at the first group whose first token is at or past s * M / S (grouped_runs.h group_runs; a run may be empty);
// run 0 goes on the caller's stream, run s on a side stream of this object that waits for the caller's work
// queued so far, and the caller's stream waits for every run before the call returns (also when a call throws
// half-way), so callers see one stream as before. Concurrent runs fill each other's last partial wave of tiles.
// Any group of a run may write its 1..3 extra rows past the run's last group, into a later run that may already
// have written them: those rows (grouped_runs.h rows_to_recompute, at most 3 per run boundary) are computed again
// by their own groups through the 4-row scratch GEMM after the join, so every row ends with its own group's
// value. Each stream has its own cuBLASLt workspace (32 MiB) and tail scratch. Concurrent streams help when the
// groups are many and small (each GEMM alone leaves SMs idle) and not reliably with a few large ones, so the
// default stays 1 and callers with many small groups opt in (bench_grouped_gemm's `@s2`/`@s4` cases measure it;
// the runs are listed in reports/results/h200/README.md).
//
// Not thread-safe; one GroupedGemm per stream (it borrows the cuBLASLt object of that stream given at construction,
// or owns one with its workspace, and owns a scratch buffer that grows on demand with cudaMalloc, which synchronises
// the device: call reserve() once up front to avoid that).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/common/types.h"
#include "kernels/gemm/cublaslt_matmul.h"

namespace fp4moe {

// Ragged expert groups: int32 offsets [G+1], offsets[0] = 0, non-decreasing, offsets[G] = M (the routed tokens).
struct GroupSplit {
  const int32_t* offsets = nullptr;       // device [G+1]: read by kernels on the stream
  const int32_t* host_offsets = nullptr;  // host [G+1]: the same values, the layer's one host copy (or null)
  int64_t G = 0;
  int64_t rows = -1;  // M = offsets[G] when host_offsets is null ("Without a host copy" above); else unused
};

enum class GemmOutType { bf16, fp32 };

struct GemmOutput {
  void* data = nullptr;  // device, row-major, bf16 or fp32 as `type` says
  GemmOutType type = GemmOutType::bf16;
  bool accumulate = false;  // Wgrad with fp32 only: out += product
};

// FP8 1x128 row tensor (layouts.h): codes E4M3 [rows, cols] row-major, scales fp32 [ceil(cols/128), round_up(rows,4)].
struct Fp8RowOperand {
  const uint8_t* codes = nullptr;
  const float* scales = nullptr;
};

// FP8 column tensor over the split's groups (layouts.h "FP8 column tensor over ragged groups").
struct Fp8ColOperand {
  const uint8_t* codes = nullptr;
  const float* scales = nullptr;
};

// G stacked FP8 128x128 block tensors [rows, cols] (layouts.h), expert after expert.
struct Fp8BlockStack {
  const uint8_t* codes = nullptr;
  const float* scales = nullptr;
};

// G stacked FP8 1x128 row tensors [rows, cols] (layouts.h), expert after expert: codes [G, rows, cols], and each
// expert's own scales fp32 [ceil(cols/128), round_up(rows, 4)] one after the other (the MXFP4 -> FP8 conversion of
// an expert's MXFP4 weights, mxfp4_gemm.h: paper 2's MXFP4 Fprop and Dgrad of the routed experts).
struct Fp8RowStack {
  const uint8_t* codes = nullptr;
  const float* scales = nullptr;
};

// Throughput options of a GroupedGemm. Any of them gives the same bits run after run; with S > 1 streams the
// recomputed rows (a 4-row GEMM instead of their group's) may differ in the last bits from a one-stream run.
// FP8 Fprop/Dgrad with 128x128 block weights into a BF16 output (fprop_fp8, dgrad_fp8) through the Hopper kernel
// (grouped_gemm_sm90.h), and FP8 Wgrad (wgrad_fp8, any output) through grouped_wgrad_sm90.h, instead of one
// cuBLASLt call per expert: automatic = where grouped_gemm_heuristics.h prefers it (not for Wgrad: slower);
// always = wherever it takes the problem; never = cuBLASLt only (for a split without a host copy: the CUDA-core
// kernels, "Without a host copy"). It takes N and K multiples of 128 on a device of compute capability 9.0 (else
// cuBLASLt runs); its output is deterministic but may differ from cuBLASLt's in the last bits (another summation
// order inside a 128-block).
enum class Sm90Path { automatic, always, never };

struct GroupedGemmTuning {
  int streams = 1;  // 1..8 concurrent runs of groups (see "Streams" above)
  Sm90Path sm90 = Sm90Path::automatic;
};

// Empty when token_pad is a token padding wgrad_fp8 takes (16: an FP8 column tensor, layouts.h kColAlign; 32: the
// FP8 conversion of an MXFP4 column tensor, kMxBlock), else what was expected (one statement for both Wgrad paths).
std::string wgrad_token_pad_problem(int64_t token_pad);

class GroupedGemm {
 public:
  // Run 0's GEMMs (the caller's stream) through `lt`, not owned: it must outlive this object and, as every
  // CublasLtMatmul, serve one stream at a time (the model's one object for all its layers on the model's stream).
  // Null: this object makes its own on first need (its 32 MiB workspace is allocated then, not here).
  explicit GroupedGemm(CublasLtMatmul* lt = nullptr) : lt0_(lt) {}
  ~GroupedGemm();
  GroupedGemm(const GroupedGemm&) = delete;
  GroupedGemm& operator=(const GroupedGemm&) = delete;

  // BF16 operands. x [M, K], w [G, N, K], dy [M, N] (device, row-major, bf16).
  void fprop_bf16(const bf16* x, const bf16* w, int64_t N, int64_t K, const GroupSplit& split, GemmOutput y,
                  cudaStream_t stream);
  void dgrad_bf16(const bf16* dy, const bf16* w, int64_t N, int64_t K, const GroupSplit& split, GemmOutput dx,
                  cudaStream_t stream);
  void wgrad_bf16(const bf16* dy, const bf16* x, int64_t N, int64_t K, const GroupSplit& split, GemmOutput dw,
                  cudaStream_t stream);

  // FP8 operands (layouts above). fprop: x row [M, K], w stack of [N, K]. dgrad: dy row [M, N], w_t stack of
  // [K, N] (W^T). wgrad: dy column [M, N] and x column [M, K] over `split`, each group's tokens padded with zeros
  // to round_up(M_g, token_pad): 16 is the FP8 column tensor of layouts.h; 32 the FP8 conversion of an MXFP4
  // column tensor (mxfp4_gemm.h), whose scales are the same. Rejects token_pad other than 16 or 32.
  void fprop_fp8(Fp8RowOperand x, Fp8BlockStack w, int64_t N, int64_t K, const GroupSplit& split, GemmOutput y,
                 cudaStream_t stream);
  void dgrad_fp8(Fp8RowOperand dy, Fp8BlockStack w_t, int64_t N, int64_t K, const GroupSplit& split, GemmOutput dx,
                 cudaStream_t stream);
  void wgrad_fp8(Fp8ColOperand dy, Fp8ColOperand x, int64_t N, int64_t K, const GroupSplit& split, GemmOutput dw,
                 cudaStream_t stream, int64_t token_pad = 16);
  // The same Fprop and Dgrad with 1x128 weights (w: a stack of [N, K], w_t of [K, N]): VEC128 x VEC128 scales,
  // the product of two operands both quantized along the reduction dimension in 1x128 groups (an MXFP4 GEMM's
  // FP8 operands, mxfp4_gemm.h). Same shape rules, ragged tails and streams as above.
  void fprop_fp8_row_weights(Fp8RowOperand x, Fp8RowStack w, int64_t N, int64_t K, const GroupSplit& split,
                             GemmOutput y, cudaStream_t stream);
  void dgrad_fp8_row_weights(Fp8RowOperand dy, Fp8RowStack w_t, int64_t N, int64_t K, const GroupSplit& split,
                             GemmOutput dx, cudaStream_t stream);

  // Grows the scratch for FP8 Fprop/Dgrad up to M tokens, reduction dimension R (K for Fprop, N for Dgrad),
  // output width P (N for Fprop, K for Dgrad) and G groups, so that later calls within those bounds allocate
  // nothing. Bytes held: scratch_bytes(M, R, P, G, tuning().streams); a later set_tuning with more streams grows
  // it to the same bounds at once.
  void reserve(int64_t M, int64_t R, int64_t P, int64_t G);
  static size_t scratch_bytes(int64_t M, int64_t R, int64_t P, int64_t G, int streams = 1);

  // The cuBLASLt object of the caller's stream (run 0): the one given at construction, else this object's own,
  // made on first need.
  CublasLtMatmul& lt();

  // Rejects streams outside [1, 8]. Creates the side streams, their events and cuBLASLt objects here (never
  // during a call).
  void set_tuning(const GroupedGemmTuning& tuning);
  const GroupedGemmTuning& tuning() const { return tuning_; }
  // Rows recomputed after a join (see "Streams"), summed over calls (the GPU tests check it).
  int64_t rows_recomputed() const { return rows_recomputed_; }

 private:
  // Whether fprop_fp8 / dgrad_fp8 of M rows, output width P, reduction R over G groups into `out` run on the
  // Hopper kernel (tuning().sm90, the heuristic, the kernel's rules).
  bool runs_sm90(int64_t M, int64_t P, int64_t R, int64_t G, const GemmOutput& out) const;
  // Whether wgrad_fp8 of (N, K, G, token_pad) runs on the Hopper Wgrad kernel (tuning().sm90, the rule of
  // grouped_gemm_heuristics.h, the kernel's rules); reads no host offsets.
  bool runs_sm90_wgrad(int64_t N, int64_t K, int64_t G, int64_t token_pad) const;
  // FP8 row operand [M, R] times each expert's weight tensor [P, R]^T into out [M, P] (Fprop and Dgrad): the
  // experts' 128x128 block tensors (Fp8BlockStack) or 1x128 row tensors (Fp8RowStack).
  void row_times_weights_fp8(const char* what, Fp8RowOperand rows, const uint8_t* w_codes, const float* w_scales,
                             bool w_rows, int64_t P, int64_t R, const GroupSplit& split, GemmOutput out,
                             cudaStream_t stream);
  void ensure_scratch(size_t bytes);
  CublasLtMatmul& lt_of(int s) { return s == 0 ? lt() : *side_lt_[static_cast<size_t>(s - 1)]; }
  cudaStream_t stream_of(int s, cudaStream_t caller) const {
    return s == 0 ? caller : side_streams_[static_cast<size_t>(s - 1)];
  }
  void fork(cudaStream_t caller, int runs);
  void join(cudaStream_t caller, int runs);
  void join_after_error(cudaStream_t caller, int runs) noexcept;
  // Forks, calls per_group(s, g, M_g, lt, stream) for every group g in order, run s with its cuBLASLt object and
  // stream, and joins.
  template <typename PerGroup>
  void for_each_group(const GroupSplit& split, cudaStream_t caller, PerGroup&& per_group);

  CublasLtMatmul* lt0_ = nullptr;            // run 0's: the constructor's, else own_lt_
  std::unique_ptr<CublasLtMatmul> own_lt_;
  void* scratch_ = nullptr;
  size_t scratch_capacity_ = 0;
  GroupedGemmTuning tuning_;
  std::vector<std::unique_ptr<CublasLtMatmul>> side_lt_;
  std::vector<cudaStream_t> side_streams_;
  std::vector<cudaEvent_t> events_;  // [0]: fork; [s]: end of run s
  int64_t rows_recomputed_ = 0;
  int64_t reserved_[4] = {0, 0, 0, 0};  // the last reserve()'s M, R, P, G (G = 0: none)
};

}  // namespace fp4moe
