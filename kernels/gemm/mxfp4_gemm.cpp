// MXFP4 x MXFP4 GEMMs on FP8 tensor cores (mxfp4_gemm.h): the direct conversion into the workspace, then cuBLASLt.
#include "kernels/gemm/mxfp4_gemm.h"

#include <vector>

#include "kernels/common/check.h"
#include "kernels/common/offsets.h"
#include "kernels/quant/layouts.h"
#include "kernels/quant/mxfp4_row_to_fp8_row.h"

namespace fp4moe {

namespace {

bool aligned(const void* p, uintptr_t a) { return p != nullptr && (reinterpret_cast<uintptr_t>(p) & (a - 1)) == 0; }
size_t up256(size_t b) { return (b + 255) / 256 * 256; }

// Parts of a workspace holding two FP8 operands: codes of the first and second, then their scales.
struct TwoOperandWorkspace {
  size_t codes2 = 0, scales1 = 0, scales2 = 0, total = 0;
  TwoOperandWorkspace(int64_t codes1_bytes, int64_t codes2_bytes, int64_t scales1_count, int64_t scales2_count) {
    codes2 = up256(static_cast<size_t>(codes1_bytes));
    scales1 = codes2 + up256(static_cast<size_t>(codes2_bytes));
    scales2 = scales1 + up256(sizeof(float) * static_cast<size_t>(scales1_count));
    total = scales2 + up256(sizeof(float) * static_cast<size_t>(scales2_count));
  }
};

// Pointers to the parts of a TwoOperandWorkspace at `workspace`.
struct WorkspaceParts {
  uint8_t* codes1;
  float* scales1;
  uint8_t* codes2;
  float* scales2;
};
WorkspaceParts parts_of(void* workspace, const TwoOperandWorkspace& ws) {
  auto* base = static_cast<char*>(workspace);
  return {reinterpret_cast<uint8_t*>(base), reinterpret_cast<float*>(base + ws.scales1),
          reinterpret_cast<uint8_t*>(base + ws.codes2), reinterpret_cast<float*>(base + ws.scales2)};
}

TwoOperandWorkspace dense_workspace(int64_t M, int64_t N, int64_t K) {
  return TwoOperandWorkspace(M * K, N * K, fp8_row_scale_count(M, K), fp8_row_scale_count(N, K));
}

TwoOperandWorkspace wgrad_workspace(int64_t M, int64_t N, int64_t K, int64_t G) {
  const int64_t tokens = M + (kMxBlock - 1) * G, blocks = ceil_div(M, int64_t{kFp8Block}) + G;
  return TwoOperandWorkspace(N * tokens, K * tokens, N * blocks, K * blocks);
}

void check_dense(const char* what, int64_t M, int64_t N, int64_t K, int64_t k_multiple, const GemmOutput& y) {
  FP4MOE_CHECK(M > 0 && M % 4 == 0 && N > 0 && N % 16 == 0 && K > 0 && K % k_multiple == 0,
               "{}: expected M a positive multiple of 4, N of 16 and K of {}, got [M, N, K] = [{}, {}, {}]", what,
               k_multiple, M, N, K);
  FP4MOE_CHECK(aligned(y.data, 16), "{}: output must be a non-null 16-byte aligned pointer, got {}", what, y.data);
  FP4MOE_CHECK(!y.accumulate || y.type == GemmOutType::fp32,
               "{}: accumulation needs an FP32 output, got a BF16 output", what);
}

void check_workspace(const char* what, const void* workspace, size_t bytes, size_t needed) {
  FP4MOE_CHECK(aligned(workspace, 256), "{}: workspace must be a non-null 256-byte aligned pointer, got {}", what,
               workspace);
  FP4MOE_CHECK(bytes >= needed, "{}: workspace of {} bytes is too small, {} bytes needed", what, bytes, needed);
}

void check_mx_operand(const char* what, const char* name, const uint8_t* codes, const uint8_t* scales) {
  FP4MOE_CHECK(aligned(codes, 16) && scales != nullptr,
               "{}: {} needs non-null codes (16-byte aligned) and scales, got codes {} scales {}", what, name,
               static_cast<const void*>(codes), static_cast<const void*>(scales));
}

}  // namespace

size_t mxfp4_gemm_workspace_bytes(int64_t M, int64_t N, int64_t K) { return dense_workspace(M, N, K).total; }

Fp8RowPair mxfp4_gemm_fp8_operands(void* workspace, int64_t M, int64_t N, int64_t K) {
  const WorkspaceParts w = parts_of(workspace, dense_workspace(M, N, K));
  return {Fp8RowOperand{w.codes1, w.scales1}, Fp8RowOperand{w.codes2, w.scales2}};
}

Fp8ColPair mxfp4_wgrad_fp8_operands(void* workspace, int64_t M, int64_t N, int64_t K, int64_t G) {
  const WorkspaceParts w = parts_of(workspace, wgrad_workspace(M, N, K, G));
  return {Fp8ColOperand{w.codes1, w.scales1}, Fp8ColOperand{w.codes2, w.scales2}};
}

void fp8_row_gemm(CublasLtMatmul& lt, Fp8RowOperand a, Fp8RowOperand b, int64_t M, int64_t N, int64_t K,
                  GemmOutput y, cudaStream_t stream) {
  const char* what = "fp8_row_gemm";
  check_dense(what, M, N, K, 16, y);
  FP4MOE_CHECK(aligned(a.codes, 16) && aligned(b.codes, 16) && aligned(a.scales, 4) && aligned(b.scales, 4),
               "{}: operand codes must be non-null and 16-byte aligned, scales non-null and 4-byte aligned", what);
  // Column-major: Y^T [N x M] = (B stored K x N)^T * (A stored K x M); M % 4 == 0 and N % 4 == 0 make the scale
  // leading dimensions round_up(rows, 4) the exact outer sizes cuBLASLt's VEC128 mode reads.
  const LtOperand lt_a{b.codes, CUDA_R_8F_E4M3, true, K, b.scales, LtScaleMode::vec128};
  const LtOperand lt_b{a.codes, CUDA_R_8F_E4M3, false, K, a.scales, LtScaleMode::vec128};
  LtOutput d;
  d.data = y.data;
  d.type = y.type == GemmOutType::fp32 ? CUDA_R_32F : CUDA_R_16BF;
  d.ld = N;
  d.accumulate = y.accumulate;
  lt.matmul(N, M, K, lt_a, lt_b, d, RaggedDim::none, stream);
}

void mxfp4_gemm(CublasLtMatmul& lt, Mxfp4RowOperand a, Mxfp4RowOperand b, int64_t M, int64_t N, int64_t K,
                void* workspace, size_t workspace_bytes, GemmOutput y, cudaStream_t stream) {
  const char* what = "mxfp4_gemm";
  check_dense(what, M, N, K, kMxBlock, y);
  check_mx_operand(what, "A", a.codes, a.scales);
  check_mx_operand(what, "B", b.codes, b.scales);
  const TwoOperandWorkspace ws = dense_workspace(M, N, K);
  check_workspace(what, workspace, workspace_bytes, ws.total);
  const WorkspaceParts w = parts_of(workspace, ws);
  mxfp4_row_to_fp8_row(a.codes, a.scales, M, K, w.codes1, w.scales1, stream);
  mxfp4_row_to_fp8_row(b.codes, b.scales, N, K, w.codes2, w.scales2, stream);
  fp8_row_gemm(lt, Fp8RowOperand{w.codes1, w.scales1}, Fp8RowOperand{w.codes2, w.scales2}, M, N, K, y, stream);
}

size_t mxfp4_wgrad_workspace_bytes(int64_t M, int64_t N, int64_t K, int64_t G) {
  return wgrad_workspace(M, N, K, G).total;
}

void mxfp4_wgrad_grouped(GroupedGemm& gg, Mxfp4ColOperand dy, Mxfp4ColOperand x, int64_t N, int64_t K,
                         const GroupSplit& split, void* workspace, size_t workspace_bytes, GemmOutput dw,
                         cudaStream_t stream) {
  const char* what = "mxfp4_wgrad_grouped";
  FP4MOE_CHECK(N > 0 && N % 16 == 0 && K > 0 && K % 16 == 0,
               "{}: N and K must be positive multiples of 16 (FP8 tensor-core rows), got N={} K={}", what, N, K);
  // What GroupedGemm::wgrad_fp8 checks again, here before the conversions are launched.
  FP4MOE_CHECK(split.offsets != nullptr && split.host_offsets != nullptr && split.G >= 1 && split.G <= 65535,
               "{}: the split needs device and host offsets and 1 <= G <= 65535, got G={}", what, split.G);
  const int64_t M = split.host_offsets[split.G];
  validate_group_offsets(split.host_offsets, split.G, M, what);
  FP4MOE_CHECK(aligned(dw.data, 16), "{}: output must be a non-null 16-byte aligned pointer, got {}", what, dw.data);
  FP4MOE_CHECK(!dw.accumulate || dw.type == GemmOutType::fp32,
               "{}: accumulation needs an FP32 output (the master gradient), got a BF16 output", what);
  check_mx_operand(what, "dY", dy.codes, dy.scales);
  check_mx_operand(what, "X", x.codes, x.scales);
  const TwoOperandWorkspace ws = wgrad_workspace(M, N, K, split.G);
  check_workspace(what, workspace, workspace_bytes, ws.total);
  const WorkspaceParts w = parts_of(workspace, ws);
  int64_t P = 0, Q = 0;  // tokens padded to 32 and 128-token blocks before group g
  for (int64_t g = 0; g < split.G; ++g) {
    const int64_t Mg = int64_t{split.host_offsets[g + 1]} - split.host_offsets[g];
    const int64_t L = mxfp4_col_group_ld(Mg);
    if (Mg > 0) {
      mxfp4_row_to_fp8_row(dy.codes + N * P / 2, dy.scales + N * P / kMxBlock, N, L, w.codes1 + N * P,
                           w.scales1 + N * Q, stream);
      mxfp4_row_to_fp8_row(x.codes + K * P / 2, x.scales + K * P / kMxBlock, K, L, w.codes2 + K * P,
                           w.scales2 + K * Q, stream);
    }
    P += L;
    Q += ceil_div(Mg, int64_t{kFp8Block});
  }
  gg.wgrad_fp8(Fp8ColOperand{w.codes1, w.scales1}, Fp8ColOperand{w.codes2, w.scales2}, N, K, split, dw, stream,
               kMxBlock);
}

}  // namespace fp4moe
