// GPU causal flash attention (kernels/attention/flash_attention.h) against the FP64 CPU reference on the same BF16
// inputs: forward (O, lse) and backward (dQ, dK, dV, from the kernel's own O and lse) through the public functions,
// every instantiated (Dqk, Dv) pair at (B, T, H) = (1, 1, 1), (2, 37, 3), (1, 128, 2), (2, 200, 4), (2, 100, 9),
// plus (1, 1024, 2) for (192, 128). The pairs cover the kernels of attention_heuristics.h: Dqk < 128 runs the key64
// forward and the column_split backward, Dqk >= 128 the role_split backward and, on a device of compute capability
// 9.0, the sm90 forward and the sm90 backward (the sm90 dK/dV and dQ kernels) at (128, 128) and
// (192, 128), the key32 forward at (192, 192) (head-grouped block orders,
// which (2, 100, 9) exercises with 18 sequence-heads: three groups, the last one partial).
// The sm90 and key32 forwards of (128, 128) and (192, 128) also run on the same inputs through
// flash_attention_forward_with and are compared with each other (O within 5e-3 relative L2: both round P to BF16 and
// O once, in different FP32 orders; lse within the tolerance below), and with the reference where the shape allows
// it: T not a multiple of the 128-row tiles, B > 1, H = 1 and 128, the strided views below and the model's (v the
// value half of the kv up-projection output), large scores, and T = 4096 over more thread blocks than SMs.
// Likewise the sm90, sm90_dq and role_split backward variants through flash_attention_backward_with (the same inputs,
// the same shapes plus T = 64, 65, 191 and 256 around the 64-query blocks and 128-key tiles): sm90_dq's dK and dV
// bit-identical to role_split's (one dK/dV kernel), sm90's dQ to sm90_dq's (one dQ kernel), sm90's dK and dV and
// sm90_dq's dQ within 5e-3 relative L2 of role_split's, and each within the gradient tolerance of the reference;
// role_split also runs by name through the reference shapes above.
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
using test::AttnLayout;
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

