// CPU reference of the token embedding (kernels/nn/embedding.h): the gather, zero rows for ids outside [0, V),
// the backward as the gradient of sum(out * g) (finite differences in double), accumulation (+=) into grad, the
// per-id sum order (position order, one FP32 sum then one addition to grad), and rejections.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/nn/embedding.h"
#include "tests/common/nn_ref_test_util.h"

namespace fp4moe {
namespace {

using test::bf16_to_f64;
using test::to_bf16;

TEST(NnRefEmbedding, ForwardGathersRowsAndZeroesInvalidIds) {
  const int64_t V = 5, d = 3, M = 6;
  const auto table = to_bf16(test::normal_values(V * d, 1));
  const std::vector<int32_t> tokens = {4, 0, 4, -1, 5, 2};
  std::vector<bf16> out(M * d);
  EXPECT_EQ(embedding_forward_ref(tokens.data(), M, table.data(), V, d, out.data()), 2);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t c = 0; c < d; ++c) {
      const bool valid = tokens[m] >= 0 && tokens[m] < V;
      const uint16_t expected = valid ? bf16_bits(table[tokens[m] * d + c]) : 0;
      EXPECT_EQ(bf16_bits(out[m * d + c]), expected) << "m=" << m << " c=" << c;
    }
}

TEST(NnRefEmbedding, BackwardIsTheGradientOfTheGather) {
  // loss(table) = sum_{m, c} table[tokens[m], c] * g[m, c]; its gradient is what embedding_backward_ref adds.
  const int64_t V = 7, d = 4, M = 12;
  const std::vector<int32_t> tokens = {3, 1, 3, 6, 0, 3, 1, 6, 6, 2, 3, 0};
  std::vector<double> table = test::normal_values(V * d, 2);
  const auto g = to_bf16(test::normal_values(M * d, 3));
  auto loss = [&] {
    double s = 0;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t c = 0; c < d; ++c) s += table[tokens[m] * d + c] * bf16_to_f64(g[m * d + c]);
    return s;
  };
  const std::vector<double> fd = test::finite_difference_gradient(table, loss);
  std::vector<float> grad(V * d, 0.0f);
  embedding_backward_ref(tokens.data(), M, g.data(), V, d, grad.data());
  std::vector<double> analytic(grad.begin(), grad.end());
  test::expect_gradient_matches(analytic, fd, "dtable", 1e-5);  // FP32 sums of a few BF16 values
  for (int64_t c = 0; c < d; ++c) EXPECT_EQ(grad[4 * d + c], 0.0f) << "id 4 never appears";
}

TEST(NnRefEmbedding, BackwardAccumulatesOneSumPerIdInPositionOrder) {
  // id 0 at positions 0, 1, 2 with rows 1, 2^-24, 2^-24 (exact in BF16) onto grad = 2^-23. The per-id FP32 sum in
  // position order is 1 (each 2^-24 is a tie that rounds back to 1), then grad = 2^-23 + 1 = 1 + 2^-23. Summing
  // in reverse order (2^-23 + 1 + 2^-23) or adding each row to grad directly (1 + 2^-23, then two ties to even)
  // would give 1 + 2^-22.
  const int64_t V = 2, d = 1, M = 4;
  const std::vector<int32_t> tokens = {0, 0, 0, 1};
  const std::vector<bf16> dout = to_bf16({1.0, std::ldexp(1.0, -24), std::ldexp(1.0, -24), 3.0});
  std::vector<float> grad = {std::ldexp(1.0f, -23), 0.5f};
  embedding_backward_ref(tokens.data(), M, dout.data(), V, d, grad.data());
  EXPECT_EQ(grad[0], 1.0f + std::ldexp(1.0f, -23));
  EXPECT_EQ(grad[1], 3.5f);  // += onto the existing gradient
}

TEST(NnRefEmbedding, BackwardSkipsInvalidIds) {
  const int64_t V = 3, d = 2, M = 4;
  const std::vector<int32_t> tokens = {-5, 1, 3, 1};
  const std::vector<bf16> dout = to_bf16({9, 9, 1, 2, 9, 9, 4, 8});
  std::vector<float> grad(V * d, 0.0f);
  embedding_backward_ref(tokens.data(), M, dout.data(), V, d, grad.data());
  const std::vector<float> expected = {0, 0, 5, 10, 0, 0};
  EXPECT_EQ(grad, expected);
}

TEST(NnRefEmbedding, Rejections) {
  const std::vector<int32_t> tokens(4, 0);
  const std::vector<bf16> table(8);
  std::vector<bf16> out(8);
  std::vector<float> grad(8);
  test::expect_error_mentions([&] { embedding_forward_ref(tokens.data(), -1, table.data(), 4, 2, out.data()); },
                              {"embedding_forward_ref", "M must be >= 0"});
  test::expect_error_mentions([&] { embedding_forward_ref(tokens.data(), 4, table.data(), 0, 2, out.data()); },
                              {"V must be >= 1"});
  test::expect_error_mentions([&] { embedding_backward_ref(tokens.data(), 4, table.data(), 4, 0, grad.data()); },
                              {"embedding_backward_ref", "d must be >= 1"});
  test::expect_error_mentions(
      [&] { embedding_forward_ref(tokens.data(), int64_t{1} << 31, table.data(), 4, 2, out.data()); },
      {"below 2^31"});
  test::expect_error_mentions(
      [&] { embedding_forward_ref(tokens.data(), 4, table.data(), 4, (int64_t{1} << 23) + 1, out.data()); },
      {"2^23 columns"});
}

}  // namespace
}  // namespace fp4moe
