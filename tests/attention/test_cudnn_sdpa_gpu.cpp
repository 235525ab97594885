// The cuDNN backend of the attention core (kernels/attention/cudnn_sdpa.h) on the GPU, with the checks and
// tolerances of our kernels' test (tests/common/attention_test_util.h: O < 1e-2, dQ, dK, dV < 2e-2 relative L2
// against the FP64 reference on the same BF16 inputs, lse within 1e-4 max(1, |lse|), every output NaN-poisoned
// before each run, nothing written outside the tensors), for the non-deterministic and the deterministic backward:
//   - the (Dqk, Dv) pairs of the configs: (32, 16) tiny, (96, 64) small, (192, 128) DeepSeek-V2/V3 (MLA), at
//     (B, T, H) = (2, 37, 3), (2, 200, 4), (2, 100, 9) and at the configs' own shapes (tiny B 4 T 64 H 4, small one
//     sequence of 1024 with its 12 heads, MLA T 1024 with 2 of its heads); the other pairs of kAttentionPairs at
//     (2, 100, 9);
//   - strided views as the model passes them (tests/common/attention_test_util.h's strided case) and large scores;
//   - the deterministic backward bit for bit over three runs with many thread blocks in flight;
//   - our kernels and cuDNN on one larger shape (192/128, T 4096, 4 heads) against each other, and each backend's
//     backward on the other's forward outputs (the two share the lse tensor);
//   - plans cached per shape and layout; rejections before any launch.
// Skipped with the reason when no device is usable or this build has no cuDNN.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/attention/cudnn_sdpa.h"
#include "kernels/attention/flash_attention.h"
#include "tests/common/attention_test_util.h"

