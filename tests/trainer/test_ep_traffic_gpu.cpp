// GPU test of the traffic measurement of the expert-parallel MoE layer (trainer/model/ep_traffic.h), which
// benchmarks/bench_ep_comm.cu runs at the DeepSeek-V3 and V2 shapes: simulate_ep_step over N = 1, 2, 4, 8
// simulated ranks (one GPU), routed recipes bf16, fp8, mxfp4, d = 160 (an FP8 row of a full and a partial 128-block,
// five MXFP4 blocks of 32), E = 8 experts (one per rank at N = 8), top-k 3, 37 tokens per rank, the router choosing.
// Checked per exchange kind: the bytes the transport copied (InProcessGroup's log), those the layers counted
// (EpExchange::bytes over the ranks) and the formats' arithmetic (ep_step_bytes_by_formats) are equal; what crossed
// between distinct ranks is the layers' sent and received; at N = 1 nothing leaves the rank; the dispatch buffers'
// bytes per routed token are the format's (fp8: its scale tensor pads the rows to a multiple of 4), as
// MoeRoutedExperts::dispatch_bytes counts them.
// Run: fp4moe_tests_gpu_trainer --gtest_filter='EpTrafficGpu*'
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>

#include "kernels/quant/layouts.h"
#include "tests/common/gpu_test_util.h"
#include "trainer/memory/estimate.h"
#include "trainer/model/ep_traffic.h"
#include "trainer/model/moe_expert_parallel.h"
#include "trainer/model/recipe.h"

namespace fp4moe {
namespace {

constexpr int64_t kD = 160, kE = 8, kK = 3, kF = 64, kTokens = 37;

class EpTrafficGpu : public testing::TestWithParam<std::tuple<int, std::string>> {};

TEST_P(EpTrafficGpu, TransportLayersAndFormatsAgree) {
  FP4MOE_REQUIRE_DEVICE();
  const int N = std::get<0>(GetParam());
  const Recipe recipe = parse_recipe(std::get<1>(GetParam()), "the test's recipe");
  const TrainerConfig cfg = ep_probe_config(kD, recipe, kK, kE, kF);
  const EpSimulatedStep s = simulate_ep_step(cfg, N, kTokens, 99);
  ASSERT_EQ(s.routed_rows, N * kTokens * kK);
  const auto want = ep_step_bytes_by_formats(recipe, kD, N, kE, s.routed_rows);
  int64_t between = 0;
  for (int i = 0; i < kEpExchangeKinds; ++i) {
    SCOPED_TRACE(ep_exchange_kind_name(static_cast<EpExchangeKind>(i)));
    const EpExchangeBytes &t = s.transport.kind[i], &l = s.layers.kind[i];
    EXPECT_EQ(t.sent + t.to_self, want[static_cast<size_t>(i)]) << "the transport's copies";
    EXPECT_EQ(l.sent + l.to_self, want[static_cast<size_t>(i)]) << "the layers' count";
    EXPECT_EQ(t.sent, l.sent) << "between distinct ranks";
    EXPECT_EQ(t.received, l.received);
    EXPECT_EQ(t.to_self, l.to_self);
    between += t.sent;
  }
  if (N == 1) EXPECT_EQ(between, 0) << "one rank sends nothing";
  else EXPECT_GT(between, 0) << "the router's choice sends rows to other ranks";

  // The experts' buffers hold R = ep max_tokens min(k, E_l) rows; fp8's FP32 scale tensor pads them to 4.
  const double R = static_cast<double>(ExpertParallelMoeLayer::max_received_rows(cfg, kTokens, N));
  const double payload = recipe == Recipe::bf16 ? 2.0 * kD : recipe == Recipe::fp8 ? kD : kD / 2.0;
  const double scales = recipe == Recipe::bf16 ? 0.0
                        : recipe == Recipe::fp8 ? 4.0 * static_cast<double>(fp8_row_scale_count(
                                                             static_cast<int64_t>(R), kD)) / R
                                                : kD / 32.0;
  EXPECT_EQ(s.dispatch_payload_per_token, payload);
  EXPECT_DOUBLE_EQ(s.dispatch_scales_per_token, scales);
  EXPECT_EQ(payload + (recipe == Recipe::fp8 ? 4.0 * 2 /* two 1x128 blocks */ : scales),
            static_cast<double>(expert_parallel_row_bytes(recipe, kD).dispatch)) << "the wire row";
}

INSTANTIATE_TEST_SUITE_P(RanksRecipes, EpTrafficGpu,
                         testing::Combine(testing::Values(1, 2, 4, 8), testing::Values("bf16", "fp8", "mxfp4")),
                         [](const testing::TestParamInfo<std::tuple<int, std::string>>& i) {
                           return "N" + std::to_string(std::get<0>(i.param)) + "_" + std::get<1>(i.param);
                         });

}  // namespace
}  // namespace fp4moe
