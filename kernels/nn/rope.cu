// Decoupled RoPE kernels (rope.h). Elementwise and memory-bound: each thread rotates kPairs consecutive pairs of one
// token in up to 16 heads (kPairs = 4: one 16-byte access per head, when D % 8 == 0, the strides are multiples of 8
// and the data 16-byte aligned; kPairs = 1: one 4-byte access), grid-stride over T x ceil(H / 16) x D / (2 kPairs)
// units. The FP32 inverse frequencies travel in the kernel arguments; the angle is fl32(p * inv_freq[i]) and
// sincosf reduces it over its full range.
#include <algorithm>

#include "kernels/nn/nn_checks.h"
#include "kernels/nn/nn_vec.cuh"
#include "kernels/nn/rope.h"

namespace fp4moe {
namespace {

constexpr int kThreads = 256;

struct InvFreqTable {
  float v[kRopeMaxDim / 2];
};

// Unit = (token t, group j of kPairs pairs, group of up to kHeadsPerUnit heads): the angles' sincosf is computed
// once per unit and reused for its heads (q_pe has 128), which keeps the kernel memory-bound while small T still
// spreads over many threads.
constexpr int64_t kHeadsPerUnit = 16;

template <int kPairs>
__global__ void __launch_bounds__(kThreads)
rope_kernel(const bf16* x, int64_t x_token_stride, int64_t x_head_stride, bf16* y, int64_t y_token_stride,
            int64_t y_head_stride, int64_t T, int64_t H, int64_t D, int64_t position_offset, int64_t period,
            bool inverse, InvFreqTable inv_freq) {
  constexpr int kVec = 2 * kPairs;
  static_assert(kVec == 2 || kVec == 8, "one pair (4 bytes) or four pairs (16 bytes) per access");
  const int64_t pair_groups = D / kVec, head_groups = (H + kHeadsPerUnit - 1) / kHeadsPerUnit;
  const int64_t units = T * head_groups * pair_groups;
  for (int64_t u = int64_t{blockIdx.x} * kThreads + threadIdx.x; u < units; u += int64_t{gridDim.x} * kThreads) {
    const int64_t j = u % pair_groups, rest = u / pair_groups;
    const int64_t h0 = (rest % head_groups) * kHeadsPerUnit, t = rest / head_groups;
    const int64_t h1 = h0 + kHeadsPerUnit < H ? h0 + kHeadsPerUnit : H;
    const int64_t d0 = j * kVec;
    const float p = static_cast<float>(position_offset + t % period);
    float cos_a[kPairs], sin_a[kPairs];
#pragma unroll
    for (int k = 0; k < kPairs; ++k) {
      sincosf(__fmul_rn(p, inv_freq.v[d0 / 2 + k]), &sin_a[k], &cos_a[k]);
      if (inverse) sin_a[k] = -sin_a[k];
    }
    const bf16* xp = x + t * x_token_stride + d0;
    bf16* yp = y + t * y_token_stride + d0;
#pragma unroll 4
    for (int64_t h = h0; h < h1; ++h) {
      float v[kVec], out[kVec];
      if constexpr (kVec == 8) {
        nn_detail::load_bf16<8>(xp + h * x_head_stride, v);
      } else {
        const __nv_bfloat162 pair = *reinterpret_cast<const __nv_bfloat162*>(xp + h * x_head_stride);
        v[0] = __low2float(pair);
        v[1] = __high2float(pair);
      }
#pragma unroll
      for (int k = 0; k < kPairs; ++k) {
        out[2 * k] = v[2 * k] * cos_a[k] - v[2 * k + 1] * sin_a[k];
        out[2 * k + 1] = v[2 * k] * sin_a[k] + v[2 * k + 1] * cos_a[k];
      }
      if constexpr (kVec == 8) {
        nn_detail::store_bf16<8>(yp + h * y_head_stride, out);
      } else {
        *reinterpret_cast<__nv_bfloat162*>(yp + h * y_head_stride) = __floats2bfloat162_rn(out[0], out[1]);
      }
    }
  }
}

void rope_launch(const char* what, RopeTensor x, int64_t T, int64_t H, int64_t D, const RopeConfig& cfg,
                 RopeTensorOut y, bool inverse, cudaStream_t stream) {
  nn_detail::check_rope(what, x, T, H, D, cfg, y, /*device=*/true);
  if (T == 0) return;
  InvFreqTable table{};
  for (int64_t i = 0; i < D / 2; ++i) table.v[i] = rope_inv_freq(cfg.theta, D, i);
  const int64_t period = cfg.seq_len > 0 ? cfg.seq_len : T;
  const bool vec = D % 8 == 0 && x.token_stride % 8 == 0 && x.head_stride % 8 == 0 && y.token_stride % 8 == 0 &&
                   y.head_stride % 8 == 0 && nn_detail::is_aligned(x.data, 16) && nn_detail::is_aligned(y.data, 16);
  const int64_t units = T * ceil_div(H, kHeadsPerUnit) * (D / (vec ? 8 : 2));
  const unsigned grid = static_cast<unsigned>(std::clamp<int64_t>(ceil_div(units, kThreads), 1, 132 * 16));
  if (vec)
    rope_kernel<4><<<grid, kThreads, 0, stream>>>(x.data, x.token_stride, x.head_stride, y.data, y.token_stride,
                                                  y.head_stride, T, H, D, cfg.position_offset, period, inverse,
                                                  table);
  else
    rope_kernel<1><<<grid, kThreads, 0, stream>>>(x.data, x.token_stride, x.head_stride, y.data, y.token_stride,
                                                  y.head_stride, T, H, D, cfg.position_offset, period, inverse,
                                                  table);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void rope_forward(RopeTensor x, int64_t T, int64_t H, int64_t D, const RopeConfig& cfg, RopeTensorOut y,
                  cudaStream_t stream) {
  rope_launch("rope_forward", x, T, H, D, cfg, y, /*inverse=*/false, stream);
}

void rope_backward(RopeTensor dy, int64_t T, int64_t H, int64_t D, const RopeConfig& cfg, RopeTensorOut dx,
                   cudaStream_t stream) {
  rope_launch("rope_backward", dy, T, H, D, cfg, dx, /*inverse=*/true, stream);
}

}  // namespace fp4moe
