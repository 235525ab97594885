// Fused LM-head cross-entropy (cross_entropy.h): cuBLASLt BF16 GEMMs per vocabulary chunk, and three small
// kernels: the online-softmax update (one block per token, fixed-shape tree reductions), the finalisation (one
// block, tokens summed in a fixed order) and the chunk's dlogits (one block per token).
#include <algorithm>

#include "kernels/formats/formats.h"
#include "kernels/gemm/cublaslt_matmul.h"
#include "kernels/nn/cross_entropy.h"

namespace fp4moe {
namespace {

constexpr int kThreads = 256;
constexpr int kFinalThreads = 1024;
constexpr int64_t kMaxGrid = 65536;

template <int kN>
__device__ float block_reduce(float v, float* scratch, bool is_max) {
  scratch[threadIdx.x] = v;
  __syncthreads();
  for (int s = kN / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      const float a = scratch[threadIdx.x], b = scratch[threadIdx.x + s];
      scratch[threadIdx.x] = is_max ? fmaxf(a, b) : __fadd_rn(a, b);
    }
    __syncthreads();
  }
  const float r = scratch[0];
  __syncthreads();
  return r;
}

__global__ void init_kernel(int64_t T, float* m, float* s, float* z) {
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < T;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    m[t] = -INFINITY;
    s[t] = 0.0f;
    z[t] = __int_as_float(0x7fc00000);
  }
}

__global__ void chunk_update_kernel(const float* __restrict__ logits, int64_t ld, int64_t T, int64_t v0, int64_t width,
                                    const int32_t* __restrict__ targets, float* m, float* s, float* z) {
  __shared__ float scratch[kThreads];
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    const float* row = logits + t * ld;
    float cmax = -INFINITY;
    for (int64_t i = threadIdx.x; i < width; i += blockDim.x) cmax = fmaxf(cmax, row[i]);
    cmax = block_reduce<kThreads>(cmax, scratch, true);
    const float m_old = m[t];
    const float m_new = fmaxf(m_old, cmax);
    float part = 0.0f;
    for (int64_t i = threadIdx.x; i < width; i += blockDim.x) part = __fadd_rn(part, expf(__fsub_rn(row[i], m_new)));
    const float csum = block_reduce<kThreads>(part, scratch, false);
    if (threadIdx.x == 0) {
      // m_old = -inf on the first chunk: exp(-inf) = 0 times s = 0.
      s[t] = __fadd_rn(__fmul_rn(s[t], expf(__fsub_rn(m_old, m_new))), csum);
      m[t] = m_new;
      const int64_t target = targets[t];
      if (target >= v0 && target < v0 + width) z[t] = row[target - v0];
    }
  }
}

__global__ void finalize_kernel(const float* __restrict__ m, const float* __restrict__ s, const float* __restrict__ z,
                                const int32_t* __restrict__ targets, int64_t T, float* __restrict__ lse,
                                float* __restrict__ loss_per_token, float* __restrict__ loss_mean,
                                int32_t* __restrict__ n_valid) {
  __shared__ float scratch[kFinalThreads];
  float part = 0.0f, count = 0.0f;
  for (int64_t t = threadIdx.x; t < T; t += blockDim.x) {
    const float l = __fadd_rn(m[t], logf(s[t]));
    lse[t] = l;
    const bool valid = targets[t] != kIgnoreIndex;
    const float loss = valid ? __fsub_rn(l, z[t]) : 0.0f;
    if (loss_per_token) loss_per_token[t] = loss;
    if (valid) {
      part = __fadd_rn(part, loss);
      count = __fadd_rn(count, 1.0f);  // exact below 2^24 tokens per thread
    }
  }
  const float total = block_reduce<kFinalThreads>(part, scratch, false);
  const float n = block_reduce<kFinalThreads>(count, scratch, false);
  if (threadIdx.x == 0) {
    *n_valid = static_cast<int32_t>(n);
    *loss_mean = n > 0.0f ? __fdiv_rn(total, n) : 0.0f;
  }
}

__global__ void chunk_dlogits_kernel(const float* __restrict__ logits, int64_t ld, int64_t T, int64_t v0,
                                     int64_t width, const int32_t* __restrict__ targets, const float* __restrict__ lse,
                                     const int32_t* __restrict__ n_valid, float dloss, uint16_t* __restrict__ dlogits) {
  const int32_t n = *n_valid;
  const float g = n > 0 ? __fdiv_rn(dloss, static_cast<float>(n)) : 0.0f;
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    const int64_t target = targets[t];
    const bool valid = target != kIgnoreIndex;
    const float l = lse[t];
    for (int64_t i = threadIdx.x; i < width; i += blockDim.x) {
      float d = 0.0f;
      if (valid) {
        const float p = expf(__fsub_rn(logits[t * ld + i], l));
        d = __fmul_rn(__fsub_rn(p, v0 + i == target ? 1.0f : 0.0f), g);
      }
      dlogits[t * ld + i] = f32_to_bf16_bits(d);
    }
  }
}

