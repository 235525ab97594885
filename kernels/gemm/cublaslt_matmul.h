// One cuBLASLt matmul in cuBLASLt's own (column-major) terms, with a handle, a workspace and a plan cache:
// the building block of the grouped GEMMs (grouped_gemm.h) and the object the GPU tests probe directly.
//
//   D (m x n, column-major, leading dimension d.ld) = op(A) (m x k) * op(B) (k x n)  [+ D if d.accumulate]
//
// FP32 accumulation (CUBLAS_COMPUTE_32F), alpha = 1, beta = 0 or 1. Operands are BF16 or FP8 E4M3; FP8 operands
// carry FP32 block scales (cublasLtMatmulMatrixScale_t):
//   vec128     (CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F): one scale per 128 consecutive elements along k, for each
//              of the operand's outer rows r (r < m for A, r < n for B): scale(r, kb) = scales[kb * outer + r]
//              (block-major, outer index contiguous, leading dimension exactly m resp. n);
//   blk128x128 (CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F): one scale per 128x128 block:
//              scale(rb, kb) = scales[rb * round_up(ceil(k/128), 4) + kb] (k-blocks contiguous, padded to 4).
// These are the layouts of kernels/quant/layouts.h (FP8 1x128 row tensor, FP8 column tensor, FP8 128x128 block
// tensor); a last block shorter than 128 covers the rest.
//
// Facts measured with cuBLASLt 13.1 on an H200 (the GPU tests re-check each one, see test_grouped_gemm_gpu.cpp):
//   - FP8 needs op(A) = T and op(B) = N (both operands contiguous along k), k % 16 == 0, and for the block scale
//     modes m % 4 == 0 and n % 4 == 0 (else CUBLAS_STATUS_NOT_SUPPORTED); the bf16 output's leading dimension
//     must keep 16-byte alignment.
//   - scale modes (A, B): (vec128, vec128), (vec128, blk128x128), (blk128x128, vec128) are supported and
//     correct, K = 576 included; (blk128x128, blk128x128) is refused.
//   - a blk128x128 scale tensor whose k-block count is NOT padded to a multiple of 4 gives wrong results
//     (relative error 0.56 at K = 576): the padding of layouts.h is required.
//   - FP32 output with beta = 1 (accumulation into an FP32 master gradient) works for every supported mode.
//
// Plans: the heuristic (cublasLtMatmulAlgoGetHeuristic, 25-150 us per query) runs once per plan key; the key
// rounds the ragged dimension (token counts) up to a power of two so that a new routing split does not cost a
// query per expert. If cuBLASLt refuses the cached algorithm for the exact shape, the exact shape is queried once
// and cached too. Not thread-safe: use one object per stream (it also owns the workspace that stream uses).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <string>
#include <tuple>

namespace fp4moe {

enum class LtScaleMode : int { none = 0, vec128 = 1, blk128x128 = 2 };
const char* lt_scale_mode_name(LtScaleMode mode);

// Name of a cuBLAS status ("CUBLAS_STATUS_NOT_SUPPORTED"), for error messages.
const char* cublas_status_name(cublasStatus_t status);

struct LtOperand {
  const void* data = nullptr;  // device
  cudaDataType_t type = CUDA_R_16BF;  // CUDA_R_16BF or CUDA_R_8F_E4M3
  bool transpose = false;      // op(X) = X^T: stored (k x m) for A, (n x k) for B
  int64_t ld = 0;              // leading dimension of the stored column-major matrix, in elements
  const float* scales = nullptr;  // device, FP8 only
  LtScaleMode scale_mode = LtScaleMode::none;
};

struct LtOutput {
  void* data = nullptr;                // device, m x n column-major
  cudaDataType_t type = CUDA_R_16BF;   // CUDA_R_16BF or CUDA_R_32F
  int64_t ld = 0;
  bool accumulate = false;             // D += product (FP32 output only)
};

// Which dimension varies with the routing (rounded up to a power of two in the plan key).
enum class RaggedDim : int { none = 0, n = 1, k = 2 };

class CublasLtMatmul {
 public:
  // workspace_bytes: cuBLASLt workspace allocated once here (32 MiB is what cuBLASLt asks for on Hopper).
  explicit CublasLtMatmul(size_t workspace_bytes = size_t{32} << 20);
  ~CublasLtMatmul();
  CublasLtMatmul(const CublasLtMatmul&) = delete;
  CublasLtMatmul& operator=(const CublasLtMatmul&) = delete;

  // D = op(A) op(B) [+ D] on `stream`. m, n, k >= 1. Throws fp4moe::Error naming the cuBLASLt status, the shape
  // (m, n, k), the types, transposes and scale modes when cuBLASLt refuses the problem or finds no algorithm.
  // Rejects (before any cuBLAS call): m, n, k < 1, null pointers, FP8 operands without scales or BF16 operands
  // with scales, leading dimensions smaller than the stored rows, accumulate with a non-FP32 output.
  void matmul(int64_t m, int64_t n, int64_t k, const LtOperand& a, const LtOperand& b, const LtOutput& d,
              RaggedDim ragged, cudaStream_t stream);

  // The problem in words, as error messages print it.
  static std::string describe(int64_t m, int64_t n, int64_t k, const LtOperand& a, const LtOperand& b,
                              const LtOutput& d);

  // Heuristic queries made so far, and how many calls needed the exact shape after the bucketed algorithm was
  // refused (benchmarks report both).
  int64_t heuristic_queries() const { return heuristic_queries_; }
  int64_t exact_shape_fallbacks() const { return exact_shape_fallbacks_; }
  cublasLtHandle_t handle() const { return handle_; }

 private:
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  using Key = std::tuple<int, int, int, int, int, int, int, int, int64_t, int64_t, int64_t, int64_t, int64_t,
                         int64_t, int, int, int>;
  Plan& plan_for(const Key& key, int64_t m, int64_t n, int64_t k, const LtOperand& a, const LtOperand& b,
                 const LtOutput& d);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<Key, Plan> plans_;
  int64_t heuristic_queries_ = 0;
  int64_t exact_shape_fallbacks_ = 0;
};

}  // namespace fp4moe
