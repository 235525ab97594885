// AdamW (Loshchilov & Hutter 2019, decoupled weight decay) on FP32 master weights with a BF16 parameter copy, and the
// global gradient norm with its clipping scale. DeepSeek-V3 (sec. 4.2) trains with AdamW beta1 = 0.9, beta2 = 0.95,
// weight decay 0.1 and gradient clipping norm 1.0; the defaults below are those. The update follows PyTorch's
// torch.optim.AdamW, with the gradient first multiplied by the clipping scale:
//
//   g      = grad * grad_scale
//   m      = beta1 * m + (1 - beta1) * g
//   v      = beta2 * v + (1 - beta2) * g^2
//   master = master - lr * weight_decay * master                           (decoupled decay, skipped when 0)
//   master = master - (lr / (1 - beta1^step)) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
//   param  = BF16(master)                                                   (round to nearest even)
//
// The bias corrections are computed on the host in double from the 1-based step. All per-element math is FP32 on
// the GPU (the CPU reference uses double and agrees within FP32 rounding).
//
// Moment storage (MomentDtype): FP32, or BF16 as DeepSeek-V3 tracks them (technical report sec. 3.3.3,
// "Low-precision storage and communication": AdamW's first and second moments in BF16, master weights and
// gradients kept in FP32). With BF16 moments each element loads m and v exactly into FP32, runs the same FP32 math
// as above (this step's master update uses those FP32 m and v), and stores m and v rounded to BF16, round to
// nearest even (__float2bfloat16_rn; kernels/formats/formats.h's f32_to_bf16_bits on the host). One kernel serves
// both storages (a template on the moment type); only the loads and stores differ.
//
// Global norm (torch.nn.utils.clip_grad_norm_): norm = sqrt(sum over all tensors and elements of grad^2), summed in
// double in a fixed order (deterministic); clip scale = min(1, max_norm / (norm + 1e-6)), or NaN when the norm is
// not finite (the caller reads the norm and skips the step).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/types.h"

namespace fp4moe {

struct AdamWConfig {
  float lr = 0.0f;             // this step's learning rate (from the schedule), >= 0
  float beta1 = 0.9f;          // in [0, 1)
  float beta2 = 0.95f;         // in [0, 1)
  float eps = 1e-8f;           // > 0
  float weight_decay = 0.1f;   // >= 0; 0 for tensors without decay (norm weights, biases)
  int64_t step = 1;            // 1-based step count, for the bias corrections
};

// How AdamW's m and v are stored: FP32 (4 bytes per element each) or BF16 (2 bytes, DeepSeek-V3 sec. 3.3.3).
enum class MomentDtype { fp32, bf16 };
const char* moment_dtype_name(MomentDtype d);  // "fp32", "bf16": the values of the trainer's train.moments
int64_t moment_dtype_bytes(MomentDtype d);     // 4, 2

// One parameter tensor of n elements: FP32 master [n], BF16 param [n] (written), FP32 grad [n], moments m, v [n] of
// type Moment (float: FP32, bf16: BF16; updated in place). Device pointers with their element's alignment (4 bytes
// FP32, 2 bytes BF16); the 4-element vector path needs 16-byte aligned FP32 pointers and 8-byte aligned BF16 ones
// (param and BF16 moments), the scalar path takes the rest. The tensors must not overlap.
template <typename Moment>
struct AdamWTensorOf {
  float* master = nullptr;
  bf16* param = nullptr;
  const float* grad = nullptr;
  Moment* m = nullptr;
  Moment* v = nullptr;
  int64_t n = 0;
};
using AdamWTensor = AdamWTensorOf<float>;             // FP32 moments
using AdamWTensorBf16Moments = AdamWTensorOf<bf16>;  // BF16 moments (DeepSeek-V3 sec. 3.3.3)

// One AdamW step on `t`. grad_scale: device pointer to one FP32 value multiplying the gradient (the clip scale from
// grad_global_norm), or null for 1. Asynchronous on `stream`.
// Rejects (fp4moe::Error, before any launch): n < 0, lr < 0 or not finite, beta1/beta2 outside [0, 1), eps <= 0
// or not finite, weight_decay < 0 or not finite, step < 1, and for n > 0 null pointers or pointers without their
// element's alignment (FP32 4 bytes, BF16 param and moments 2 bytes). n = 0 launches nothing. Both overloads run
// the same kernel (the moment type a template parameter); with FP32 moments the results are those of the kernel
// before BF16 moments existed, bit for bit (the same per-element arithmetic).
void adamw_step(const AdamWTensor& t, const AdamWConfig& cfg, const float* grad_scale, cudaStream_t stream);
void adamw_step(const AdamWTensorBf16Moments& t, const AdamWConfig& cfg, const float* grad_scale,
                cudaStream_t stream);

// One FP32 gradient tensor [n] (device pointer, 4-byte aligned) of the global norm.
struct GradTensor {
  const float* grad = nullptr;
  int64_t n = 0;
};

constexpr int64_t kGradNormSlots = 1024;  // FP64 partial sums of the workspace

// Global L2 norm over `count` tensors (host array of descriptors of device tensors) and the clip scale.
// workspace: device FP64 [kGradNormSlots], contents ignored. norm_out, clip_scale_out: device FP32 scalars
// (clip_scale_out may be null). max_norm > 0; +Inf disables clipping (scale 1 for any finite norm).
// Deterministic: the summation order depends only on the tensor list. count = 0 gives norm 0 and scale 1.
// Rejects: count < 0, null tensors with count > 0, a tensor with n < 0 or (n > 0) a null or misaligned pointer,
// max_norm not > 0 (NaN included), null workspace or norm_out.
void grad_global_norm(const GradTensor* tensors, int count, float max_norm, double* workspace, float* norm_out,
                      float* clip_scale_out, cudaStream_t stream);

// ---- CPU references (adamw_ref.cpp) --------------------------------------------------------------------------

// adamw_step on host memory in double (each stored value rounded once: FP32 master, m and v or BF16 m and v, BF16
// param; the master update uses the unrounded double m and v); grad_scale is the value itself. Same rejections
// (alignment aside).
void adamw_step_ref(const AdamWTensor& t, const AdamWConfig& cfg, float grad_scale);
void adamw_step_ref(const AdamWTensorBf16Moments& t, const AdamWConfig& cfg, float grad_scale);

// Global norm (double) of host tensors, and the clip scale of `max_norm` by the rule above.
double grad_global_norm_ref(const GradTensor* tensors, int count);
float grad_clip_scale(double norm, float max_norm);

namespace nn_detail {
// Shared argument checks (adamw_ref.cpp).
template <typename Moment>
void check_adamw(const char* what, const AdamWTensorOf<Moment>& t, const AdamWConfig& cfg, bool device);
void check_grad_tensors(const char* what, const GradTensor* tensors, int count, float max_norm, bool device);
}  // namespace nn_detail

}  // namespace fp4moe
