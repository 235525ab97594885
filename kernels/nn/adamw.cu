// AdamW step and global gradient norm kernels (adamw.h). Memory-bound, grid-stride: four elements per thread and
// access when every pointer allows it (FP32: 16 bytes; param and BF16 moments: 8 bytes), a scalar tail (and scalar
// path otherwise). One AdamW kernel for FP32 and BF16 moments: MomentIo below is the only difference. The norm adds
// squares in double: per thread, then per block (warp shuffles, then the 8 warp sums in order) into one of
// kGradNormSlots workspace slots owned by that block (launches of one stream run in order, so each slot sees a
// fixed sequence of additions), then one block adds the slots in order: deterministic, no atomics.
#include <algorithm>
#include <cmath>

#include "kernels/nn/adamw.h"
#include "kernels/nn/nn_checks.h"
#include "kernels/nn/nn_vec.cuh"

namespace fp4moe {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
static_assert(kGradNormSlots % kThreads == 0, "the final sum gives each thread the same number of slots");

// Per-step constants, prepared on the host in double and rounded to FP32.
struct AdamWConstants {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, eps;
  float lr_times_wd;   // lr * weight_decay
  float step_size;     // lr / (1 - beta1^step)
  float sqrt_bc2;      // sqrt(1 - beta2^step)
};

__device__ __forceinline__ void adamw_element(float& w, float& m, float& v, float g, const AdamWConstants& k) {
  m = k.beta1 * m + k.one_minus_beta1 * g;
  v = k.beta2 * v + k.one_minus_beta2 * (g * g);
  w = w - k.lr_times_wd * w;
  w = w - k.step_size * (m / (sqrtf(v) / k.sqrt_bc2 + k.eps));
}

// Two FP32 values rounded to BF16 (nearest even), packed: lo in bits 0..15, hi in bits 16..31.
__device__ __forceinline__ uint32_t bf16x2_bits(float lo, float hi) {
  return static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(lo))) |
         (static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(hi))) << 16);
}

// Loads and stores of the moments: 4 consecutive elements (one aligned vector access) or 1, as FP32. BF16 values
// widen exactly (the 16 bits on top of an FP32) and are stored rounded to nearest even.
template <typename Moment>
struct MomentIo;

template <>
struct MomentIo<float> {
  static __device__ __forceinline__ float4 load4(const float* p, int64_t i) {
    return reinterpret_cast<const float4*>(p)[i];
  }
  static __device__ __forceinline__ void store4(float* p, int64_t i, float4 x) {
    reinterpret_cast<float4*>(p)[i] = x;
  }
  static __device__ __forceinline__ float load(const float* p, int64_t i) { return p[i]; }
  static __device__ __forceinline__ void store(float* p, int64_t i, float x) { p[i] = x; }
};

template <>
struct MomentIo<bf16> {
  static __device__ __forceinline__ float4 load4(const bf16* p, int64_t i) {
    const uint2 u = reinterpret_cast<const uint2*>(p)[i];
    return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xFFFF0000u), __uint_as_float(u.y << 16),
                       __uint_as_float(u.y & 0xFFFF0000u));
  }
  static __device__ __forceinline__ void store4(bf16* p, int64_t i, float4 x) {
    reinterpret_cast<uint2*>(p)[i] = make_uint2(bf16x2_bits(x.x, x.y), bf16x2_bits(x.z, x.w));
  }
  static __device__ __forceinline__ float load(const bf16* p, int64_t i) { return __bfloat162float(p[i]); }
  static __device__ __forceinline__ void store(bf16* p, int64_t i, float x) { p[i] = __float2bfloat16_rn(x); }
};

