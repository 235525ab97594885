// MoE router kernels (router.h). One warp per token holds the token's E scores in shared memory and selects the
// top-k in k rounds of a warp argmax; counts by integer atomics, offsets by a sequential scan, the v2 balance loss
// by one thread per expert summing over tokens in token order (the CPU reference's order).
#include <algorithm>

#include "kernels/common/check.h"
#include "kernels/nn/router.h"

namespace fp4moe {
namespace {

constexpr int kWarpsPerBlock = 2;  // shared memory per warp: (2 E + k) * 4 bytes <= 12 KiB at E = k = 1024
constexpr int kThreads = 32 * kWarpsPerBlock;
static_assert(kRouterMaxExperts <= 1024, "the count scan and the balance loss use one thread per expert");

struct ArgMax {
  float v;
  int i;  // -1: none yet
};

// The better of two candidates: the higher score, and on equal scores the lower expert index.
__device__ __forceinline__ ArgMax better(ArgMax a, ArgMax b) {
  if (a.i < 0) return b;
  if (b.i < 0) return a;
  return (b.v > a.v || (b.v == a.v && b.i < a.i)) ? b : a;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// logits [T, E] -> probs [T, E], topk_idx [T, k], topk_weight [T, k]. One warp per token.
__global__ void router_topk_kernel(const float* __restrict__ logits, const float* __restrict__ bias, int64_t T,
                                   int E, int k, bool v3, float scale, float* __restrict__ probs,
                                   int32_t* __restrict__ topk_idx, float* __restrict__ topk_weight) {
  extern __shared__ float smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp;
  if (t >= T) return;  // whole warps leave; no block-wide barrier below
  float* p = smem + static_cast<int64_t>(warp) * (2 * E + k);  // [E] scores s or p
  float* sel = p + E;                                          // [E] selection scores; NaN once taken
  int* chosen = reinterpret_cast<int*>(sel + E);               // [k]
  const float* x = logits + t * E;

  if (v3) {
    for (int e = lane; e < E; e += 32) {
      const float s = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x[e])));
      p[e] = s;
      sel[e] = __fadd_rn(s, bias ? bias[e] : 0.0f);
    }
  } else {
    float m = -INFINITY;
    for (int e = lane; e < E; e += 32) m = fmaxf(m, x[e]);
    m = warp_max(m);
    float sum = 0.0f;
    for (int e = lane; e < E; e += 32) sum = __fadd_rn(sum, expf(__fsub_rn(x[e], m)));
    sum = warp_sum(sum);
    for (int e = lane; e < E; e += 32) {
      const float pe = __fdiv_rn(expf(__fsub_rn(x[e], m)), sum);
      p[e] = pe;
      sel[e] = pe;
    }
  }
  __syncwarp();
  for (int e = lane; e < E; e += 32) probs[t * E + e] = p[e];

  for (int j = 0; j < k; ++j) {
    ArgMax best{0.0f, -1};
    for (int e = lane; e < E; e += 32) {
      const float v = sel[e];
      if (v == v) best = better(best, ArgMax{v, e});  // NaN marks an expert already taken
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      ArgMax other{__shfl_xor_sync(0xffffffffu, best.v, o), __shfl_xor_sync(0xffffffffu, best.i, o)};
      best = better(best, other);
    }
    if (lane == 0) {
      chosen[j] = best.i;
      if (best.i >= 0) sel[best.i] = __int_as_float(0x7fc00000);
    }
    __syncwarp();
  }

  float denom = 1.0f;
  if (v3) {
    if (lane == 0) {
      denom = 0.0f;
      for (int j = 0; j < k; ++j) denom = __fadd_rn(denom, chosen[j] >= 0 ? p[chosen[j]] : 0.0f);
    }
    denom = __shfl_sync(0xffffffffu, denom, 0);
  }
  for (int j = lane; j < k; j += 32) {
    const int e = chosen[j];
    topk_idx[t * k + j] = e;
    topk_weight[t * k + j] = __fmul_rn(scale, __fdiv_rn(e >= 0 ? p[e] : 0.0f, denom));
  }
}

