// GPU causal flash attention (kernels/attention/flash_attention.h) against the FP64 CPU reference on the same BF16
// inputs: forward (O, lse) and backward (dQ, dK, dV, from the kernel's own O and lse) through the public functions,
// every instantiated (Dqk, Dv) pair at (B, T, H) = (1, 1, 1), (2, 37, 3), (1, 128, 2), (2, 200, 4), (2, 100, 9),
// plus (1, 1024, 2) for (192, 128). The pairs cover both kernel families of attention_heuristics.h: Dqk < 128 runs
// the key64 forward and the column_split backward, Dqk >= 128 the key32 forward and the role_split backward (whose
// head-grouped block order (2, 100, 9) exercises with 18 sequence-heads: three groups, the last one partial).
// Inputs N(0, 1) (seeded); the large-score case adds 150 / scale on dim 0 of every query and 1 (keys from token 64
// on) or 2/3 (earlier keys) on dim 0 of the keys: scores around 100 and 150 (e^150 overflows FP32, so the running
// max must be subtracted), and a jump of 50 in the row max between key blocks (the rescaling of the online softmax).
// Strided views: q and dq inside [B*T, H, Dqk + 8] buffers (head stride Dqk + 8), v and dk at an offset of 8
// elements with token stride H * D + 16, o inside [B*T, H, Dv + 8]; they must give the same bits as dense tensors,
// and the elements between them must stay untouched. Every output buffer (and the backward workspace) is
// NaN-poisoned before each run, with poisoned guards on both sides.
// Tolerances, relative L2 per tensor: O < 1e-2 (BF16 rounding of P and O), dQ, dK, dV < 2e-2 (BF16 rounding of P
// and dS, D from the BF16 O); the reference norm is floored at an RMS of 1e-3 (T = 1 has dQ = dK = 0 exactly).
// lse: |error| <= 1e-4 max(1, |lse|) (FP32 scores). Forward and backward run twice and must give the same bits (no
// atomics), and backward again three times on shapes with many more thread blocks than SMs. The checks are
// tests/common/attention_test_util.h's, shared with the cuDNN backend's test (test_cudnn_sdpa_gpu.cpp).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <initializer_list>
#include <string>

#include "kernels/attention/attention_heuristics.h"
#include "kernels/attention/flash_attention.h"
#include "tests/common/attention_test_util.h"