template <typename Moment>
__global__ void __launch_bounds__(kThreads)
adamw_kernel(float* __restrict__ master, bf16* __restrict__ param, const float* __restrict__ grad,
             Moment* __restrict__ m_buf, Moment* __restrict__ v_buf, int64_t n, bool vec,
             const float* __restrict__ grad_scale, AdamWConstants k) {
  using Io = MomentIo<Moment>;
  const float scale = grad_scale != nullptr ? *grad_scale : 1.0f;
  const int64_t stride = int64_t{gridDim.x} * kThreads;
  const int64_t first = int64_t{blockIdx.x} * kThreads + threadIdx.x;
  const int64_t n4 = vec ? n / 4 : 0;
  for (int64_t i = first; i < n4; i += stride) {
    float4 w = reinterpret_cast<const float4*>(master)[i];
    float4 m = Io::load4(m_buf, i);
    float4 v = Io::load4(v_buf, i);
    const float4 g = reinterpret_cast<const float4*>(grad)[i];
    adamw_element(w.x, m.x, v.x, g.x * scale, k);
    adamw_element(w.y, m.y, v.y, g.y * scale, k);
    adamw_element(w.z, m.z, v.z, g.z * scale, k);
    adamw_element(w.w, m.w, v.w, g.w * scale, k);
    reinterpret_cast<float4*>(master)[i] = w;
    Io::store4(m_buf, i, m);
    Io::store4(v_buf, i, v);
    reinterpret_cast<uint2*>(param)[i] = make_uint2(bf16x2_bits(w.x, w.y), bf16x2_bits(w.z, w.w));
  }
  for (int64_t i = n4 * 4 + first; i < n; i += stride) {
    float w = master[i], m = Io::load(m_buf, i), v = Io::load(v_buf, i);
    adamw_element(w, m, v, grad[i] * scale, k);
    master[i] = w;
    Io::store(m_buf, i, m);
    Io::store(v_buf, i, v);
    param[i] = __float2bfloat16_rn(w);
  }
}

// Sum over the block (256 threads) in a fixed order; the result is valid in thread 0.
__device__ __forceinline__ double block_sum(double s) {
  __shared__ double warp_sums[kWarps];
  s = nn_detail::warp_sum(s);
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = s;
  __syncthreads();
  double total = 0;
  if (threadIdx.x == 0)
    for (int w = 0; w < kWarps; ++w) total += warp_sums[w];
  return total;
}

// slots[blockIdx.x] += sum of grad^2 over this block's grid-stride share of grad [n].
__global__ void __launch_bounds__(kThreads)
grad_sum_squares_kernel(const float* __restrict__ grad, int64_t n, bool vec, double* __restrict__ slots) {
  const int64_t stride = int64_t{gridDim.x} * kThreads;
  const int64_t first = int64_t{blockIdx.x} * kThreads + threadIdx.x;
  const int64_t n4 = vec ? n / 4 : 0;
  double s = 0;
  for (int64_t i = first; i < n4; i += stride) {
    const float4 g = reinterpret_cast<const float4*>(grad)[i];
    const double x = g.x, y = g.y, z = g.z, w = g.w;
    s += x * x + y * y + z * z + w * w;
  }
  for (int64_t i = n4 * 4 + first; i < n; i += stride) {
    const double x = grad[i];
    s += x * x;
  }
  const double total = block_sum(s);
  if (threadIdx.x == 0) slots[blockIdx.x] += total;
}

// norm = sqrt(sum of slots), clip scale as grad_clip_scale (adamw_ref.cpp). One block.
__global__ void __launch_bounds__(kThreads)
grad_norm_finish_kernel(const double* __restrict__ slots, float max_norm, float* __restrict__ norm_out,
                        float* __restrict__ clip_scale_out) {
  constexpr int kPerThread = kGradNormSlots / kThreads;
  double s = 0;
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) s += slots[threadIdx.x * kPerThread + i];
  const double total = block_sum(s);
  if (threadIdx.x != 0) return;
  const double norm = sqrt(total);
  *norm_out = static_cast<float>(norm);
  if (clip_scale_out != nullptr) {
    float scale = __int_as_float(0x7FC00000);  // NaN for a non-finite norm
    if (isfinite(norm)) {
      const double r = static_cast<double>(max_norm) / (norm + 1e-6);
      scale = r < 1.0 ? static_cast<float>(r) : 1.0f;
    }
    *clip_scale_out = scale;
  }
}