__global__ void count_assignments_kernel(const int32_t* __restrict__ topk_idx, int64_t n, int E,
                                         int32_t* __restrict__ counts) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t e = topk_idx[i];
    if (e >= 0 && e < E) atomicAdd(counts + e, 1);  // integer sums: exact in any order
  }
}

__global__ void exclusive_scan_kernel(const int32_t* __restrict__ counts, int E, int32_t* __restrict__ offsets) {
  if (threadIdx.x != 0) return;
  int32_t acc = 0;
  offsets[0] = 0;
  for (int e = 0; e < E; ++e) {
    acc += counts[e];
    offsets[e + 1] = acc;
  }
}

// v2 balance loss (detail::launch_balance_loss): thread e sums P_e over tokens in order; thread 0 sums the terms in
// expert order.
__global__ void balance_loss_kernel(const float* __restrict__ probs, const int32_t* __restrict__ counts, int64_t T,
                                    int E, int k, float alpha, float* __restrict__ aux_loss) {
  __shared__ float term[kRouterMaxExperts];
  const int e = threadIdx.x;
  if (e < E) {
    float P = 0.0f;
    for (int64_t t = 0; t < T; ++t) P = __fadd_rn(P, probs[t * E + e]);
    P = __fdiv_rn(P, static_cast<float>(T));
    const float f = __fdiv_rn(__fmul_rn(static_cast<float>(E), static_cast<float>(counts[e])),
                              static_cast<float>(static_cast<int64_t>(k) * T));
    term[e] = __fmul_rn(f, P);
  }
  __syncthreads();
  if (e == 0) {
    float loss = 0.0f;
    for (int i = 0; i < E; ++i) loss = __fadd_rn(loss, term[i]);
    *aux_loss = __fmul_rn(alpha, loss);
  }
}

// dweights [T, k] -> dlogits [T, E]. One warp per token.
__global__ void router_backward_kernel(const float* __restrict__ probs, const int32_t* __restrict__ topk_idx,
                                       const int32_t* __restrict__ counts, const float* __restrict__ dweights,
                                       int64_t T, int E, int k, bool v3, float scale, float alpha, float aux_grad,
                                       float* __restrict__ dlogits) {
  extern __shared__ float smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp;
  if (t >= T) return;
  const float* p = probs + t * E;
  const int32_t* idx = topk_idx + t * k;
  const float* dw = dweights + t * k;
  float* dx = dlogits + t * E;
  if (v3) {
    float S = 0.0f, dot = 0.0f;
    if (lane == 0)
      for (int j = 0; j < k; ++j) {
        S = __fadd_rn(S, p[idx[j]]);
        dot = __fadd_rn(dot, __fmul_rn(dw[j], p[idx[j]]));
      }
    S = __shfl_sync(0xffffffffu, S, 0);
    dot = __shfl_sync(0xffffffffu, dot, 0);
    for (int e = lane; e < E; e += 32) dx[e] = 0.0f;
    __syncwarp();
    for (int j = lane; j < k; j += 32) {
      const float s = p[idx[j]];
      const float ds = __fmul_rn(__fdiv_rn(scale, S), __fsub_rn(dw[j], __fdiv_rn(dot, S)));
      dx[idx[j]] = __fmul_rn(ds, __fmul_rn(s, __fsub_rn(1.0f, s)));
    }
    return;
  }
  float* dp = smem + static_cast<int64_t>(warp) * E;
  const float base = __fmul_rn(aux_grad, alpha);
  for (int e = lane; e < E; e += 32) {
    const float f = __fdiv_rn(__fmul_rn(static_cast<float>(E), static_cast<float>(counts[e])),
                              static_cast<float>(static_cast<int64_t>(k) * T));
    dp[e] = __fdiv_rn(__fmul_rn(base, f), static_cast<float>(T));
  }
  __syncwarp();
  for (int j = lane; j < k; j += 32) dp[idx[j]] = __fadd_rn(dp[idx[j]], __fmul_rn(scale, dw[j]));  // distinct experts
  __syncwarp();
  float dot = 0.0f;
  for (int e = lane; e < E; e += 32) dot = __fadd_rn(dot, __fmul_rn(p[e], dp[e]));
  dot = warp_sum(dot);
  for (int e = lane; e < E; e += 32) dx[e] = __fmul_rn(p[e], __fsub_rn(dp[e], dot));
}

