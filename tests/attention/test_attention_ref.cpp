// CPU reference of causal attention (kernels/attention/flash_attention.h): backward against central finite
// differences of forward (double), causality within each sequence, lse against a direct log-sum-exp, float against
// double, large scores; the GPU launchers' argument checks, which run before any CUDA call (no GPU needed: the
// fake device pointers below are never dereferenced); and the kernel choice per (Dqk, Dv) pair and device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/attention/attention_heuristics.h"
#include "kernels/attention/flash_attention.h"
#include "kernels/common/check.h"
#include "tests/common/nn_ref_test_util.h"
#include "tests/common/launch_check_util.h"

namespace fp4moe {
namespace {

using test::fake_device_pointer;

using test::expect_error_mentions;
using test::normal_values;

struct Inputs {
  AttentionShape s;
  std::vector<double> q, k, v;
};

Inputs random_inputs(int64_t B, int64_t T, int64_t H, int64_t Dqk, int64_t Dv, uint32_t seed, double stddev = 1.0) {
  Inputs in{AttentionShape{B, T, H, Dqk, Dv, static_cast<float>(1.0 / std::sqrt(static_cast<double>(Dqk)))}, {}, {},
            {}};
  in.q = normal_values(B * T * H * Dqk, seed, 0.0, stddev);
  in.k = normal_values(B * T * H * Dqk, seed + 1, 0.0, stddev);
  in.v = normal_values(B * T * H * Dv, seed + 2);
  return in;
}

std::vector<double> forward(const Inputs& in, std::vector<double>* lse = nullptr) {
  const AttentionShape& s = in.s;
  std::vector<double> o(s.B * s.T * s.H * s.Dv);
  if (lse) lse->assign(s.B * s.H * s.T, 0.0);
  attention_forward_ref<double>(s, in.q.data(), in.k.data(), in.v.data(), o.data(), lse ? lse->data() : nullptr);
  return o;
}

TEST(AttentionRef, BackwardMatchesFiniteDifferences) {
  for (int64_t T = 5; T <= 9; ++T) {
    SCOPED_TRACE("T=" + std::to_string(T));
    Inputs in = random_inputs(2, T, 2, 6, 4, static_cast<uint32_t>(10 * T));
    in.s.scale = 0.45f;  // not 1/sqrt(Dqk): the scale must enter dQ and dK
    const AttentionShape& s = in.s;
    const std::vector<double> g = normal_values(s.B * s.T * s.H * s.Dv, static_cast<uint32_t>(10 * T + 7));
    std::vector<double> dq(in.q.size()), dk(in.k.size()), dv(in.v.size());
    attention_backward_ref<double>(s, in.q.data(), in.k.data(), in.v.data(), g.data(), dq.data(), dk.data(),
                                   dv.data());
    const auto loss = [&] { return test::dot(forward(in), g); };
    test::expect_gradient_matches(dq, test::finite_difference_gradient(in.q, loss), "dq");
    test::expect_gradient_matches(dk, test::finite_difference_gradient(in.k, loss), "dk");
    test::expect_gradient_matches(dv, test::finite_difference_gradient(in.v, loss), "dv");
  }
}

TEST(AttentionRef, IsCausalWithinEachSequence) {
  Inputs in = random_inputs(2, 9, 2, 6, 4, 3);
  const AttentionShape& s = in.s;
  const std::vector<double> before = forward(in);
  const int64_t t0 = 4;  // change key and value of token 4 of sequence 0, both heads
  for (int64_t h = 0; h < s.H; ++h) {
    for (int64_t d = 0; d < s.Dqk; ++d) in.k[(t0 * s.H + h) * s.Dqk + d] += 1.5;
    for (int64_t d = 0; d < s.Dv; ++d) in.v[(t0 * s.H + h) * s.Dv + d] -= 2.0;
  }
  const std::vector<double> after = forward(in);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t t = 0; t < s.T; ++t)
      for (int64_t h = 0; h < s.H; ++h) {
        const int64_t at = ((b * s.T + t) * s.H + h) * s.Dv;
        double diff = 0;
        for (int64_t d = 0; d < s.Dv; ++d) diff += std::fabs(after[at + d] - before[at + d]);
        if (b == 0 && t >= t0)
          EXPECT_GT(diff, 1e-6) << "b=" << b << " t=" << t << " h=" << h << " should see the changed token";
        else
          EXPECT_EQ(diff, 0.0) << "b=" << b << " t=" << t << " h=" << h << " must not see the changed token";
      }
}

TEST(AttentionRef, LseIsTheLogSumExpOfVisibleScores) {
  const Inputs in = random_inputs(2, 7, 3, 5, 3, 11);
  const AttentionShape& s = in.s;
  std::vector<double> lse;
  const std::vector<double> o = forward(in, &lse);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t t = 0; t < s.T; ++t) {
        long double sum = 0;
        for (int64_t j = 0; j <= t; ++j) {
          long double dot = 0;
          for (int64_t d = 0; d < s.Dqk; ++d)
            dot += static_cast<long double>(in.q[((b * s.T + t) * s.H + h) * s.Dqk + d]) *
                   in.k[((b * s.T + j) * s.H + h) * s.Dqk + d];
          sum += std::exp(static_cast<long double>(s.scale) * dot);
        }
        EXPECT_NEAR(lse[(b * s.H + h) * s.T + t], static_cast<double>(std::log(sum)), 1e-12)
            << "b=" << b << " h=" << h << " t=" << t;
      }
  // The first token sees itself only: O = V exactly.
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t d = 0; d < s.Dv; ++d) {
        const int64_t at = ((b * s.T) * s.H + h) * s.Dv + d;
        EXPECT_EQ(o[at], in.v[at]);
      }
}