unsigned grid_for(int64_t items, int64_t cap) {
  return static_cast<unsigned>(std::clamp<int64_t>(ceil_div(items, kThreads), 1, cap));
}

}  // namespace

namespace {

template <typename Moment>
void launch_adamw(const AdamWTensorOf<Moment>& t, const AdamWConfig& cfg, const float* grad_scale,
                  cudaStream_t stream) {
  const char* what = "adamw_step";
  nn_detail::check_adamw(what, t, cfg, /*device=*/true);
  if (grad_scale != nullptr) nn_detail::check_aligned(what, "grad_scale", grad_scale, 4);
  if (t.n == 0) return;
  const double b1 = cfg.beta1, b2 = cfg.beta2;
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(cfg.step));
  const double bc2 = 1.0 - std::pow(b2, static_cast<double>(cfg.step));
  const AdamWConstants k{cfg.beta1,
                         static_cast<float>(1.0 - b1),
                         cfg.beta2,
                         static_cast<float>(1.0 - b2),
                         cfg.eps,
                         static_cast<float>(static_cast<double>(cfg.lr) * cfg.weight_decay),
                         static_cast<float>(cfg.lr / bc1),
                         static_cast<float>(std::sqrt(bc2))};
  constexpr int64_t kMomentVecBytes = 4 * sizeof(Moment);  // 16 (FP32) or 8 (BF16)
  const bool vec = nn_detail::is_aligned(t.master, 16) && nn_detail::is_aligned(t.grad, 16) &&
                   nn_detail::is_aligned(t.m, kMomentVecBytes) && nn_detail::is_aligned(t.v, kMomentVecBytes) &&
                   nn_detail::is_aligned(t.param, 8);
  adamw_kernel<Moment><<<grid_for(vec ? ceil_div(t.n, 4) : t.n, 132 * 16), kThreads, 0, stream>>>(
      t.master, t.param, t.grad, t.m, t.v, t.n, vec, grad_scale, k);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void adamw_step(const AdamWTensor& t, const AdamWConfig& cfg, const float* grad_scale, cudaStream_t stream) {
  launch_adamw(t, cfg, grad_scale, stream);
}

void adamw_step(const AdamWTensorBf16Moments& t, const AdamWConfig& cfg, const float* grad_scale,
                cudaStream_t stream) {
  launch_adamw(t, cfg, grad_scale, stream);
}

void grad_global_norm(const GradTensor* tensors, int count, float max_norm, double* workspace, float* norm_out,
                      float* clip_scale_out, cudaStream_t stream) {
  const char* what = "grad_global_norm";
  nn_detail::check_grad_tensors(what, tensors, count, max_norm, /*device=*/true);
  nn_detail::check_not_null(what, "workspace", workspace);
  nn_detail::check_aligned(what, "workspace", workspace, 8);
  nn_detail::check_not_null(what, "norm_out", norm_out);
  nn_detail::check_aligned(what, "norm_out", norm_out, 4);
  if (clip_scale_out != nullptr) nn_detail::check_aligned(what, "clip_scale_out", clip_scale_out, 4);
  CUDA_CHECK(cudaMemsetAsync(workspace, 0, kGradNormSlots * sizeof(double), stream));
  for (int i = 0; i < count; ++i) {
    const GradTensor& g = tensors[i];
    if (g.n == 0) continue;
    const bool vec = nn_detail::is_aligned(g.grad, 16);
    // The grid depends only on n: the same tensor list always sums in the same order.
    const unsigned grid = grid_for(ceil_div(g.n, 4 * 4), kGradNormSlots);
    grad_sum_squares_kernel<<<grid, kThreads, 0, stream>>>(g.grad, g.n, vec, workspace);
    CUDA_CHECK_LAUNCH();
  }
  grad_norm_finish_kernel<<<1, kThreads, 0, stream>>>(workspace, max_norm, norm_out, clip_scale_out);
  CUDA_CHECK_LAUNCH();
}

}  // namespace fp4moe
