// Rotary position embedding on the decoupled RoPE part of MLA's queries and keys (DeepSeek-V2 sec. 2.1.3,
// DeepSeek-V3 sec. 2.1.1: q_pe [T, H, 64] per head, k_pe [T, 1, 64] shared by the heads; rope head dim 64,
// theta = 10000 in both configurations; the YaRN extension of V3's long-context stage is not applied here).
//
// Pair convention: INTERLEAVED. Elements (2i, 2i+1) of a head's D-vector form pair i, i = 0 .. D/2 - 1, rotated as
// the complex number x[2i] + j x[2i+1] times exp(j * p * inv_freq[i]) (DeepSeek-V3's reference apply_rotary_emb,
// view_as_complex over consecutive pairs; not the rotate-half layout of the Hugging Face port):
//   y[2i]   = x[2i] cos(a) - x[2i+1] sin(a)
//   y[2i+1] = x[2i] sin(a) + x[2i+1] cos(a),      a = fl32(p * inv_freq[i])
//   inv_freq[i] = fl32(theta^(-2i / D))             (rope_inv_freq, computed in double and rounded to FP32)
//   p = position_offset + (t mod seq_len)           token t of the [T] rows; T = batch x seq_len (or one
//                                                   sequence, seq_len = T), position_offset for continuation
// Backward is the inverse rotation (angle -a): dx[2i] = dy[2i] cos + dy[2i+1] sin, dx[2i+1] = -dy[2i] sin +
// dy[2i+1] cos. The angle product is rounded to FP32 on both the GPU and the CPU reference; cos/sin and the rotation
// are FP32 on the GPU (sincosf, full range reduction) and double in the reference; outputs rounded once to BF16.
//
// Layout: x, y [T, H, D] BF16 with element (t, h, d) at t * token_stride + h * head_stride + d (elements), so that
// the rope part of a wider tensor can be addressed in place (q [T, H, 192]: x = q + 128, token_stride = H * 192,
// head_stride = 192; k_pe inside the kv down-projection output [T, 576]: x = kv + 512, token_stride = 576).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/common/types.h"

namespace fp4moe {

struct RopeConfig {
  float theta = 10000.0f;       // base; DeepSeek-V3 rope_theta
  int64_t position_offset = 0;  // position of row t = 0 (>= 0)
  int64_t seq_len = 0;          // positions restart every seq_len rows; 0 means one sequence of T rows
};

// A strided [T, H, D] BF16 view (strides in elements).
struct RopeTensor {
  const bf16* data = nullptr;
  int64_t token_stride = 0;
  int64_t head_stride = 0;
};
struct RopeTensorOut {
  bf16* data = nullptr;
  int64_t token_stride = 0;
  int64_t head_stride = 0;
};

constexpr int64_t kRopeMaxDim = 256;  // D limit: the frequency table travels as a kernel argument

// inv_freq[i] = theta^(-2i/D) in double, rounded to FP32; the GPU launcher and the reference both use this.
inline float rope_inv_freq(double theta, int64_t D, int64_t i) {
  return static_cast<float>(std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(D)));
}

// Forward: y = rotate(x). In place (y.data == x.data with equal strides) is allowed; other overlaps are not.
// Device pointers. D % 8 == 0, strides % 8 == 0 and 16-byte aligned data take the 16-byte vector path, otherwise
// one pair (4 bytes) per access.
// Rejects (fp4moe::Error, before any launch): T < 0, H < 1, D < 2, odd D, D > kRopeMaxDim, T * H * D beyond 2^62,
// odd strides, strides smaller than the dense ones (head_stride < D, or token_stride < H * head_stride when H > 1,
// token_stride < D when H == 1), theta not finite or <= 1, position_offset < 0, seq_len < 0, a largest position
// position_offset + min(T, seq_len) - 1 at or above 2^24 (not exact in FP32), and for T > 0 null or misaligned
// (4 bytes) data. T = 0 launches nothing. Asynchronous on `stream`.
void rope_forward(RopeTensor x, int64_t T, int64_t H, int64_t D, const RopeConfig& cfg, RopeTensorOut y,
                  cudaStream_t stream);

// Backward: dx = rotate^-1(dy), same layouts, rules and rejections as rope_forward (dx may be dy: in place).
void rope_backward(RopeTensor dy, int64_t T, int64_t H, int64_t D, const RopeConfig& cfg, RopeTensorOut dx,
                   cudaStream_t stream);

// ---- CPU references (rope_ref.cpp) ---------------------------------------------------------------------------

// Same contract on host memory (strided views too): angles as above, cos/sin and rotation in double, one
// rounding to BF16. Same rejections (alignment aside). `inverse` selects backward.
void rope_ref(RopeTensor x, int64_t T, int64_t H, int64_t D, const RopeConfig& cfg, RopeTensorOut y, bool inverse);

// Dense [T, H, D] double version (forward or inverse rotation), for finite-difference checks.
void rope_f64(const double* x, int64_t T, int64_t H, int64_t D, const RopeConfig& cfg, double* y, bool inverse);

namespace nn_detail {
// Shared argument checks of rope_forward/rope_backward/rope_ref (rope_ref.cpp).
void check_rope(const char* what, const RopeTensor& x, int64_t T, int64_t H, int64_t D, const RopeConfig& cfg,
                const RopeTensorOut& y, bool device);
}  // namespace nn_detail

}  // namespace fp4moe