TEST(AttentionRef, FloatAgreesWithDouble) {
  const Inputs in = random_inputs(2, 33, 2, 16, 8, 21);
  const AttentionShape& s = in.s;
  const std::vector<double> g = normal_values(s.B * s.T * s.H * s.Dv, 22);
  std::vector<double> lse;
  const std::vector<double> o = forward(in, &lse);
  std::vector<double> dq(in.q.size()), dk(in.k.size()), dv(in.v.size());
  attention_backward_ref<double>(s, in.q.data(), in.k.data(), in.v.data(), g.data(), dq.data(), dk.data(), dv.data());

  const auto f = [](const std::vector<double>& x) { return std::vector<float>(x.begin(), x.end()); };
  const std::vector<float> qf = f(in.q), kf = f(in.k), vf = f(in.v), gf = f(g);
  std::vector<float> of(o.size()), lf(lse.size()), dqf(dq.size()), dkf(dk.size()), dvf(dv.size());
  attention_forward_ref<float>(s, qf.data(), kf.data(), vf.data(), of.data(), lf.data());
  attention_backward_ref<float>(s, qf.data(), kf.data(), vf.data(), gf.data(), dqf.data(), dkf.data(), dvf.data());
  const auto expect_near = [](const std::vector<float>& a, const std::vector<double>& b, const char* name) {
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-4 * std::max(1.0, std::fabs(b[i]))) << name << i;
  };
  expect_near(of, o, "o");
  expect_near(lf, lse, "lse");
  expect_near(dqf, dq, "dq");
  expect_near(dkf, dk, "dk");
  expect_near(dvf, dv, "dv");
}

TEST(AttentionRef, LargeScoresStayFinite) {
  // Scores of magnitude ~1000: exp without the max subtracted would overflow even in double.
  Inputs in = random_inputs(1, 12, 1, 4, 2, 31, 25.0);
  in.s.scale = 1.0f;
  std::vector<double> lse;
  const std::vector<double> o = forward(in, &lse);
  for (double x : o) EXPECT_TRUE(std::isfinite(x));
  for (double x : lse) EXPECT_TRUE(std::isfinite(x));
  std::vector<double> dq(in.q.size()), dk(in.k.size()), dv(in.v.size());
  const std::vector<double> g = normal_values(o.size(), 32);
  attention_backward_ref<double>(in.s, in.q.data(), in.k.data(), in.v.data(), g.data(), dq.data(), dk.data(),
                                 dv.data());
  for (const auto* x : {&dq, &dk, &dv})
    for (double e : *x) EXPECT_TRUE(std::isfinite(e));
}

