// The attention core's backend choice (kernels/attention/attention_backend.h) and what the cuDNN backend
// (cudnn_sdpa.h) answers without a GPU: the names and their parsing, the resolution of own, cudnn and auto when no
// cuDNN object is at hand (a build without cuDNN), the "not built" message, the dense layout.
#include <gtest/gtest.h>

#include <string>

#include "kernels/attention/attention_backend.h"
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

TEST(AttentionBackend, ResolvesWithoutACudnnObject) {
  const SdpaLayout dense = SdpaLayout::dense(kMla);
  std::string note;
  EXPECT_EQ(resolve_attention_backend(AttentionBackend::own, nullptr, kMla, dense, false, &note),
            AttentionBackend::own);
  EXPECT_NE(note.find("own"), std::string::npos) << note;
  // auto falls back to our kernels and says why; cudnn refuses.
  EXPECT_EQ(resolve_attention_backend(AttentionBackend::automatic, nullptr, kMla, dense, true, &note),
            AttentionBackend::own);
  EXPECT_NE(note.find("auto"), std::string::npos) << note;
  EXPECT_NE(note.find("B=1 T=4096 H=128 192/128"), std::string::npos) << note;
  expect_error_mentions(
      [&] { resolve_attention_backend(AttentionBackend::cudnn, nullptr, kMla, dense, false, nullptr); },
      {"attention backend cudnn cannot run the attention at B=1 T=4096 H=128 192/128"});
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