namespace fp4moe {
namespace {

using test::AttnCase;
using test::AttnDevTensor;
using test::dense_layout;
using test::Guarded;

// The backend through CudnnSdpa, its workspaces sized by its own queries and NaN-poisoned before each run.
test::AttentionImpl cudnn_backend(CudnnSdpa& sdpa, bool deterministic) {
  test::AttentionImpl impl;
  impl.name = deterministic ? "cudnn, deterministic backward" : "cudnn, non-deterministic backward";
  impl.deterministic_backward = deterministic;
  impl.forward = [&sdpa](const AttentionShape& s, AttnIn q, AttnIn k, AttnIn v, AttnOut o, float* lse) {
    const int64_t bytes = sdpa.forward_workspace_bytes(s, SdpaLayout::of_forward(s, q, k, v, o));
    test::DeviceBuffer<unsigned char> ws(static_cast<size_t>(bytes));
    ws.poison(test::kNanPoison);
    sdpa.forward(s, q, k, v, o, lse, ws.ptr, bytes, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
  };
  impl.backward = [&sdpa, deterministic](const AttentionShape& s, AttnIn q, AttnIn k, AttnIn v, AttnIn o,
                                         AttnIn dout, const float* lse, AttnOut dq, AttnOut dk, AttnOut dv) {
    const int64_t bytes =
        sdpa.backward_workspace_bytes(s, SdpaLayout::of_backward(q, k, v, o, dout, dq, dk, dv), deterministic);
    test::DeviceBuffer<unsigned char> ws(static_cast<size_t>(bytes));
    ws.poison(test::kNanPoison);
    sdpa.backward(s, q, k, v, o, dout, lse, dq, dk, dv, deterministic, ws.ptr, bytes, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
  };
  return impl;
}

// The (Dqk, Dv) pairs of the configs: tiny, small, DeepSeek-V2/V3.
constexpr int kConfigPairs[][2] = {{32, 16}, {96, 64}, {192, 128}};

TEST(CudnnSdpaGpu, ForwardBackwardMatchReference) {
  FP4MOE_REQUIRE_CUDNN();
  CudnnSdpa sdpa;
  for (bool deterministic : {false, true}) {
    const test::AttentionImpl impl = cudnn_backend(sdpa, deterministic);
    for (const auto& p : kConfigPairs)
      for (const AttnCase& c : {AttnCase{p[0], p[1], 2, 37, 3}, AttnCase{p[0], p[1], 2, 200, 4},
                                AttnCase{p[0], p[1], 2, 100, 9}})
        test::run_and_check(c, impl);
    test::run_and_check({32, 16, 4, 64, 4}, impl);      // tiny: micro_batch 4 x seq_len 64, 4 heads
    test::run_and_check({96, 64, 1, 1024, 12}, impl);   // small: one of its 8 sequences of 1024, 12 heads
    test::run_and_check({192, 128, 1, 1024, 2}, impl);  // MLA: 1024 of its 4096 tokens, 2 of its 128 heads
  }
}

TEST(CudnnSdpaGpu, EveryPairOfTheKernelsMatchesReference) {
  FP4MOE_REQUIRE_CUDNN();
  CudnnSdpa sdpa;
  const test::AttentionImpl impl = cudnn_backend(sdpa, false);
  for (const auto& p : kAttentionPairs) test::run_and_check({p[0], p[1], 2, 100, 9}, impl);
}

// The model's views (q, v and the gradients inside wider buffers) and scores that need the running max.
TEST(CudnnSdpaGpu, StridedViewsAndLargeScores) {
  FP4MOE_REQUIRE_CUDNN();
  CudnnSdpa sdpa;
  for (bool deterministic : {false, true}) {
    const test::AttentionImpl impl = cudnn_backend(sdpa, deterministic);
    for (const auto& p : kConfigPairs) {
      test::run_and_check({p[0], p[1], 2, 37, 3, true}, impl);
      test::run_and_check({p[0], p[1], 1, 128, 2, false, true}, impl);
      test::run_and_check({p[0], p[1], 2, 200, 4, false, true}, impl);
    }
  }
}

// A sequence of one token (its only key is itself: O = V, dQ = dK = 0): supported and right, or refused with a
// reason.
TEST(CudnnSdpaGpu, OneTokenSequencesAreRightOrRefused) {
  FP4MOE_REQUIRE_CUDNN();
  CudnnSdpa sdpa;
  for (const auto& p : kConfigPairs) {
    const AttnCase c{p[0], p[1], 3, 1, 2};
    std::string why;
    if (sdpa.supports(c.shape(), SdpaLayout::dense(c.shape()), false, &why)) {
      test::run_and_check(c, cudnn_backend(sdpa, false));
    } else {
      EXPECT_FALSE(why.empty()) << c.name();
      std::printf("cuDNN refuses %s: %s\n", c.name().c_str(), why.c_str());
    }
  }
}

TEST(CudnnSdpaGpu, BackwardWithManyBlocksInFlight) {
  FP4MOE_REQUIRE_CUDNN();
  CudnnSdpa sdpa;
  for (bool deterministic : {true, false})  // deterministic: the same bits three times; else finite and inside
    for (const AttnCase& c : {AttnCase{192, 128, 2, 1536, 24}, AttnCase{32, 16, 2, 333, 96}})
      test::check_backward_repeatable(c, cudnn_backend(sdpa, deterministic));
}

// Forward and backward of both backends on one input, dense [B*T, H, D] tensors.
struct BackendRun {
  AttnDevTensor o, dq, dk, dv;
  Guarded<float> lse;
  explicit BackendRun(const AttnCase& c)
      : o(dense_layout(c.B * c.T, c.H, c.Dv)), dq(dense_layout(c.B * c.T, c.H, c.Dqk)),
        dk(dense_layout(c.B * c.T, c.H, c.Dqk)), dv(dense_layout(c.B * c.T, c.H, c.Dv)),
        lse(static_cast<size_t>(c.B * c.H * c.T)) {}
};

// ||a - b|| / ||b|| over two BF16 tensors.
double rel_diff(const std::vector<bf16>& a, const std::vector<bf16>& b) { return test::attn_rel_l2(a, test::to_f64(b)); }

// Our kernels and cuDNN at the MLA pair and sequence length (T 4096; 4 heads keep it short): each within the
// reference tolerances of the other, and each backend's backward on the other's O and lse as on its own.
TEST(CudnnSdpaGpu, AgreesWithOurKernelsAndSharesTheirLse) {
  FP4MOE_REQUIRE_CUDNN();
  const AttnCase c{192, 128, 1, 4096, 4};
  const AttentionShape s = c.shape();
  const int64_t rows = c.B * c.T;
  AttnDevTensor q(dense_layout(rows, c.H, c.Dqk)), k(dense_layout(rows, c.H, c.Dqk)), v(dense_layout(rows, c.H, c.Dv));
  AttnDevTensor dout(dense_layout(rows, c.H, c.Dv));
  const test::AttnInputs in(c);
  q.upload(in.q);
  k.upload(in.k);
  v.upload(in.v);
  dout.upload(in.dout);
  CudnnSdpa sdpa;
  const test::AttentionImpl cudnn = cudnn_backend(sdpa, false);
  test::DeviceBuffer<unsigned char> own_ws(static_cast<size_t>(flash_attention_backward_workspace_bytes(s)));
  const auto own_backward = [&](BackendRun& fwd, BackendRun& out) {
    flash_attention_backward(s, q.in(), k.in(), v.in(), fwd.o.in(), dout.in(), fwd.lse.ptr(), out.dq.out(),
                             out.dk.out(), out.dv.out(), own_ws.ptr, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
  };
  const auto cudnn_backward = [&](BackendRun& fwd, BackendRun& out) {
    cudnn.backward(s, q.in(), k.in(), v.in(), fwd.o.in(), dout.in(), fwd.lse.ptr(), out.dq.out(), out.dk.out(),
                   out.dv.out());
  };
  BackendRun own(c), cud(c), own_on_cudnn(c), cudnn_on_own(c);
  flash_attention_forward(s, q.in(), k.in(), v.in(), own.o.out(), own.lse.ptr(), nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  cudnn.forward(s, q.in(), k.in(), v.in(), cud.o.out(), cud.lse.ptr());
  own_backward(own, own);
  cudnn_backward(cud, cud);
  own_backward(cud, own_on_cudnn);
  cudnn_backward(own, cudnn_on_own);

  EXPECT_LT(rel_diff(cud.o.download(), own.o.download()), test::kAttnOutTol) << "O: cuDNN against ours";
  const std::vector<float> lse_own = own.lse.download();
  EXPECT_EQ(test::count_lse_errors(cud.lse.download(), std::vector<double>(lse_own.begin(), lse_own.end())), 0u)
      << "lse: cuDNN against ours";
  const struct {
    const char* what;
    BackendRun& a;
    BackendRun& b;
  } pairs[] = {{"cuDNN against ours", cud, own},
               {"ours on cuDNN's O and lse against ours on our own", own_on_cudnn, own},
               {"cuDNN on our O and lse against cuDNN on its own", cudnn_on_own, cud}};
  for (const auto& p : pairs) {
    EXPECT_LT(rel_diff(p.a.dq.download(), p.b.dq.download()), test::kAttnGradTol) << "dQ: " << p.what;
    EXPECT_LT(rel_diff(p.a.dk.download(), p.b.dk.download()), test::kAttnGradTol) << "dK: " << p.what;
    EXPECT_LT(rel_diff(p.a.dv.download(), p.b.dv.download()), test::kAttnGradTol) << "dV: " << p.what;
  }
}

TEST(CudnnSdpaGpu, PlansAreCachedPerShapeAndLayout) {
  FP4MOE_REQUIRE_CUDNN();
  CudnnSdpa sdpa;
  const AttentionShape s = AttnCase{96, 64, 2, 128, 3}.shape();
  SdpaLayout layout = SdpaLayout::dense(s);
  EXPECT_EQ(sdpa.plans_built(), 0);
  const int64_t fwd = sdpa.forward_workspace_bytes(s, layout);
  EXPECT_EQ(sdpa.plans_built(), 1);
  EXPECT_EQ(sdpa.forward_workspace_bytes(s, layout), fwd);
  EXPECT_EQ(sdpa.plans_built(), 1) << "the same shape and layout built a second plan";
  const int64_t bwd = sdpa.backward_workspace_bytes(s, layout, false);
  const int64_t bwd_det = sdpa.backward_workspace_bytes(s, layout, true);
  EXPECT_EQ(sdpa.plans_built(), 3);
  // D [B, H, T] FP32 and the dQ accumulator [B, H, T, Dqk] FP32 beside the plan's own workspace.
  EXPECT_GE(bwd, s.B * s.H * s.T * 4 * (1 + s.Dqk));
  EXPECT_GE(bwd_det, s.B * s.H * s.T * 4);
  layout.v = {s.H * (s.Dv + 8), s.Dv + 8};
  sdpa.forward_workspace_bytes(s, layout);
  EXPECT_EQ(sdpa.plans_built(), 4) << "another layout needs its own plan";
  std::printf("workspace bytes at %s: forward %lld, backward %lld, deterministic backward %lld\n",
              AttnCase{96, 64, 2, 128, 3}.name().c_str(), static_cast<long long>(fwd), static_cast<long long>(bwd),
              static_cast<long long>(bwd_det));
}

TEST(CudnnSdpaGpu, BadCallsAreRejectedBeforeAnyLaunch) {
  FP4MOE_REQUIRE_CUDNN();
  const AttnCase c{96, 64, 1, 16, 2};
  const AttentionShape s = c.shape();
  AttnDevTensor q(dense_layout(c.T, c.H, c.Dqk)), k(dense_layout(c.T, c.H, c.Dqk)), v(dense_layout(c.T, c.H, c.Dv));
  AttnDevTensor o(dense_layout(c.T, c.H, c.Dv));
  Guarded<float> lse(static_cast<size_t>(c.H * c.T) + 4);
  CudnnSdpa sdpa;
  const int64_t bytes = sdpa.forward_workspace_bytes(s, SdpaLayout::dense(s));
  test::DeviceBuffer<unsigned char> ws(static_cast<size_t>(bytes) + 16);
  const auto expect_rejected = [&](const AttentionShape& shape, float* l, int64_t ws_bytes,
                                   std::initializer_list<const char*> parts) {
    try {
      sdpa.forward(shape, q.in(), k.in(), v.in(), o.out(), l, ws.ptr, ws_bytes, nullptr);
      ADD_FAILURE() << "expected fp4moe::Error mentioning " << *parts.begin();
    } catch (const Error& e) {
      for (const char* part : parts) EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  AttentionShape unsupported = s;
  unsupported.Dqk = 100;
  expect_rejected(unsupported, lse.ptr(), bytes, {"(100,64)", "(192,128)"});
  expect_rejected(s, lse.ptr() + 1, bytes, {"lse", "16-byte aligned"});
  if (bytes > 0) expect_rejected(s, lse.ptr(), bytes - 1, {"workspace", "bytes"});
  CUDA_CHECK(cudaDeviceSynchronize());
  for (bf16 x : o.buf.download()) ASSERT_EQ(bf16_bits(x), 0xFFFF) << "a rejected call wrote the output";
  std::string why;
  EXPECT_FALSE(sdpa.supports(unsupported, SdpaLayout::dense(unsupported), false, &why));
  EXPECT_NE(why.find("(100,64)"), std::string::npos) << why;
}

}  // namespace
}  // namespace fp4moe