unsigned grid_for(int64_t rows) { return static_cast<unsigned>(std::max<int64_t>(1, std::min(rows, kMaxGrid))); }

}  // namespace

void cross_entropy_init(int64_t T, float* m, float* s, float* z, cudaStream_t stream) {
  FP4MOE_CHECK(T >= 0, "cross_entropy_init: T must be >= 0, got T={}", T);
  if (T == 0) return;
  FP4MOE_CHECK(m && s && z, "cross_entropy_init: m, s and z [T] must not be null");
  init_kernel<<<grid_for((T + kThreads - 1) / kThreads), kThreads, 0, stream>>>(T, m, s, z);
  CUDA_CHECK_LAUNCH();
}

void cross_entropy_chunk_update(const float* logits, int64_t ld, int64_t T, int64_t v0, int64_t width,
                                const int32_t* targets, float* m, float* s, float* z, cudaStream_t stream) {
  const char* what = "cross_entropy_chunk_update";
  FP4MOE_CHECK(T >= 0 && v0 >= 0 && width >= 1 && ld >= width,
               "{}: expected T >= 0, v0 >= 0, 1 <= width <= ld, got T={} v0={} width={} ld={}", what, T, v0, width, ld);
  if (T == 0) return;
  FP4MOE_CHECK(logits && targets && m && s && z, "{}: null pointer (logits, targets, m, s, z)", what);
  chunk_update_kernel<<<grid_for(T), kThreads, 0, stream>>>(logits, ld, T, v0, width, targets, m, s, z);
  CUDA_CHECK_LAUNCH();
}

void cross_entropy_finalize(const float* m, const float* s, const float* z, const int32_t* targets, int64_t T,
                            int64_t V, float* lse, float* loss_per_token, float* loss_mean, int32_t* n_valid,
                            cudaStream_t stream) {
  const char* what = "cross_entropy_finalize";
  FP4MOE_CHECK(T >= 0 && V >= 1, "{}: expected T >= 0 and V >= 1, got T={} V={}", what, T, V);
  FP4MOE_CHECK(loss_mean && n_valid, "{}: loss_mean and n_valid must not be null", what);
  FP4MOE_CHECK(T == 0 || (m && s && z && targets && lse), "{}: null pointer (m, s, z, targets, lse)", what);
  finalize_kernel<<<1, kFinalThreads, 0, stream>>>(m, s, z, targets, T, lse, loss_per_token, loss_mean, n_valid);
  CUDA_CHECK_LAUNCH();
}

void cross_entropy_chunk_dlogits(const float* logits, int64_t ld, int64_t T, int64_t v0, int64_t width,
                                 const int32_t* targets, const float* lse, const int32_t* n_valid, float dloss,
                                 bf16* dlogits, cudaStream_t stream) {
  const char* what = "cross_entropy_chunk_dlogits";
  FP4MOE_CHECK(T >= 0 && v0 >= 0 && width >= 1 && ld >= width,
               "{}: expected T >= 0, v0 >= 0, 1 <= width <= ld, got T={} v0={} width={} ld={}", what, T, v0, width, ld);
  if (T == 0) return;
  FP4MOE_CHECK(logits && targets && lse && n_valid && dlogits, "{}: null pointer (logits, targets, lse, n_valid, "
               "dlogits)", what);
  chunk_dlogits_kernel<<<grid_for(T), kThreads, 0, stream>>>(logits, ld, T, v0, width, targets, lse, n_valid, dloss,
                                                             reinterpret_cast<uint16_t*>(dlogits));
  CUDA_CHECK_LAUNCH();
}

// ---- LmHeadCrossEntropy ----------------------------------------------------------------------------------------

LmHeadCrossEntropy::LmHeadCrossEntropy(int64_t C, int64_t V, int64_t chunk) : C_(C), V_(V), chunk_(chunk) {
  detail::check_cross_entropy_shape("LmHeadCrossEntropy", 0, C, V, chunk);
  chunk_ = std::min(chunk, round_up(V, 8));  // no wider than the (padded) vocabulary
  lt_ = std::make_unique<CublasLtMatmul>();
}

LmHeadCrossEntropy::~LmHeadCrossEntropy() {
  cudaFree(logits_);
  cudaFree(dlogits_);
  cudaFree(stats_);
  cudaFree(n_valid_);
}

