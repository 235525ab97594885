// Fused, vocabulary-chunked LM-head cross-entropy: loss = mean over non-ignored tokens t of
//     lse_t - z_t[target_t],   z_t = h_t W^T (logits over the vocabulary V),   lse_t = log sum_v exp(z_t[v])
// without ever holding the [T, V] logits: the vocabulary is walked in chunks of `chunk` entries.
//
// Design (the trainer's last layer; the LM head stays BF16 with FP32 accumulation, DESIGN.md "Recipes"):
//   forward, per chunk c = [v0, v0 + w):   logits_c [T, w] FP32 = h [T, C] W_c^T   (cuBLASLt BF16 GEMM through
//            kernels/gemm/cublaslt_matmul.h, FP32 output), then an online-softmax update of the running max m_t
//            and sum s_t = sum exp(z - m_t) (s_t <- s_t exp(m_old - m_new) + sum_c exp(z - m_new)), and z_t[target]
//            picked up from the chunk that holds the target. At the end lse_t = m_t + log s_t,
//            loss_t = lse_t - z_t[target_t] (0 for ignored tokens), loss = sum loss_t / n_valid.
//   backward, per chunk (the logits are recomputed, not stored):
//            dlogits_c [T, w] BF16 = (exp(z - lse_t) - [v == target_t]) * dloss / n_valid (0 for ignored rows),
//            dh [T, C] FP32 (+)= dlogits_c W_c           (Dgrad, cuBLASLt, accumulating over chunks)
//            dW_c [w, C] FP32 += dlogits_c^T h           (Wgrad into the FP32 master gradient)
// Memory beyond the inputs: logits FP32 [T, chunk] + dlogits BF16 [T, chunk] + 4 FP32 [T] vectors; the default
// chunk of 8192 keeps that at 48 KiB per token whatever V is.
//
// Targets int32 [T]: kIgnoreIndex (-100, PyTorch's default) marks a token without loss (padding); a target outside
// [0, V) other than -100 gives a NaN loss for that token (the device cannot throw; it poisons the mean, visibly).
// n_valid = 0 gives loss 0 and zero gradients (T < 2^24: n_valid is counted in FP32). The kernels' reductions run
// in a fixed order and the GEMMs are cuBLASLt's (bitwise reproducible on one GPU and toolkit, as cuBLAS documents),
// so results repeat run to run; the GPU matches the CPU reference up to rounding (GEMM order, expf/logf, BF16
// dlogits), not bit for bit.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "kernels/common/check.h"
#include "kernels/common/types.h"

namespace fp4moe {

class CublasLtMatmul;

constexpr int32_t kIgnoreIndex = -100;

namespace detail {
inline void check_cross_entropy_shape(const char* what, int64_t T, int64_t C, int64_t V, int64_t chunk) {
  FP4MOE_CHECK(T >= 0 && T < (int64_t{1} << 24),
               "{}: token count T must be in [0, 2^24) (tokens are counted in FP32), got T={}", what, T);
  FP4MOE_CHECK(C >= 8 && C % 8 == 0, "{}: hidden size C must be a positive multiple of 8 (16-byte BF16 rows), got C={}",
               what, C);
  FP4MOE_CHECK(V >= 1 && V < (int64_t{1} << 31), "{}: vocabulary V must be in [1, 2^31), got V={}", what, V);
  FP4MOE_CHECK(chunk >= 8 && chunk % 8 == 0,
               "{}: vocabulary chunk must be a positive multiple of 8 (16-byte BF16 rows of dlogits), got chunk={}",
               what, chunk);
}
}  // namespace detail

// One LM head of shape W [V, C]; owns its cuBLASLt plans and scratch (grown on demand with cudaMalloc, which
// synchronises the device the first time a larger T arrives). Not thread-safe; one stream.
class LmHeadCrossEntropy {
 public:
  // Rejects (fp4moe::Error) the shapes check_cross_entropy_shape rejects (with T = 0).
  LmHeadCrossEntropy(int64_t C, int64_t V, int64_t chunk = 8192);
  ~LmHeadCrossEntropy();
  LmHeadCrossEntropy(const LmHeadCrossEntropy&) = delete;
  LmHeadCrossEntropy& operator=(const LmHeadCrossEntropy&) = delete;

  // h [T, C] BF16, w [V, C] BF16, targets [T] int32 (device). Writes loss_per_token [T] FP32 (device, may be null)
  // and loss_mean [1] FP32 (device). Keeps lse [T] and n_valid for the backward (same h, w, targets, T).
  // Rejects null pointers (h, w, targets for T > 0; loss_mean always).
  void forward(const bf16* h, const bf16* w, const int32_t* targets, int64_t T, float* loss_per_token,
               float* loss_mean, cudaStream_t stream);