namespace fp4moe {
namespace {

using test::AttnCase;
using test::AttnDevTensor;
using test::AttnOutputs;
using test::dense_layout;
using test::Guarded;

constexpr int kPairs[][2] = {{32, 16}, {32, 32}, {64, 64}, {96, 64}, {128, 128}, {192, 128}, {192, 192}};

struct Btth {
  int64_t B, T, H;
};
// (2, 100, 9): 18 sequence-heads, three groups of the head-grouped block order (the last one partial).
constexpr Btth kShapes[] = {{1, 1, 1}, {2, 37, 3}, {1, 128, 2}, {2, 200, 4}, {2, 100, 9}};

// Our kernels through the public functions; the backward workspace NaN-poisoned before each run.
test::AttentionImpl own_kernels() {
  test::AttentionImpl impl;
  impl.name = "own";
  impl.forward = [](const AttentionShape& s, AttnIn q, AttnIn k, AttnIn v, AttnOut o, float* lse) {
    flash_attention_forward(s, q, k, v, o, lse, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
  };
  impl.backward = [](const AttentionShape& s, AttnIn q, AttnIn k, AttnIn v, AttnIn o, AttnIn dout, const float* lse,
                     AttnOut dq, AttnOut dk, AttnOut dv) {
    test::DeviceBuffer<unsigned char> ws(static_cast<size_t>(flash_attention_backward_workspace_bytes(s)));
    ws.poison(test::kNanPoison);
    flash_attention_backward(s, q, k, v, o, dout, lse, dq, dk, dv, ws.ptr, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
  };
  return impl;
}

// The kernels the public functions run for (Dqk, Dv) (attention_heuristics.h), for traces.
std::string kernels_of(int Dqk, int Dv) {
  const bool key32 = attn::forward_kernel_for(Dqk, Dv) == attn::FwdKernel::key32;
  const bool role_split = attn::backward_kernels_for(Dqk, Dv) == attn::BwdKernels::role_split;
  return fmt::format("forward {}, backward {}", key32 ? "key32" : "key64", role_split ? "role_split" : "column_split");
}

// run_and_check (tests/common/attention_test_util.h) on our kernels, the kernel family in the trace.
AttnOutputs run_and_check(const AttnCase& c) {
  SCOPED_TRACE(kernels_of(c.Dqk, c.Dv));
  return test::run_and_check(c, own_kernels());
}

TEST(AttentionGpu, ForwardBackwardMatchReference) {
  FP4MOE_REQUIRE_DEVICE();
  for (const auto& p : kPairs)
    for (const Btth& sh : kShapes) run_and_check({p[0], p[1], sh.B, sh.T, sh.H});
  run_and_check({192, 128, 1, 1024, 2});
}

TEST(AttentionGpu, LargeScoresUseTheOnlineMax) {
  FP4MOE_REQUIRE_DEVICE();
  for (const auto& p : kPairs) {
    run_and_check({p[0], p[1], 1, 128, 2, false, true});
    run_and_check({p[0], p[1], 2, 200, 4, false, true});
  }
}

TEST(AttentionGpu, StridedViewsGiveTheSameBitsAsDenseTensors) {
  FP4MOE_REQUIRE_DEVICE();
  for (const auto& p : kPairs)
    for (const Btth& sh : {Btth{2, 37, 3}, Btth{1, 128, 2}}) {
      SCOPED_TRACE(fmt::format("({}, {}) T={}", p[0], p[1], sh.T));
      const AttnOutputs a = run_and_check({p[0], p[1], sh.B, sh.T, sh.H, false});
      const AttnOutputs b = run_and_check({p[0], p[1], sh.B, sh.T, sh.H, true});
      EXPECT_EQ(a.o, b.o) << "O";
      EXPECT_EQ(a.lse, b.lse) << "lse";
      EXPECT_EQ(a.dq, b.dq) << "dQ";
      EXPECT_EQ(a.dk, b.dk) << "dK";
      EXPECT_EQ(a.dv, b.dv) << "dV";
    }
}

// Backward on more thread blocks than the GPU runs at once (48 sequence-heads x 24 key blocks at (192, 128), the
// role_split kernels in the head-grouped order; 192 x 6 at (32, 16), the column_split kernels): every output written
// (finite, nothing outside the tensors) and the same bits over three runs.
TEST(AttentionGpu, BackwardIsDeterministicWithManyBlocksInFlight) {
  FP4MOE_REQUIRE_DEVICE();
  for (const AttnCase& c : {AttnCase{192, 128, 2, 1536, 24}, AttnCase{32, 16, 2, 333, 96}}) {
    SCOPED_TRACE(kernels_of(c.Dqk, c.Dv));
    test::check_backward_repeatable(c, own_kernels());
  }
}

TEST(AttentionGpu, BadInputsAreRejectedBeforeAnyLaunch) {
  FP4MOE_REQUIRE_DEVICE();
  const int64_t B = 1, T = 16, H = 2, Dqk = 96, Dv = 64;
  const AttentionShape s{B, T, H, Dqk, Dv, 0.1f};
  AttnDevTensor q(dense_layout(B * T, H, Dqk)), k(dense_layout(B * T, H, Dqk)), v(dense_layout(B * T, H, Dv));
  AttnDevTensor o(dense_layout(B * T, H, Dv));
  Guarded<float> lse(static_cast<size_t>(B * H * T));
  const auto expect_rejected = [&](const AttentionShape& shape, AttnIn qi, AttnIn vi, float* l,
                                   std::initializer_list<const char*> parts) {
    try {
      flash_attention_forward(shape, qi, k.in(), vi, o.out(), l, nullptr);
      ADD_FAILURE() << "expected fp4moe::Error mentioning " << *parts.begin();
    } catch (const Error& e) {
      for (const char* part : parts) EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  AttentionShape unsupported = s;
  unsupported.Dqk = 100;
  expect_rejected(unsupported, q.in(), v.in(), lse.ptr(), {"(100,64)", "(96,64)", "(192,128)"});
  AttnIn bad_stride = q.in();
  bad_stride.token_stride += 4;
  expect_rejected(s, bad_stride, v.in(), lse.ptr(), {"q.token_stride", "multiple of 8"});
  AttnIn bad_pointer = v.in();
  bad_pointer.data += 1;
  expect_rejected(s, q.in(), bad_pointer, lse.ptr(), {"v.data", "16-byte aligned"});
  expect_rejected(s, q.in(), v.in(), nullptr, {"lse is null"});
  AttentionShape empty = s;
  empty.T = 0;
  EXPECT_NO_THROW(flash_attention_forward(empty, q.in(), k.in(), v.in(), o.out(), lse.ptr(), nullptr));
  CUDA_CHECK(cudaDeviceSynchronize());
  for (bf16 x : o.buf.download()) ASSERT_EQ(bf16_bits(x), 0xFFFF) << "a rejected or empty call wrote the output";
  for (float x : lse.download()) ASSERT_TRUE(std::isnan(x)) << "a rejected or empty call wrote lse";
}

}  // namespace
}  // namespace fp4moe