TEST(AttentionRef, EmptyShapesDoNothingAndBadShapesAreRejected) {
  const AttentionShape empty{2, 0, 3, 8, 8, 0.5f};
  attention_forward_ref<double>(empty, nullptr, nullptr, nullptr, nullptr, nullptr);  // nothing to do
  double x[64] = {};
  expect_error_mentions([&] { attention_forward_ref<double>({-1, 2, 1, 4, 4, 0.5f}, x, x, x, x, x); },
                        {"attention_forward_ref", "B=-1"});
  expect_error_mentions([&] { attention_forward_ref<double>({1, 2, 1, 0, 4, 0.5f}, x, x, x, x, x); },
                        {"Dqk=0"});
  expect_error_mentions([&] { attention_backward_ref<double>({1, 2, 1, 4, 4, NAN}, x, x, x, x, x, x, x); },
                        {"attention_backward_ref", "scale must be finite"});
  expect_error_mentions([&] { attention_backward_ref<double>({1, 2, 1, 4, 4, 0.5f}, x, x, nullptr, x, x, x, x); },
                        {"null"});
}

// ---- the GPU launchers' checks (no CUDA call happens before them) ------------------------------------------------

struct Launch {
  AttentionShape s{2, 37, 3, 192, 128, 0.0721688f};
  AttnIn q{fake_device_pointer<const bf16>(0x100000), 3 * 192, 192};
  AttnIn k{fake_device_pointer<const bf16>(0x200000), 3 * 192, 192};
  AttnIn v{fake_device_pointer<const bf16>(0x300000), 3 * 128, 128};
  AttnOut o{fake_device_pointer<bf16>(0x400000), 3 * 128, 128};
  float* lse = fake_device_pointer<float>(0x500000);
  void forward() const { flash_attention_forward(s, q, k, v, o, lse, nullptr); }
  void backward() const {
    const AttnIn oi{o.data, o.token_stride, o.head_stride};
    const AttnOut dq{fake_device_pointer<bf16>(0x600000), q.token_stride, q.head_stride};
    const AttnOut dk{fake_device_pointer<bf16>(0x700000), k.token_stride, k.head_stride};
    const AttnOut dv{fake_device_pointer<bf16>(0x800000), o.token_stride, o.head_stride};
    flash_attention_backward(s, q, k, v, oi, oi, lse, dq, dk, dv, workspace, nullptr);
  }
  void* workspace = fake_device_pointer<void>(0x900000);
};

TEST(AttentionLaunchChecks, UnsupportedHeadDimsAreRejectedNamingTheSupportedPairs) {
  Launch l;
  l.s.Dqk = 160;
  expect_error_mentions([&] { l.forward(); },
                        {"flash_attention_forward", "(160,128)", "(32,16), (32,32), (64,64), (96,64), (128,128), "
                                                                 "(192,128), (192,192)"});
  expect_error_mentions([&] { l.backward(); }, {"flash_attention_backward", "(160,128)", "(192,192)"});
}

TEST(AttentionLaunchChecks, MisalignedStridesAndPointersAreRejected) {
  {
    Launch l;
    l.q.token_stride = 3 * 192 + 4;
    expect_error_mentions([&] { l.forward(); }, {"q.token_stride", "multiple of 8", "580"});
  }
  {
    Launch l;
    l.v.head_stride = 132;
    l.v.token_stride = 400;
    expect_error_mentions([&] { l.backward(); }, {"v.head_stride", "132"});
  }
  {
    Launch l;
    l.k.data = fake_device_pointer<const bf16>(0x200008);  // 8-byte aligned only
    expect_error_mentions([&] { l.forward(); }, {"k.data", "16-byte aligned"});
  }
  {
    Launch l;
    l.o.head_stride = 120;  // heads would overlap
    expect_error_mentions([&] { l.forward(); }, {"o.head_stride=120", "D=128"});
  }
  {
    Launch l;
    l.q.token_stride = 2 * 192;  // smaller than three heads
    expect_error_mentions([&] { l.forward(); }, {"q.token_stride=384"});
  }
  {
    Launch l;
    l.lse = nullptr;
    expect_error_mentions([&] { l.forward(); }, {"lse is null"});
  }
  {
    Launch l;
    l.workspace = nullptr;
    expect_error_mentions([&] { l.backward(); }, {"workspace is null"});
  }
}