// The kernels the public functions run for (Dqk, Dv) on this device (attention_heuristics.h), for traces.
std::string kernels_of(int Dqk, int Dv) {
  return fmt::format("forward {}, backward {}", attn::forward_kernel_name(flash_attention_forward_kernel(Dqk, Dv)),
                     attn::backward_kernels_name(flash_attention_backward_kernels(Dqk, Dv)));
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

// ---- the sm90 and key32 forwards on the same inputs ------------------------------------------------------------------

// Where the inputs of a comparison lie: dense; run_and_check's strided views (q inside [B*T, H, Dqk + 8], v shifted
// by 8 with token stride H * Dv + 16, o inside [B*T, H, Dv + 8]); or the model's (MLA, trainer/model/mla.cpp: v the
// value half of the kv up-projection output [B*T, H, qk_nope + Dv], qk_nope = 128, at offset 128).
enum class InputLayout { dense, strided, model };

struct KernelCompareCase {
  int Dqk, Dv;
  int64_t B, T, H;
  InputLayout layout;
  bool reference;  // also against the FP64 reference (shapes small enough for the CPU)
  bool large_scores = false;
};

constexpr double kKernelVsKernelOutTol = 5e-3;

struct FwdResult {
  std::vector<bf16> o;
  std::vector<float> lse;
};

void compare_forward_kernels(const KernelCompareCase& fc) {
  const AttnCase c{fc.Dqk, fc.Dv, fc.B, fc.T, fc.H, false, fc.large_scores};
  const char* layout_name = fc.layout == InputLayout::dense ? "dense" : fc.layout == InputLayout::strided ? "strided"
                                                                                                           : "model";
  SCOPED_TRACE(fmt::format("{}, {} layout", c.name(), layout_name));
  const int64_t rows = c.B * c.T, H = c.H;
  const AttentionShape s = c.shape();
  const bool strided = fc.layout == InputLayout::strided;
  const int64_t kv_width = 128 + c.Dv;
  const AttnLayout v_layout = fc.layout == InputLayout::model ? AttnLayout{rows, H, c.Dv, H * kv_width, kv_width, 128}
                              : strided                      ? test::shifted(rows, H, c.Dv)
                                                             : dense_layout(rows, H, c.Dv);
  AttnDevTensor q_d(strided ? test::wide_heads(rows, H, c.Dqk) : dense_layout(rows, H, c.Dqk));
  AttnDevTensor k_d(dense_layout(rows, H, c.Dqk)), v_d(v_layout);
  AttnDevTensor o_d(strided ? test::wide_heads(rows, H, c.Dv) : dense_layout(rows, H, c.Dv));
  Guarded<float> lse_d(static_cast<size_t>(c.B * H * c.T));
  const test::AttnInputs in(c);
  q_d.upload(in.q);
  k_d.upload(in.k);
  v_d.upload(in.v);

  // One forward on NaN-poisoned outputs: nothing written outside O and lse.
  const auto run = [&](const auto& launch) {
    o_d.buf.poison();
    lse_d.poison();
    launch();
    CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_TRUE(o_d.untouched_outside()) << "the forward wrote outside O's elements";
    EXPECT_TRUE(lse_d.guards_intact()) << "lse guard";
    return FwdResult{o_d.download(), lse_d.download()};
  };
  const auto with = [&](attn::FwdKernel kernel) {
    SCOPED_TRACE(attn::forward_kernel_name(kernel));
    return run([&] { flash_attention_forward_with(kernel, s, q_d.in(), k_d.in(), v_d.in(), o_d.out(), lse_d.ptr(),
                                                  nullptr); });
  };
  const FwdResult sm90 = with(attn::FwdKernel::sm90), sm90_again = with(attn::FwdKernel::sm90);
  const FwdResult key32 = with(attn::FwdKernel::key32);
  const FwdResult rule = run([&] {
    flash_attention_forward(s, q_d.in(), k_d.in(), v_d.in(), o_d.out(), lse_d.ptr(), nullptr);
  });
  for (AttnDevTensor* t : {&q_d, &k_d, &v_d}) EXPECT_TRUE(t->untouched_outside()) << "a forward wrote into an input";

  EXPECT_EQ(test::bits_of(sm90_again.o), test::bits_of(sm90.o)) << "sm90: O differs between identical runs";
  EXPECT_EQ(test::f32_bits_of(sm90_again.lse), test::f32_bits_of(sm90.lse)) << "sm90: lse differs between runs";
  EXPECT_EQ(test::bits_of(rule.o), test::bits_of(sm90.o)) << "flash_attention_forward did not run the sm90 kernel";
  EXPECT_EQ(test::f32_bits_of(rule.lse), test::f32_bits_of(sm90.lse)) << "flash_attention_forward's lse";
  const std::vector<double> key32_o = test::to_f64(key32.o), key32_lse(key32.lse.begin(), key32.lse.end());
  EXPECT_LT(test::attn_rel_l2(sm90.o, key32_o), kKernelVsKernelOutTol) << "O: sm90 against key32";
  EXPECT_EQ(test::count_lse_errors(sm90.lse, key32_lse), 0u) << "lse: sm90 against key32";
  if (!fc.reference) return;
  const std::vector<double> qr = test::to_f64(in.q), kr = test::to_f64(in.k), vr = test::to_f64(in.v);
  std::vector<double> o_ref(vr.size()), lse_ref(lse_d.n);
  attention_forward_ref<double>(s, qr.data(), kr.data(), vr.data(), o_ref.data(), lse_ref.data());
  for (const FwdResult* r : {&sm90, &key32}) {
    SCOPED_TRACE(r == &sm90 ? "sm90 against the reference" : "key32 against the reference");
    EXPECT_LT(test::attn_rel_l2(r->o, o_ref), test::kAttnOutTol) << "O";
    EXPECT_EQ(test::count_lse_errors(r->lse, lse_ref), 0u) << "lse";
  }
}

TEST(AttentionGpu, Sm90ForwardMatchesKey32AndTheReference) {
  FP4MOE_REQUIRE_DEVICE();
  if (flash_attention_forward_kernel(192, 128) != attn::FwdKernel::sm90)
    GTEST_SKIP() << "the sm90 forward needs a device of compute capability 9.0";
  for (const int Dqk : {192, 128}) {
    compare_forward_kernels({Dqk, 128, 3, 333, 5, InputLayout::strided, true});
    compare_forward_kernels({Dqk, 128, 2, 129, 1, InputLayout::dense, true});
    compare_forward_kernels({Dqk, 128, 1, 160, 128, InputLayout::model, true});
    compare_forward_kernels({Dqk, 128, 2, 1, 2, InputLayout::model, true});
    compare_forward_kernels({Dqk, 128, 2, 300, 2, InputLayout::dense, true, true});
    compare_forward_kernels({Dqk, 128, 1, 4096, 8, InputLayout::model, false});
  }
}

// ---- the sm90, sm90_dq and role_split backward variants on the same inputs -----------------------------------------

struct BwdOutputs {
  std::vector<bf16> dq, dk, dv;
};

// One forward (the rule's kernel), then backward through sm90 (twice), sm90_dq (twice), role_split and the rule, on
// NaN-poisoned outputs and workspace: sm90 and sm90_dq deterministic; the rule runs sm90; dK and dV bit-identical
// between sm90_dq and role_split (the same role_split kernel), dQ bit-identical between sm90 and sm90_dq (the same
// sm90 dQ kernel); sm90's dK and dV, and sm90_dq's dQ, within kKernelVsKernelOutTol of role_split's (the same
// arithmetic in another FP32 order) and, where `reference`, every variant within the gradient tolerance of the FP64
// reference. Layouts as in compare_forward_kernels (strided: q and dq inside [B*T, H, Dqk + 8], v and dk shifted,
// o inside [B*T, H, Dv + 8]; model: v the value half of the kv up-projection output).
void compare_backward_kernels(const KernelCompareCase& fc) {
  const AttnCase c{fc.Dqk, fc.Dv, fc.B, fc.T, fc.H, false, fc.large_scores};
  const char* layout_name = fc.layout == InputLayout::dense ? "dense" : fc.layout == InputLayout::strided ? "strided"
                                                                                                           : "model";
  SCOPED_TRACE(fmt::format("backward {}, {} layout", c.name(), layout_name));
  const int64_t rows = c.B * c.T, H = c.H;
  const AttentionShape s = c.shape();
  const bool strided = fc.layout == InputLayout::strided;
  const int64_t kv_width = 128 + c.Dv;
  const AttnLayout v_layout = fc.layout == InputLayout::model ? AttnLayout{rows, H, c.Dv, H * kv_width, kv_width, 128}
                              : strided                      ? test::shifted(rows, H, c.Dv)
                                                             : dense_layout(rows, H, c.Dv);
  const AttnLayout qk_wide = strided ? test::wide_heads(rows, H, c.Dqk) : dense_layout(rows, H, c.Dqk);
  AttnDevTensor q_d(qk_wide), k_d(dense_layout(rows, H, c.Dqk)), v_d(v_layout), dout_d(dense_layout(rows, H, c.Dv));
  AttnDevTensor o_d(strided ? test::wide_heads(rows, H, c.Dv) : dense_layout(rows, H, c.Dv));
  AttnDevTensor dq_d(qk_wide), dk_d(strided ? test::shifted(rows, H, c.Dqk) : dense_layout(rows, H, c.Dqk));
  AttnDevTensor dv_d(dense_layout(rows, H, c.Dv));
  Guarded<float> lse_d(static_cast<size_t>(c.B * H * c.T));
  test::DeviceBuffer<unsigned char> ws(static_cast<size_t>(flash_attention_backward_workspace_bytes(s)));
  const test::AttnInputs in(c);
  q_d.upload(in.q);
  k_d.upload(in.k);
  v_d.upload(in.v);
  dout_d.upload(in.dout);
  flash_attention_forward(s, q_d.in(), k_d.in(), v_d.in(), o_d.out(), lse_d.ptr(), nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());

  const auto run = [&](const auto& launch) {
    for (AttnDevTensor* t : {&dq_d, &dk_d, &dv_d}) t->buf.poison();
    ws.poison(test::kNanPoison);
    launch();
    CUDA_CHECK(cudaDeviceSynchronize());
    for (AttnDevTensor* t : {&dq_d, &dk_d, &dv_d}) EXPECT_TRUE(t->untouched_outside()) << "a write outside a gradient";
    return BwdOutputs{dq_d.download(), dk_d.download(), dv_d.download()};
  };
  const auto with = [&](attn::BwdKernels kernels) {
    SCOPED_TRACE(attn::backward_kernels_name(kernels));
    return run([&] {
      flash_attention_backward_with(kernels, s, q_d.in(), k_d.in(), v_d.in(), o_d.in(), dout_d.in(), lse_d.ptr(),
                                    dq_d.out(), dk_d.out(), dv_d.out(), ws.ptr, nullptr);
    });
  };
  const BwdOutputs sm90 = with(attn::BwdKernels::sm90), sm90_again = with(attn::BwdKernels::sm90);
  const BwdOutputs dq90 = with(attn::BwdKernels::sm90_dq), dq90_again = with(attn::BwdKernels::sm90_dq);
  const BwdOutputs role = with(attn::BwdKernels::role_split);
  const BwdOutputs rule = run([&] {
    flash_attention_backward(s, q_d.in(), k_d.in(), v_d.in(), o_d.in(), dout_d.in(), lse_d.ptr(), dq_d.out(),
                             dk_d.out(), dv_d.out(), ws.ptr, nullptr);
  });
  for (AttnDevTensor* t : {&q_d, &k_d, &v_d, &o_d, &dout_d})
    EXPECT_TRUE(t->untouched_outside()) << "a backward wrote into an input";

  EXPECT_EQ(test::bits_of(sm90_again.dq), test::bits_of(sm90.dq)) << "sm90: dQ differs between identical runs";
  EXPECT_EQ(test::bits_of(sm90_again.dk), test::bits_of(sm90.dk)) << "sm90: dK differs between identical runs";
  EXPECT_EQ(test::bits_of(sm90_again.dv), test::bits_of(sm90.dv)) << "sm90: dV differs between identical runs";
  EXPECT_EQ(test::bits_of(dq90_again.dq), test::bits_of(dq90.dq)) << "sm90_dq: dQ differs between identical runs";
  EXPECT_EQ(test::bits_of(rule.dq), test::bits_of(sm90.dq)) << "flash_attention_backward did not run sm90";
  EXPECT_EQ(test::bits_of(rule.dk), test::bits_of(sm90.dk)) << "flash_attention_backward did not run sm90";
  EXPECT_EQ(test::bits_of(rule.dv), test::bits_of(sm90.dv)) << "flash_attention_backward did not run sm90";
  EXPECT_EQ(test::bits_of(role.dk), test::bits_of(dq90.dk)) << "dK: sm90_dq and role_split share the dK/dV kernel";
  EXPECT_EQ(test::bits_of(role.dv), test::bits_of(dq90.dv)) << "dV: sm90_dq and role_split share the dK/dV kernel";
  EXPECT_EQ(test::bits_of(sm90.dq), test::bits_of(dq90.dq)) << "dQ: sm90 and sm90_dq share the dQ kernel";
  EXPECT_LT(test::attn_rel_l2(dq90.dq, test::to_f64(role.dq)), kKernelVsKernelOutTol) << "dQ: sm90_dq against role_split";
  EXPECT_LT(test::attn_rel_l2(sm90.dk, test::to_f64(role.dk)), kKernelVsKernelOutTol) << "dK: sm90 against role_split";
  EXPECT_LT(test::attn_rel_l2(sm90.dv, test::to_f64(role.dv)), kKernelVsKernelOutTol) << "dV: sm90 against role_split";
  if (!fc.reference) return;
  const std::vector<double> qr = test::to_f64(in.q), kr = test::to_f64(in.k), vr = test::to_f64(in.v);
  const std::vector<double> gr = test::to_f64(in.dout);
  std::vector<double> dq_ref(qr.size()), dk_ref(kr.size()), dv_ref(vr.size());
  attention_backward_ref<double>(s, qr.data(), kr.data(), vr.data(), gr.data(), dq_ref.data(), dk_ref.data(),
                                 dv_ref.data());
  for (const BwdOutputs* r : {&sm90, &dq90, &role}) {
    SCOPED_TRACE(r == &sm90 ? "sm90 against the reference" : r == &dq90 ? "sm90_dq against the reference"
                                                                         : "role_split against the reference");
    EXPECT_LT(test::attn_rel_l2(r->dq, dq_ref), test::kAttnGradTol) << "dQ";
    EXPECT_LT(test::attn_rel_l2(r->dk, dk_ref), test::kAttnGradTol) << "dK";
    EXPECT_LT(test::attn_rel_l2(r->dv, dv_ref), test::kAttnGradTol) << "dV";
  }
}

// T: 1, 64 (one query block, half a key tile), 65 (one row past it), 129, 160, 191, 256 (two whole key tiles),
// 300, 333 and 4096 (more thread blocks than SMs; no reference); B 1-3; H 1-128.
TEST(AttentionGpu, Sm90BackwardsMatchRoleSplitAndTheReference) {
  FP4MOE_REQUIRE_DEVICE();
  if (flash_attention_backward_kernels(192, 128) != attn::BwdKernels::sm90)
    GTEST_SKIP() << "the sm90 backward kernels need a device of compute capability 9.0";
  for (const int Dqk : {192, 128}) {
    compare_backward_kernels({Dqk, 128, 3, 333, 5, InputLayout::strided, true});
    compare_backward_kernels({Dqk, 128, 2, 129, 1, InputLayout::dense, true});
    compare_backward_kernels({Dqk, 128, 2, 65, 3, InputLayout::dense, true});
    compare_backward_kernels({Dqk, 128, 1, 64, 4, InputLayout::dense, true});
    compare_backward_kernels({Dqk, 128, 3, 191, 2, InputLayout::strided, true});
    compare_backward_kernels({Dqk, 128, 1, 256, 3, InputLayout::model, true});
    compare_backward_kernels({Dqk, 128, 1, 160, 128, InputLayout::model, true});
    compare_backward_kernels({Dqk, 128, 2, 1, 2, InputLayout::model, true});
    compare_backward_kernels({Dqk, 128, 2, 300, 2, InputLayout::dense, true, true});
    compare_backward_kernels({Dqk, 128, 1, 4096, 8, InputLayout::model, false});
  }
}

// role_split on Hopper too (the rule runs sm90_dq there): against the reference through the named variant.
TEST(AttentionGpu, RoleSplitBackwardByNameMatchesReference) {
  FP4MOE_REQUIRE_DEVICE();
  test::AttentionImpl impl = own_kernels();
  impl.name = "role_split by name";
  impl.backward = [](const AttentionShape& s, AttnIn q, AttnIn k, AttnIn v, AttnIn o, AttnIn dout, const float* lse,
                     AttnOut dq, AttnOut dk, AttnOut dv) {
    test::DeviceBuffer<unsigned char> ws(static_cast<size_t>(flash_attention_backward_workspace_bytes(s)));
    ws.poison(test::kNanPoison);
    flash_attention_backward_with(attn::BwdKernels::role_split, s, q, k, v, o, dout, lse, dq, dk, dv, ws.ptr, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
  };
  for (const int Dqk : {192, 128})
    for (const Btth& sh : kShapes) test::run_and_check({Dqk, 128, sh.B, sh.T, sh.H}, impl);
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