__global__ void bias_update_kernel(const int32_t* __restrict__ counts, int E, int64_t total, float gamma,
                                   float* __restrict__ bias) {
  const int e = threadIdx.x;
  if (e >= E) return;
  const int64_t load = static_cast<int64_t>(counts[e]) * E;
  if (load > total) bias[e] = __fsub_rn(bias[e], gamma);
  else if (load < total) bias[e] = __fadd_rn(bias[e], gamma);
}

unsigned blocks_for_tokens(int64_t T) { return static_cast<unsigned>((T + kWarpsPerBlock - 1) / kWarpsPerBlock); }

}  // namespace

void detail::launch_balance_loss(const float* probs, const int32_t* counts, int64_t T, int64_t E, int64_t k,
                                 float alpha, float* aux_loss, cudaStream_t stream) {
  if (T == 0) {
    CUDA_CHECK(cudaMemsetAsync(aux_loss, 0, sizeof(float), stream));
    return;
  }
  balance_loss_kernel<<<1, static_cast<unsigned>(E), 0, stream>>>(probs, counts, T, static_cast<int>(E),
                                                                   static_cast<int>(k), alpha, aux_loss);
  CUDA_CHECK_LAUNCH();
}

void router_bias_update(const int32_t* counts, int64_t E, int64_t total_assignments, float gamma, float* bias,
                        cudaStream_t stream) {
  detail::check_bias_update("router_bias_update", counts, E, total_assignments, gamma, bias);
  bias_update_kernel<<<1, static_cast<unsigned>(E), 0, stream>>>(counts, static_cast<int>(E), total_assignments,
                                                                  gamma, bias);
  CUDA_CHECK_LAUNCH();
}

namespace {
__global__ void tally_counts_kernel(const int32_t* __restrict__ counts, int E, int32_t* __restrict__ tally) {
  const int e = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (e < E) tally[e] += counts[e];
}
}  // namespace

namespace {
// One thread per expert: the tally's total (a block sum in int64), the bias rule of bias_update_kernel, the tally
// zeroed.
__global__ void bias_update_from_tally_kernel(int32_t* __restrict__ tally, int E, float gamma,
                                              float* __restrict__ bias) {
  __shared__ unsigned long long total;
  const int e = threadIdx.x;
  if (e == 0) total = 0;
  __syncthreads();
  const int32_t count = e < E ? tally[e] : 0;
  if (count != 0) atomicAdd(&total, static_cast<unsigned long long>(count));  // integers: exact in any order
  __syncthreads();
  if (e >= E) return;
  const int64_t load = static_cast<int64_t>(count) * E, t = static_cast<int64_t>(total);
  if (load > t) bias[e] = __fsub_rn(bias[e], gamma);
  else if (load < t) bias[e] = __fadd_rn(bias[e], gamma);
  tally[e] = 0;
}
}  // namespace

void router_bias_update_from_tally(int32_t* tally, int64_t E, float gamma, float* bias, cudaStream_t stream) {
  detail::check_bias_update("router_bias_update_from_tally", tally, E, 0, gamma, bias);
  bias_update_from_tally_kernel<<<1, static_cast<unsigned>(E), 0, stream>>>(tally, static_cast<int>(E), gamma, bias);
  CUDA_CHECK_LAUNCH();
}

void router_tally_counts(const int32_t* counts, int64_t E, int32_t* tally, cudaStream_t stream) {
  FP4MOE_CHECK(E >= 1 && E <= kRouterMaxExperts, "router_tally_counts: E must be in [1, {}], got E={}",
               kRouterMaxExperts, E);
  FP4MOE_CHECK(counts != nullptr && tally != nullptr, "router_tally_counts: null counts or tally");
  tally_counts_kernel<<<static_cast<unsigned>((E + 255) / 256), 256, 0, stream>>>(counts, static_cast<int>(E), tally);
  CUDA_CHECK_LAUNCH();
}

