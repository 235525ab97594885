// The attention core's backend resolved per shape (kernels/attention/attention_core.h) on the GPU, at the MLA pair
// (192, 128), T 256, H 4, checked against the FP64 reference with the tolerances of our kernels' test
// (tests/common/attention_test_util.h, outputs NaN-poisoned before each run):
//   - auto: both backends timed at the main shape (B 2), the note one line naming both times and the choice; the
//     core right at the main shape and at one sequence (a row count resolved at its first call);
//   - auto whose timing could not take its buffers (a limit of 0 bytes): cuDNN kept untimed, the note says why; a
//     backward at B 2 whose plan asks more workspace than the one sized at B 1 runs our kernels, and is right;
//   - cudnn: the same backward is an error naming the shape and the workspace, before any launch.
// Skipped with the reason when no device is usable or this build has no cuDNN.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "kernels/attention/attention_core.h"
#include "kernels/attention/flash_attention.h"
#include "tests/common/attention_test_util.h"

namespace fp4moe {
namespace {

using test::AttnCase;

constexpr int64_t kNoLimit = std::numeric_limits<int64_t>::max();

// The MLA pair at T 256 on 4 heads, `B` sequences (dense tensors, as run_and_check lays out a case not strided).
AttnCase mla_case(int64_t B) { return AttnCase{192, 128, B, 256, 4}; }

// A core and its cuDNN workspace (the size it asks), as the model holds them.
struct CoreWithWorkspace {
  AttentionCore core;
  test::DeviceBuffer<unsigned char> workspace;
  CoreWithWorkspace(AttentionBackend choice, int64_t B, int64_t timing_max_bytes)
      : core(choice, false, mla_case(B).shape(), SdpaLayout::dense(mla_case(B).shape()), timing_max_bytes, nullptr),
        workspace(static_cast<size_t>(core.workspace_bytes())) {
    if (core.workspace_bytes() > 0) core.set_workspace(workspace.ptr, core.workspace_bytes());
  }
};

// The core as run_and_check calls an implementation; our backward's workspace brought and NaN-poisoned per run.
// The repeatability check applies where every shape runs our kernels (the cuDNN backward here is non-deterministic).
test::AttentionImpl core_impl(AttentionCore& core) {
  test::AttentionImpl impl;
  impl.name = "AttentionCore: " + core.note();
  impl.deterministic_backward = core.backend() == AttentionBackend::own;
  impl.forward = [&core](const AttentionShape& s, AttnIn q, AttnIn k, AttnIn v, AttnOut o, float* lse) {
    core.forward(s, q, k, v, o, lse, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
  };
  impl.backward = [&core](const AttentionShape& s, AttnIn q, AttnIn k, AttnIn v, AttnIn o, AttnIn dout,
                          const float* lse, AttnOut dq, AttnOut dk, AttnOut dv) {
    test::DeviceBuffer<unsigned char> ws(static_cast<size_t>(flash_attention_backward_workspace_bytes(s)));
    ws.poison(test::kNanPoison);
    core.backward(s, q, k, v, o, dout, lse, dq, dk, dv, ws.ptr, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
  };
  return impl;
}

TEST(AttentionCoreGpu, AutoTimesBothBackendsAndRunsEveryRowCountRight) {
  FP4MOE_REQUIRE_CUDNN();
  CoreWithWorkspace c(AttentionBackend::automatic, 2, kNoLimit);
  const std::string& note = c.core.note();
  std::printf("%s\n", note.c_str());
  const std::string chosen = attention_backend_name(c.core.backend());
  EXPECT_EQ(note.rfind("attention backend: " + chosen + " (auto, forward + backward at B=2 T=256 H=4 192/128: own ", 0),
            0u)
      << note;
  EXPECT_NE(note.find(" ms, cudnn "), std::string::npos) << note;
  EXPECT_EQ(note.find('\n'), std::string::npos) << note;
  EXPECT_EQ(c.core.workspace_bytes() > 0, c.core.backend() == AttentionBackend::cudnn)
      << "a cuDNN workspace only where cuDNN was chosen";
  const test::AttentionImpl impl = core_impl(c.core);
  test::run_and_check(mla_case(2), impl);
  test::run_and_check(mla_case(1), impl);  // fewer sequences: decided at its first call, on the chosen backend
  const AttentionShape one = mla_case(1).shape();
  EXPECT_EQ(c.core.backend_at(one, SdpaLayout::dense(one), false), c.core.backend());
}

TEST(AttentionCoreGpu, UntimedAutoKeepsCudnnAndFallsBackWhereTheWorkspaceIsShort) {
  FP4MOE_REQUIRE_CUDNN();
  CoreWithWorkspace c(AttentionBackend::automatic, 1, 0);
  const std::string& note = c.core.note();
  EXPECT_EQ(c.core.backend(), AttentionBackend::cudnn) << note;
  EXPECT_NE(note.find("untimed"), std::string::npos) << note;
  EXPECT_NE(note.find("exceed the 0.0 MiB allowed"), std::string::npos) << note;
  const AttentionShape one = mla_case(1).shape(), two = mla_case(2).shape();
  {  // the premise: the non-deterministic backward's workspace (its FP32 dQ accumulator) grows with B
    CudnnSdpa probe;
    ASSERT_GT(probe.backward_workspace_bytes(two, SdpaLayout::dense(two), false), c.core.workspace_bytes());
  }
  EXPECT_EQ(c.core.backend_at(one, SdpaLayout::dense(one), true), AttentionBackend::cudnn);
  EXPECT_EQ(c.core.backend_at(two, SdpaLayout::dense(two), true), AttentionBackend::own);
  test::run_and_check(mla_case(2), core_impl(c.core));  // its backward on our kernels, on the forward's lse
  test::run_and_check(mla_case(1), core_impl(c.core));  // all on cuDNN
}

TEST(AttentionCoreGpu, CudnnNamesTheShapeItCannotRun) {
  FP4MOE_REQUIRE_CUDNN();
  CoreWithWorkspace c(AttentionBackend::cudnn, 1, kNoLimit);
  EXPECT_EQ(c.core.backend(), AttentionBackend::cudnn) << c.core.note();
  const AttentionShape two = mla_case(2).shape();
  const SdpaLayout l = SdpaLayout::dense(two);
  const std::string size = fmt::format("{} were allocated (for B=1 T=256 H=4 192/128)", c.core.workspace_bytes());
  // No tensors: the refusal comes before any check of the pointers or launch.
  const auto backward = [&] {
    c.core.backward(two, attn_in(nullptr, l.q), attn_in(nullptr, l.k), attn_in(nullptr, l.v), attn_in(nullptr, l.o),
                    attn_in(nullptr, l.dout), nullptr, attn_out(nullptr, l.dq), attn_out(nullptr, l.dk),
                    attn_out(nullptr, l.dv), nullptr, nullptr);
  };
  for (int attempt = 0; attempt < 2; ++attempt) {  // refused again: a refusal is not cached as a choice
    try {
      backward();
      ADD_FAILURE() << "expected fp4moe::Error naming B=2 T=256 H=4 192/128";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("attention backend cudnn cannot run the attention at B=2 T=256 H=4 192/128"),
                std::string::npos) << what;
      EXPECT_NE(what.find("backward plan asks"), std::string::npos) << what;
      EXPECT_NE(what.find(size), std::string::npos) << what;
    }
  }
  // The core still runs the shape it was sized for.
  test::run_and_check(mla_case(1), core_impl(c.core));
}

}  // namespace
}  // namespace fp4moe