TEST(AttentionLaunchChecks, BadShapesAreRejectedAndEmptyShapesLaunchNothing) {
  {
    Launch l;
    l.s.T = -1;
    expect_error_mentions([&] { l.forward(); }, {"T=-1"});
  }
  {
    Launch l;
    l.s.scale = 0.0f;
    expect_error_mentions([&] { l.forward(); }, {"scale must be finite and > 0"});
  }
  {
    Launch l;
    l.s.T = kAttentionMaxT + 1;
    expect_error_mentions([&] { l.backward(); }, {"exceeds the supported"});
  }
  for (int which = 0; which < 3; ++which) {  // B, T or H = 0: returns before looking at the (null) pointers
    AttentionShape s{2, 37, 3, 96, 64, 0.1f};
    (which == 0 ? s.B : which == 1 ? s.T : s.H) = 0;
    EXPECT_NO_THROW(flash_attention_forward(s, {}, {}, {}, {}, nullptr, nullptr));
    EXPECT_NO_THROW(flash_attention_backward(s, {}, {}, {}, {}, {}, nullptr, {}, {}, {}, nullptr, nullptr));
    EXPECT_EQ(flash_attention_backward_workspace_bytes(s), 0);
  }
  EXPECT_EQ(flash_attention_backward_workspace_bytes({2, 37, 3, 96, 64, 0.1f}), 1024);  // 2*3*37*4 = 888 -> 1024
  expect_error_mentions([] { flash_attention_backward_workspace_bytes({1, -2, 1, 96, 64, 0.1f}); }, {"T=-2"});
}

// ---- the kernel choice (attention_heuristics.h) ----------------------------------------------------------------

TEST(AttentionHeuristics, Sm90KernelsOnHopperElseKey32AndRoleSplitFromDqk128) {
  for (const auto& pair : kAttentionPairs) {
    SCOPED_TRACE(testing::Message() << "(Dqk, Dv) = (" << pair[0] << ", " << pair[1] << ")");
    const bool large = pair[0] >= 128;
    const bool sm90 = pair[1] == 128 && (pair[0] == 128 || pair[0] == 192);
    const attn::FwdKernel mma_sync = large ? attn::FwdKernel::key32 : attn::FwdKernel::key64;
    EXPECT_EQ(attn::forward_kernel_builds(attn::FwdKernel::sm90, pair[0], pair[1]), sm90);
    EXPECT_EQ(attn::forward_kernel_builds(attn::FwdKernel::key32, pair[0], pair[1]), large);
    EXPECT_EQ(attn::forward_kernel_builds(attn::FwdKernel::key64, pair[0], pair[1]), !large);
    EXPECT_EQ(attn::forward_kernel_for(pair[0], pair[1], 90), sm90 ? attn::FwdKernel::sm90 : mma_sync);
    for (int cc : {80, 89, 100}) EXPECT_EQ(attn::forward_kernel_for(pair[0], pair[1], cc), mma_sync) << "cc " << cc;
    EXPECT_TRUE(attn::forward_kernel_builds(attn::forward_kernel_for(pair[0], pair[1], 90), pair[0], pair[1]));
    const attn::BwdKernels mma_sync_bwd = large ? attn::BwdKernels::role_split : attn::BwdKernels::column_split;
    EXPECT_EQ(attn::backward_kernels_build(attn::BwdKernels::sm90_dq, pair[0], pair[1]), sm90);
    EXPECT_EQ(attn::backward_kernels_build(attn::BwdKernels::sm90, pair[0], pair[1]), sm90);
    EXPECT_EQ(attn::backward_kernels_build(attn::BwdKernels::role_split, pair[0], pair[1]), large);
    EXPECT_EQ(attn::backward_kernels_build(attn::BwdKernels::column_split, pair[0], pair[1]), !large);
    EXPECT_EQ(attn::backward_kernels_for(pair[0], pair[1], 90), sm90 ? attn::BwdKernels::sm90 : mma_sync_bwd);
    for (int cc : {80, 89, 100})
      EXPECT_EQ(attn::backward_kernels_for(pair[0], pair[1], cc), mma_sync_bwd) << "cc " << cc;
  }
  // The measured shapes: MLA's (192, 128) and `small`'s (96, 64).
  static_assert(attn::forward_kernel_for(192, 128, 90) == attn::FwdKernel::sm90);
  static_assert(attn::forward_kernel_for(192, 128, 80) == attn::FwdKernel::key32);
  static_assert(attn::backward_kernels_for(192, 128, 90) == attn::BwdKernels::sm90);
  static_assert(attn::backward_kernels_for(192, 128, 80) == attn::BwdKernels::role_split);
  static_assert(attn::forward_kernel_for(96, 64, 90) == attn::FwdKernel::key64);
  static_assert(attn::backward_kernels_for(96, 64, 90) == attn::BwdKernels::column_split);
}