void expert_counts_and_offsets(const int32_t* topk_idx, int64_t T, int64_t k, int64_t E, int32_t* counts,
                               int32_t* offsets, cudaStream_t stream) {
  const char* what = "expert_counts_and_offsets";
  FP4MOE_CHECK(T >= 0 && k >= 1 && E >= 1 && k <= E && E <= kRouterMaxExperts,
               "{}: expected T >= 0, 1 <= k <= E <= {}, got T={} k={} E={}", what, kRouterMaxExperts, T, k, E);
  FP4MOE_CHECK(T <= (int64_t{1} << 31) / k - 1, "{}: T * k must fit in int32, got T={} k={}", what, T, k);
  FP4MOE_CHECK(counts != nullptr && offsets != nullptr && (T == 0 || topk_idx != nullptr), "{}: null pointer",
               what);
  CUDA_CHECK(cudaMemsetAsync(counts, 0, E * sizeof(int32_t), stream));
  if (T > 0) {
    const int64_t n = T * k;
    const unsigned grid = static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 1024));
    count_assignments_kernel<<<grid, 256, 0, stream>>>(topk_idx, n, static_cast<int>(E), counts);
    CUDA_CHECK_LAUNCH();
  }
  exclusive_scan_kernel<<<1, 32, 0, stream>>>(counts, static_cast<int>(E), offsets);
  CUDA_CHECK_LAUNCH();
}

void router_forward(const float* logits, const float* bias, int64_t T, int64_t E, const RouterConfig& cfg,
                    float* probs, int32_t* topk_idx, float* topk_weight, int32_t* counts, int32_t* offsets,
                    float* aux_loss, cudaStream_t stream) {
  const char* what = "router_forward";
  detail::check_router_shape(what, T, E, cfg);
  FP4MOE_CHECK(counts != nullptr && offsets != nullptr, "{}: counts [E] and offsets [E+1] must not be null", what);
  FP4MOE_CHECK(T == 0 || (logits && probs && topk_idx && topk_weight),
               "{}: logits [T, E], probs [T, E], topk_idx [T, k] and topk_weight [T, k] must not be null", what);
  const bool v3 = cfg.style == RouterStyle::v3_sigmoid;
  const int k = static_cast<int>(cfg.top_k);
  if (T > 0) {
    const size_t smem = kWarpsPerBlock * (2 * E + k) * sizeof(float);
    router_topk_kernel<<<blocks_for_tokens(T), kThreads, smem, stream>>>(
        logits, v3 ? bias : nullptr, T, static_cast<int>(E), k, v3, cfg.routed_scale, probs, topk_idx, topk_weight);
    CUDA_CHECK_LAUNCH();
  }
  expert_counts_and_offsets(topk_idx, T, k, E, counts, offsets, stream);
  if (!v3 && aux_loss) detail::launch_balance_loss(probs, counts, T, E, k, cfg.aux_alpha, aux_loss, stream);
}

void router_backward(const float* probs, const int32_t* topk_idx, const int32_t* counts, const float* dweights,
                     int64_t T, int64_t E, const RouterConfig& cfg, float aux_grad, float* dlogits,
                     cudaStream_t stream) {
  const char* what = "router_backward";
  detail::check_router_shape(what, T, E, cfg);
  if (T == 0) return;
  FP4MOE_CHECK(probs && topk_idx && counts && dweights && dlogits,
               "{}: probs [T, E], topk_idx [T, k], counts [E], dweights [T, k] and dlogits [T, E] must not be null",
               what);
  const bool v3 = cfg.style == RouterStyle::v3_sigmoid;
  const size_t smem = v3 ? 0 : kWarpsPerBlock * E * sizeof(float);
  router_backward_kernel<<<blocks_for_tokens(T), kThreads, smem, stream>>>(
      probs, topk_idx, counts, dweights, T, static_cast<int>(E), static_cast<int>(cfg.top_k), v3, cfg.routed_scale,
      cfg.aux_alpha, aux_grad, dlogits);
  CUDA_CHECK_LAUNCH();
}

}  // namespace fp4moe
