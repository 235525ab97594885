// Argument checks of the attention launchers and CPU references (flash_attention.h), run on the host before any
// launch so that every rejection is an fp4moe::Error naming the value and what was expected.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/attention/flash_attention.h"

namespace fp4moe::attn_detail {

// "(32,16), (32,32), ..." from kAttentionPairs.
std::string supported_pairs_text();
bool is_supported_pair(int64_t Dqk, int64_t Dv);

// B, T, H >= 0, Dqk, Dv >= 1, scale finite, element counts below 2^62 (the reference's rules). Returns false when
// there is nothing to do (B, T or H is 0).
bool check_shape_ref(const char* what, const AttentionShape& s);

// The GPU launchers' rules: check_shape_ref's, plus (Dqk, Dv) in kAttentionPairs, scale > 0, T <= kAttentionMaxT
// and B * H below 2^31. Returns false when there is nothing to do.
bool check_shape_device(const char* what, const AttentionShape& s);

// A strided [B*T, H, D] device tensor `name`: data non-null and 16-byte aligned, strides non-negative multiples of 8
// elements, heads not overlapping (head_stride >= D when H > 1), token_stride >= (H - 1) * head_stride + D, and its
// last element's offset below 2^62.
void check_tensor(const char* what, const char* name, const void* data, int64_t token_stride, int64_t head_stride,
                  const AttentionShape& s, int64_t D);
// check_tensor's rules on the strides alone (a layout without its pointer).
void check_strides(const char* what, const char* name, int64_t token_stride, int64_t head_stride,
                   const AttentionShape& s, int64_t D);

// A device FP32 buffer `name`: non-null and 4-byte aligned.
void check_f32_buffer(const char* what, const char* name, const void* p);

// Every check of a flash_attention_forward call (shape, q, k, v, o, lse), in that order. Returns false when there is
// nothing to do (B, T or H is 0; the pointers are then not looked at).
bool check_forward_call(const char* what, const AttentionShape& s, AttnIn q, AttnIn k, AttnIn v, AttnOut o,
                        const float* lse);

// Every check of a flash_attention_backward call (shape, q, k, v, o, dout, dq, dk, dv, lse, workspace). Returns
// false when there is nothing to do.
bool check_backward_call(const char* what, const AttentionShape& s, AttnIn q, AttnIn k, AttnIn v, AttnIn o,
                         AttnIn dout, const float* lse, AttnOut dq, AttnOut dk, AttnOut dv, const void* workspace);

}  // namespace fp4moe::attn_detail