void LmHeadCrossEntropy::ensure(int64_t T) {
  if (T <= capacity_) return;
  cudaFree(logits_);
  cudaFree(dlogits_);
  cudaFree(stats_);
  logits_ = nullptr;
  dlogits_ = nullptr;
  stats_ = nullptr;
  capacity_ = 0;
  CUDA_CHECK(cudaMalloc(&logits_, static_cast<size_t>(logits_bytes(T, chunk_))));
  CUDA_CHECK(cudaMalloc(&dlogits_, static_cast<size_t>(dlogits_bytes(T, chunk_))));
  CUDA_CHECK(cudaMalloc(&stats_, static_cast<size_t>(stats_bytes(T))));
  if (!n_valid_) CUDA_CHECK(cudaMalloc(&n_valid_, sizeof(int32_t)));
  capacity_ = T;
}

void LmHeadCrossEntropy::forward(const bf16* h, const bf16* w, const int32_t* targets, int64_t T,
                                 float* loss_per_token, float* loss_mean, cudaStream_t stream) {
  const char* what = "LmHeadCrossEntropy::forward";
  detail::check_cross_entropy_shape(what, T, C_, V_, chunk_);
  FP4MOE_CHECK(loss_mean != nullptr, "{}: loss_mean [1] must not be null", what);
  FP4MOE_CHECK(T == 0 || (h && w && targets), "{}: h [T, C], w [V, C] and targets [T] must not be null", what);
  ensure(std::max<int64_t>(T, 1));
  const int64_t cap = capacity_;
  float *m = stats_, *s = stats_ + cap, *z = stats_ + 2 * cap, *lse = stats_ + 3 * cap;
  cross_entropy_init(T, m, s, z, stream);
  for (int64_t v0 = 0; v0 < V_ && T > 0; v0 += chunk_) {
    const int64_t width = std::min(chunk_, V_ - v0);
    // logits_c^T (width x T, column-major, ld chunk) = (W_c stored C x width)^T * (h stored C x T)
    LtOperand a{w + v0 * C_, CUDA_R_16BF, true, C_};
    LtOperand b{h, CUDA_R_16BF, false, C_};
    LtOutput d{logits_, CUDA_R_32F, chunk_, false};
    lt_->matmul(width, T, C_, a, b, d, RaggedDim::none, stream);
    cross_entropy_chunk_update(logits_, chunk_, T, v0, width, targets, m, s, z, stream);
  }
  cross_entropy_finalize(m, s, z, targets, T, V_, lse, loss_per_token, loss_mean, n_valid_, stream);
  forward_T_ = T;
}

void LmHeadCrossEntropy::backward(const bf16* h, const bf16* w, const int32_t* targets, int64_t T, float dloss,
                                  float* dh, float* dw_master, cudaStream_t stream) {
  const char* what = "LmHeadCrossEntropy::backward";
  detail::check_cross_entropy_shape(what, T, C_, V_, chunk_);
  FP4MOE_CHECK(forward_T_ == T, "{}: needs the forward of the same tokens first (forward T={}, backward T={})", what,
               forward_T_, T);
  if (T == 0) return;  // dh [0, C] is empty and dW gains nothing
  FP4MOE_CHECK(h && w && targets, "{}: h [T, C], w [V, C] and targets [T] must not be null", what);
  const float* lse = stats_ + 3 * capacity_;
  for (int64_t v0 = 0; v0 < V_; v0 += chunk_) {
    const int64_t width = std::min(chunk_, V_ - v0);
    LtOperand wt{w + v0 * C_, CUDA_R_16BF, true, C_};
    LtOperand hb{h, CUDA_R_16BF, false, C_};
    lt_->matmul(width, T, C_, wt, hb, LtOutput{logits_, CUDA_R_32F, chunk_, false}, RaggedDim::none, stream);
    cross_entropy_chunk_dlogits(logits_, chunk_, T, v0, width, targets, lse, n_valid_, dloss, dlogits_, stream);
    if (dh) {
      // dh^T (C x T) (+)= (W_c stored C x width) * (dlogits_c stored width x T, ld chunk)
      LtOperand a{w + v0 * C_, CUDA_R_16BF, false, C_};
      LtOperand b{dlogits_, CUDA_R_16BF, false, chunk_};
      lt_->matmul(C_, T, width, a, b, LtOutput{dh, CUDA_R_32F, C_, v0 > 0}, RaggedDim::none, stream);
    }
    if (dw_master) {
      // dW_c^T (C x width) += (h stored C x T) * (dlogits_c stored width x T)^T
      LtOperand a{h, CUDA_R_16BF, false, C_};
      LtOperand b{dlogits_, CUDA_R_16BF, true, chunk_};
      lt_->matmul(C_, width, T, a, b, LtOutput{dw_master + v0 * C_, CUDA_R_32F, C_, true}, RaggedDim::none, stream);
    }
  }
}

}  // namespace fp4moe
