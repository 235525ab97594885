// Router combine weights for a given selection (router_gates.h): one thread per token for the weights (k is small);
// the v2 balance loss is router.cu's (detail::launch_balance_loss).
#include <algorithm>

#include "kernels/common/check.h"
#include "kernels/common/types.h"
#include "kernels/nn/router_gates.h"

namespace fp4moe {
namespace {

constexpr int kThreads = 256;

// probs [T, E], topk_idx [T, k] -> topk_weight [T, k].
__global__ void __launch_bounds__(kThreads)
router_gates_kernel(const float* __restrict__ probs, const int32_t* __restrict__ topk_idx, int64_t T, int E, int k,
                    bool v3, float scale, float* __restrict__ topk_weight) {
  for (int64_t t = int64_t{blockIdx.x} * kThreads + threadIdx.x; t < T; t += int64_t{gridDim.x} * kThreads) {
    const float* p = probs + t * E;
    const int32_t* idx = topk_idx + t * k;
    bool valid = true;
    for (int j = 0; j < k; ++j) valid = valid && idx[j] >= 0 && idx[j] < E;
    if (!valid) {
      for (int j = 0; j < k; ++j) topk_weight[t * k + j] = __int_as_float(0x7fc00000);  // NaN: never read p[-1]
      continue;
    }
    float denom = 1.0f;
    if (v3) {
      denom = 0.0f;
      for (int j = 0; j < k; ++j) denom = __fadd_rn(denom, p[idx[j]]);
    }
    for (int j = 0; j < k; ++j) topk_weight[t * k + j] = __fmul_rn(scale, __fdiv_rn(p[idx[j]], denom));
  }
}

}  // namespace

void router_gates_for_indices(const float* probs, const int32_t* topk_idx, const int32_t* counts, int64_t T,
                              int64_t E, const RouterConfig& cfg, float* topk_weight, float* aux_loss,
                              cudaStream_t stream) {
  const char* what = "router_gates_for_indices";
  const bool loss = detail::check_router_gates(what, probs, topk_idx, counts, T, E, cfg, topk_weight, aux_loss);
  const bool v3 = cfg.style == RouterStyle::v3_sigmoid;
  if (T > 0) {
    const unsigned grid = static_cast<unsigned>(std::min<int64_t>(ceil_div(T, kThreads), int64_t{132} * 16));
    router_gates_kernel<<<grid, kThreads, 0, stream>>>(probs, topk_idx, T, static_cast<int>(E),
                                                       static_cast<int>(cfg.top_k), v3, cfg.routed_scale,
                                                       topk_weight);
    CUDA_CHECK_LAUNCH();
  }
  if (loss) detail::launch_balance_loss(probs, counts, T, E, cfg.top_k, cfg.aux_alpha, aux_loss, stream);
}

}  // namespace fp4moe