// Launch at (Dqk, Dv) = (192, 192): a pair the sm90 kernels and the small-Dqk ones are not built for.
Launch launch_at_192_192() {
  Launch l;
  l.s.Dqk = 192;
  l.s.Dv = 192;
  l.v.token_stride = l.o.token_stride = 3 * 192;
  l.v.head_stride = l.o.head_stride = 192;
  return l;
}

// A named forward kernel that is not built for the pair is rejected after the contract's checks and before any CUDA
// call (the pointers are fake).
TEST(AttentionLaunchChecks, NamedForwardKernelMustBeBuiltForThePair) {
  Launch l = launch_at_192_192();
  expect_error_mentions(
      [&] { flash_attention_forward_with(attn::FwdKernel::sm90, l.s, l.q, l.k, l.v, l.o, l.lse, nullptr); },
      {"flash_attention_forward_with", "sm90", "(192,192)"});
  expect_error_mentions(
      [&] { flash_attention_forward_with(attn::FwdKernel::key64, l.s, l.q, l.k, l.v, l.o, l.lse, nullptr); },
      {"key64", "(192,192)"});
  l.lse = nullptr;  // the contract's checks come first
  expect_error_mentions(
      [&] { flash_attention_forward_with(attn::FwdKernel::sm90, l.s, l.q, l.k, l.v, l.o, l.lse, nullptr); },
      {"flash_attention_forward_with", "lse is null"});
  expect_error_mentions([] { flash_attention_forward_kernel(160, 128); }, {"(160,128)", "(192,128)"});
}

// The same for a named backward variant: sm90, sm90_dq and column_split are not built for (192, 192).
TEST(AttentionLaunchChecks, NamedBackwardKernelsMustBeBuiltForThePair) {
  Launch l = launch_at_192_192();
  const auto backward_with = [&](attn::BwdKernels kernels) {
    const AttnIn oi{l.o.data, l.o.token_stride, l.o.head_stride};
    const AttnOut dq{fake_device_pointer<bf16>(0x600000), l.q.token_stride, l.q.head_stride};
    const AttnOut dk{fake_device_pointer<bf16>(0x700000), l.k.token_stride, l.k.head_stride};
    const AttnOut dv{fake_device_pointer<bf16>(0x800000), l.o.token_stride, l.o.head_stride};
    flash_attention_backward_with(kernels, l.s, l.q, l.k, l.v, oi, oi, l.lse, dq, dk, dv, l.workspace, nullptr);
  };
  expect_error_mentions([&] { backward_with(attn::BwdKernels::sm90_dq); },
                        {"flash_attention_backward_with", "sm90_dq", "(192,192)"});
  expect_error_mentions([&] { backward_with(attn::BwdKernels::sm90); },
                        {"flash_attention_backward_with", "the sm90 backward", "(192,192)"});
  expect_error_mentions([&] { backward_with(attn::BwdKernels::column_split); }, {"column_split", "(192,192)"});
  l.workspace = nullptr;  // the contract's checks come first
  expect_error_mentions([&] { backward_with(attn::BwdKernels::sm90_dq); },
                        {"flash_attention_backward_with", "workspace"});
  expect_error_mentions([] { flash_attention_backward_kernels(160, 128); }, {"(160,128)", "(192,128)"});
}

}  // namespace
}  // namespace fp4moe
