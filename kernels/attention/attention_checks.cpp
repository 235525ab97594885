// Argument checks shared by the attention launchers and references (attention_checks.h).
#include "kernels/attention/attention_checks.h"

#include <fmt/format.h>

#include <cmath>

#include "kernels/common/check.h"

namespace fp4moe::attn_detail {
namespace {

constexpr int64_t kMaxElements = int64_t{1} << 62;

// a * b < 2^62 for a, b >= 0.
bool product_fits(int64_t a, int64_t b) { return a == 0 || b < kMaxElements / a; }

}  // namespace

std::string supported_pairs_text() {
  std::string s;
  for (const auto& p : kAttentionPairs) s += fmt::format("{}({},{})", s.empty() ? "" : ", ", p[0], p[1]);
  return s;
}

bool is_supported_pair(int64_t Dqk, int64_t Dv) {
  for (const auto& p : kAttentionPairs)
    if (p[0] == Dqk && p[1] == Dv) return true;
  return false;
}

bool check_shape_ref(const char* what, const AttentionShape& s) {
  FP4MOE_CHECK(s.B >= 0 && s.T >= 0 && s.H >= 0, "{}: B, T, H must be >= 0, got B={} T={} H={}", what, s.B, s.T,
               s.H);
  FP4MOE_CHECK(s.Dqk >= 1 && s.Dv >= 1, "{}: Dqk and Dv must be >= 1, got Dqk={} Dv={}", what, s.Dqk, s.Dv);
  FP4MOE_CHECK(std::isfinite(s.scale), "{}: scale must be finite, got {}", what, s.scale);
  const int64_t D = s.Dqk > s.Dv ? s.Dqk : s.Dv;
  FP4MOE_CHECK(product_fits(s.B, s.T) && product_fits(s.B * s.T, s.H) && product_fits(s.B * s.T * s.H, D),
               "{}: B*T*H*D = {}*{}*{}*{} elements exceed 2^62", what, s.B, s.T, s.H, D);
  return s.B > 0 && s.T > 0 && s.H > 0;
}

bool check_shape_device(const char* what, const AttentionShape& s) {
  FP4MOE_CHECK(s.B >= 0 && s.T >= 0 && s.H >= 0, "{}: B, T, H must be >= 0, got B={} T={} H={}", what, s.B, s.T,
               s.H);
  FP4MOE_CHECK(is_supported_pair(s.Dqk, s.Dv), "{}: (Dqk, Dv) = ({},{}) is not supported; supported pairs: {}", what,
               s.Dqk, s.Dv, supported_pairs_text());
  FP4MOE_CHECK(std::isfinite(s.scale) && s.scale > 0, "{}: scale must be finite and > 0, got {}", what, s.scale);
  FP4MOE_CHECK(s.T <= kAttentionMaxT, "{}: T={} exceeds the supported {} tokens per sequence", what, s.T,
               kAttentionMaxT);
  FP4MOE_CHECK(s.B == 0 || s.H <= ((int64_t{1} << 31) - 1) / s.B,
               "{}: B*H = {}*{} exceeds 2^31 - 1 (one thread block column per sequence and head)", what, s.B, s.H);
  return check_shape_ref(what, s);
}

void check_tensor(const char* what, const char* name, const void* data, int64_t token_stride, int64_t head_stride,
                  const AttentionShape& s, int64_t D) {
  FP4MOE_CHECK(data != nullptr, "{}: {}.data is null (a device pointer is required)", what, name);
  FP4MOE_CHECK(reinterpret_cast<uintptr_t>(data) % 16 == 0, "{}: {}.data must be 16-byte aligned, got address {:#x}",
               what, name, reinterpret_cast<uintptr_t>(data));
  check_strides(what, name, token_stride, head_stride, s, D);
}

void check_strides(const char* what, const char* name, int64_t token_stride, int64_t head_stride,
                   const AttentionShape& s, int64_t D) {
  FP4MOE_CHECK(token_stride >= 0 && token_stride % 8 == 0,
               "{}: {}.token_stride must be a non-negative multiple of 8 elements (16 bytes), got {}", what, name,
               token_stride);
  FP4MOE_CHECK(head_stride >= 0 && head_stride % 8 == 0,
               "{}: {}.head_stride must be a non-negative multiple of 8 elements (16 bytes), got {}", what, name,
               head_stride);
  FP4MOE_CHECK(s.H == 1 || head_stride >= D, "{}: {}.head_stride={} is below D={} (heads would overlap)", what, name,
               head_stride, D);
  FP4MOE_CHECK(product_fits(s.H, head_stride) && product_fits(s.B * s.T, token_stride),
               "{}: {} spans beyond 2^62 elements (token_stride={}, head_stride={}, {} rows)", what, name,
               token_stride, head_stride, s.B * s.T);
  const int64_t row = (s.H - 1) * head_stride + D;
  FP4MOE_CHECK(token_stride >= row, "{}: {}.token_stride={} is below the {} elements of one token's heads", what,
               name, token_stride, row);
}

void check_f32_buffer(const char* what, const char* name, const void* p) {
  FP4MOE_CHECK(p != nullptr, "{}: {} is null (a device pointer is required)", what, name);
  FP4MOE_CHECK(reinterpret_cast<uintptr_t>(p) % 4 == 0, "{}: {} must be 4-byte aligned, got address {:#x}", what,
               name, reinterpret_cast<uintptr_t>(p));
}

bool check_forward_call(const char* what, const AttentionShape& s, AttnIn q, AttnIn k, AttnIn v, AttnOut o,
                        const float* lse) {
  if (!check_shape_device(what, s)) return false;
  check_tensor(what, "q", q.data, q.token_stride, q.head_stride, s, s.Dqk);
  check_tensor(what, "k", k.data, k.token_stride, k.head_stride, s, s.Dqk);
  check_tensor(what, "v", v.data, v.token_stride, v.head_stride, s, s.Dv);
  check_tensor(what, "o", o.data, o.token_stride, o.head_stride, s, s.Dv);
  check_f32_buffer(what, "lse", lse);
  return true;
}

bool check_backward_call(const char* what, const AttentionShape& s, AttnIn q, AttnIn k, AttnIn v, AttnIn o,
                         AttnIn dout, const float* lse, AttnOut dq, AttnOut dk, AttnOut dv, const void* workspace) {
  if (!check_shape_device(what, s)) return false;
  check_tensor(what, "q", q.data, q.token_stride, q.head_stride, s, s.Dqk);
  check_tensor(what, "k", k.data, k.token_stride, k.head_stride, s, s.Dqk);
  check_tensor(what, "v", v.data, v.token_stride, v.head_stride, s, s.Dv);
  check_tensor(what, "o", o.data, o.token_stride, o.head_stride, s, s.Dv);
  check_tensor(what, "dout", dout.data, dout.token_stride, dout.head_stride, s, s.Dv);
  check_tensor(what, "dq", dq.data, dq.token_stride, dq.head_stride, s, s.Dqk);
  check_tensor(what, "dk", dk.data, dk.token_stride, dk.head_stride, s, s.Dqk);
  check_tensor(what, "dv", dv.data, dv.token_stride, dv.head_stride, s, s.Dv);
  check_f32_buffer(what, "lse", lse);
  check_f32_buffer(what, "workspace", workspace);
  return true;
}

}  // namespace fp4moe::attn_detail