  // dloss: gradient of loss_mean (host value, e.g. 1 / gradient-accumulation steps). dh [T, C] FP32 is
  // overwritten (null: no Dgrad); dw_master [V, C] FP32 accumulates (+=, null: no Wgrad). Rejects a backward
  // without a forward of the same T.
  void backward(const bf16* h, const bf16* w, const int32_t* targets, int64_t T, float dloss, float* dh,
                float* dw_master, cudaStream_t stream);

  int64_t chunk() const { return chunk_; }
  // The scratch the layer holds for T tokens (cudaMalloc'd, grown on demand): logits [T, chunk] FP32, dlogits
  // [T, chunk] BF16, and the statistics [4, T] FP32 (running max, running sum, target logit, lse), in bytes.
  static int64_t logits_bytes(int64_t T, int64_t chunk) { return T * chunk * static_cast<int64_t>(sizeof(float)); }
  static int64_t dlogits_bytes(int64_t T, int64_t chunk) { return T * chunk * static_cast<int64_t>(sizeof(bf16)); }
  static int64_t stats_bytes(int64_t T) { return 4 * T * static_cast<int64_t>(sizeof(float)); }

 private:
  void ensure(int64_t T);

  int64_t C_, V_, chunk_;
  std::unique_ptr<CublasLtMatmul> lt_;
  int64_t capacity_ = 0;       // tokens the scratch holds
  float* logits_ = nullptr;    // [capacity, chunk] FP32
  bf16* dlogits_ = nullptr;    // [capacity, chunk] BF16
  float* stats_ = nullptr;     // [4, capacity]: running max, running sum, target logit, lse
  int32_t* n_valid_ = nullptr; // [1]
  int64_t forward_T_ = -1;
};

// ---- the per-chunk kernels, on their own (device pointers; asynchronous; the class above chains them) ---------
// Each rejects (fp4moe::Error, before any launch) T < 0 and, for T > 0, null pointers; the chunk kernels also
// v0 < 0, width < 1 and ld < width; finalize also V < 1 and a null loss_mean or n_valid (for any T).
// T = 0 launches nothing, except finalize, which writes loss_mean = 0 and n_valid = 0.
// Running statistics m [T], s [T], z [T] FP32: set to -inf, 0, NaN.
void cross_entropy_init(int64_t T, float* m, float* s, float* z, cudaStream_t stream);
// logits [T, ld] FP32 row-major holding vocabulary entries [v0, v0 + width) in columns 0..width-1.
void cross_entropy_chunk_update(const float* logits, int64_t ld, int64_t T, int64_t v0, int64_t width,
                                const int32_t* targets, float* m, float* s, float* z, cudaStream_t stream);
// -> lse [T], loss_per_token [T] (may be null), loss_mean [1], n_valid [1] int32.
void cross_entropy_finalize(const float* m, const float* s, const float* z, const int32_t* targets, int64_t T,
                            int64_t V, float* lse, float* loss_per_token, float* loss_mean, int32_t* n_valid,
                            cudaStream_t stream);
// dlogits [T, ld] BF16 columns 0..width-1 for vocabulary entries [v0, v0 + width).
void cross_entropy_chunk_dlogits(const float* logits, int64_t ld, int64_t T, int64_t v0, int64_t width,
                                 const int32_t* targets, const float* lse, const int32_t* n_valid, float dloss,
                                 bf16* dlogits, cudaStream_t stream);

// ---- CPU reference (cross_entropy_ref.cpp), Real = float or double, host memory -----------------------------
// h [T, C], w [V, C] in Real; the same chunked online softmax (chunk entries at a time) in Real arithmetic.
// Returns the mean loss; loss_per_token [T] may be null. Rejects the shapes above (C, chunk: any >= 1 here).
template <typename Real>
Real cross_entropy_forward_ref(const Real* h, const Real* w, const int32_t* targets, int64_t T, int64_t C, int64_t V,
                               int64_t chunk, Real* loss_per_token);
// Gradients of dloss * mean loss: dh [T, C] (overwritten), dw [V, C] (overwritten). Either may be null.
template <typename Real>
void cross_entropy_backward_ref(const Real* h, const Real* w, const int32_t* targets, int64_t T, int64_t C, int64_t V,
                                Real dloss, Real* dh, Real* dw);

}  // namespace fp4moe
