// CPU reference of the MLA data movements (mla_ops.h) and the shape checks shared with the GPU launchers.
#include "kernels/formats/formats.h"
#include "kernels/nn/mla_ops.h"
#include "kernels/nn/nn_checks.h"

namespace fp4moe {

namespace nn_detail {

void check_mla_dims(const char* what, int64_t M, const MlaDims& dims, int64_t pe_stride) {
  check_at_least(what, "M", M, 0);
  check_at_least(what, "H", dims.H, 1);
  check_at_least(what, "nope", dims.nope, 1);
  check_at_least(what, "rope", dims.rope, 1);
  check_at_least(what, "dv", dims.dv, 1);
  FP4MOE_CHECK(pe_stride >= dims.rope, "{}: pe_stride={} is below rope={} (rows of k_pe would overlap)", what,
               pe_stride, dims.rope);
  check_elements(what, dims.H, dims.nope + dims.rope + dims.dv);
  check_elements(what, M, dims.H * (dims.nope + dims.rope + dims.dv));
  check_elements(what, M, pe_stride);
}

}  // namespace nn_detail

void mla_assemble_k_ref(const bf16* kv, const bf16* k_pe, int64_t pe_stride, int64_t M, const MlaDims& dims, bf16* k) {
  nn_detail::check_mla_dims("mla_assemble_k_ref", M, dims, pe_stride);
  const int64_t H = dims.H, dqk = dims.nope + dims.rope, dkv = dims.nope + dims.dv;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t h = 0; h < H; ++h) {
      bf16* out = k + (m * H + h) * dqk;
      for (int64_t i = 0; i < dims.nope; ++i) out[i] = kv[(m * H + h) * dkv + i];
      for (int64_t i = 0; i < dims.rope; ++i) out[dims.nope + i] = k_pe[m * pe_stride + i];
    }
}

void mla_split_dk_ref(const bf16* dk, int64_t M, const MlaDims& dims, bf16* dkv, bf16* dk_pe, int64_t pe_stride) {
  nn_detail::check_mla_dims("mla_split_dk_ref", M, dims, pe_stride);
  const int64_t H = dims.H, dqk = dims.nope + dims.rope, dkv_dim = dims.nope + dims.dv;
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < dims.nope; ++i) dkv[(m * H + h) * dkv_dim + i] = dk[(m * H + h) * dqk + i];
    for (int64_t i = 0; i < dims.rope; ++i) {
      float sum = 0.0f;
      for (int64_t h = 0; h < H; ++h) sum += bf16_bits_to_f32(bf16_bits(dk[(m * H + h) * dqk + dims.nope + i]));
      dk_pe[m * pe_stride + i] = bf16_from_bits(f32_to_bf16_bits(sum));
    }
  }
}

}  // namespace fp4moe
