// The attention core's backend choice (kernels/attention/attention_backend.h) and what the cuDNN backend
// (cudnn_sdpa.h) answers without a GPU: the names and their parsing, choose_attention_backend for own, cudnn and
// auto given a refusal, two timings or none, the model's AttentionCore (attention_core.h) where no cuDNN object can
// be made, the "not built" message, the dense layout.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>

#include "kernels/attention/attention_backend.h"
#include "kernels/attention/attention_core.h"
#include "kernels/attention/cudnn_sdpa.h"
#include "kernels/common/check.h"
#include "tests/common/nn_ref_test_util.h"

namespace fp4moe {
namespace {

using test::expect_error_mentions;

const AttentionShape kMla{1, 4096, 128, 192, 128, 0.0721687836f};

TEST(AttentionBackend, NamesParseBack) {
  for (AttentionBackend b : {AttentionBackend::own, AttentionBackend::cudnn, AttentionBackend::automatic})
    EXPECT_EQ(parse_attention_backend(attention_backend_name(b), "option"), b) << attention_backend_name(b);
  EXPECT_STREQ(attention_backend_name(AttentionBackend::automatic), "auto");
  expect_error_mentions([] { parse_attention_backend("cuDNN", "model.attention_backend"); },
                        {"model.attention_backend = 'cuDNN'", "own", "cudnn", "auto"});
  expect_error_mentions([] { parse_attention_backend("", "model.attention_backend"); }, {"''"});
}

bool mentions(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(AttentionBackend, OwnNeedsNothingOfCudnn) {
  std::string note;
  CudnnAtShape refused;
  refused.refusal = "no device";
  EXPECT_EQ(choose_attention_backend(AttentionBackend::own, kMla, false, refused, &note), AttentionBackend::own);
  EXPECT_TRUE(mentions(note, "own")) << note;
  EXPECT_FALSE(mentions(note, "no device")) << note;
}

// A refusal: auto falls back to our kernels and says why at which shape; cudnn is an error naming both.
TEST(AttentionBackend, RefusalFallsBackUnderAutoAndIsAnErrorUnderCudnn) {
  CudnnAtShape at;
  at.refusal = "cuDNN has no engine for this";
  std::string note;
  EXPECT_EQ(choose_attention_backend(AttentionBackend::automatic, kMla, true, at, &note), AttentionBackend::own);
  for (const char* part : {"own", "auto", "B=1 T=4096 H=128 192/128", "cuDNN has no engine for this"})
    EXPECT_TRUE(mentions(note, part)) << part << " not in: " << note;
  expect_error_mentions([&] { choose_attention_backend(AttentionBackend::cudnn, kMla, false, at, nullptr); },
                        {"attention backend cudnn cannot run the attention at B=1 T=4096 H=128 192/128",
                         "cuDNN has no engine for this"});
}

TEST(AttentionBackend, CudnnWhereItRunsSaysTheBackwardMode) {
  std::string note;
  EXPECT_EQ(choose_attention_backend(AttentionBackend::cudnn, kMla, true, CudnnAtShape{}, &note),
            AttentionBackend::cudnn);
  EXPECT_TRUE(mentions(note, "cudnn")) << note;
  EXPECT_TRUE(mentions(note, "deterministic backward")) << note;
  EXPECT_TRUE(mentions(note, "B=1 T=4096 H=128 192/128")) << note;
  choose_attention_backend(AttentionBackend::cudnn, kMla, false, CudnnAtShape{}, &note);
  EXPECT_TRUE(mentions(note, "non-deterministic backward")) << note;
}

// auto with both times: the faster, both times in the one-line note; at a tie our kernels (the reference).
TEST(AttentionBackend, AutoTakesTheFasterAndNamesBothTimes) {
  struct Case {
    double own_ms, cudnn_ms;
    AttentionBackend expected;
  };
  for (const Case& c : {Case{2.5, 1.25, AttentionBackend::cudnn}, Case{0.75, 1.5, AttentionBackend::own},
                        Case{1.0, 1.0, AttentionBackend::own}}) {
    CudnnAtShape at;
    at.times = AttentionTimes{c.own_ms, c.cudnn_ms};
    std::string note;
    EXPECT_EQ(choose_attention_backend(AttentionBackend::automatic, kMla, false, at, &note), c.expected) << note;
    EXPECT_EQ(note.rfind(std::string("attention backend: ") + attention_backend_name(c.expected), 0), 0u) << note;
    EXPECT_TRUE(mentions(note, fmt::format("own {:.4g} ms", c.own_ms))) << note;
    EXPECT_TRUE(mentions(note, fmt::format("cudnn {:.4g} ms", c.cudnn_ms))) << note;
    EXPECT_TRUE(mentions(note, "B=1 T=4096 H=128 192/128")) << note;
    EXPECT_FALSE(mentions(note, "\n")) << "one line: " << note;
  }
}

// auto where cuDNN runs but nothing was timed (the buffers could not be allocated): cuDNN, and the note says why.
TEST(AttentionBackend, AutoUntimedPrefersCudnnAndSaysWhy) {
  CudnnAtShape at;
  at.untimed = "cudaMalloc of 512.0 MiB failed";
  std::string note;
  EXPECT_EQ(choose_attention_backend(AttentionBackend::automatic, kMla, false, at, &note), AttentionBackend::cudnn);
  EXPECT_TRUE(mentions(note, "untimed")) << note;
  EXPECT_TRUE(mentions(note, "cudaMalloc of 512.0 MiB failed")) << note;
}

// Where no cuDNN object can be made here (a build without cuDNN, or no usable device: this machine's CPU tests), the
// model's AttentionCore under auto runs our kernels with the reason in its note, under cudnn it is an error with the
// same reason, and own never asks for cuDNN. Skipped where cuDNN can be used (a GPU machine; the GPU tests cover it).
TEST(AttentionBackend, CoreFallsBackWhenCudnnCannotBeMade) {
  std::string reason;
  try {
    CudnnSdpa sdpa;
  } catch (const Error& e) {
    reason = e.what();
  }
  if (reason.empty()) GTEST_SKIP() << "cuDNN is usable here: " << cudnn_sdpa_version_text();
  const std::string first_line = reason.substr(0, reason.find(" ("));
  const SdpaLayout dense = SdpaLayout::dense(kMla);
  AttentionCore automatic(AttentionBackend::automatic, false, kMla, dense, 0, nullptr);
  EXPECT_EQ(automatic.backend(), AttentionBackend::own);
  EXPECT_EQ(automatic.workspace_bytes(), 0);
  EXPECT_TRUE(mentions(automatic.note(), "auto")) << automatic.note();
  EXPECT_TRUE(mentions(automatic.note(), first_line)) << automatic.note() << " does not say: " << reason;
  EXPECT_EQ(automatic.backend_at(kMla, dense, true), AttentionBackend::own);
  expect_error_mentions([&] { AttentionCore c(AttentionBackend::cudnn, false, kMla, dense, 0, nullptr); },
                        {"attention backend cudnn cannot run the attention at B=1 T=4096 H=128 192/128",
                         first_line.c_str()});
  AttentionCore own(AttentionBackend::own, false, kMla, dense, 0, nullptr);
  EXPECT_EQ(own.backend(), AttentionBackend::own);
  EXPECT_EQ(own.backend_at(kMla, dense, false), AttentionBackend::own);
}

TEST(AttentionBackend, CudnnSdpaSaysWhenItIsNotBuilt) {
  if (cudnn_sdpa_built()) GTEST_SKIP() << "this build has cuDNN: " << cudnn_sdpa_version_text();
  EXPECT_NE(cudnn_sdpa_version_text().find("not built with cuDNN"), std::string::npos);
  expect_error_mentions([] { CudnnSdpa sdpa; }, {"CudnnSdpa", "not built", "FP4MOE_WITH_CUDNN"});
}

TEST(AttentionBackend, DenseLayoutStrides) {
  const SdpaLayout l = SdpaLayout::dense(kMla);
  for (const AttnStrides* qk : {&l.q, &l.k, &l.dq, &l.dk}) {
    EXPECT_EQ(qk->token_stride, 128 * 192);
    EXPECT_EQ(qk->head_stride, 192);
  }
  for (const AttnStrides* v : {&l.v, &l.o, &l.dout, &l.dv}) {
    EXPECT_EQ(v->token_stride, 128 * 128);
    EXPECT_EQ(v->head_stride, 128);
  }
}

}  // namespace
}  // namespace fp4moe
