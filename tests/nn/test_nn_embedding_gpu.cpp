// GPU token embedding (kernels/nn/embedding.h) against its CPU reference, bit for bit: the gather (16-byte and
// 2-byte paths), the error flag and zero rows for ids outside [0, V), and the sort-based backward (+= into an FP32
// gradient, repeated ids summed in position order, invalid ids skipped, same bits on a second run). Shapes: one
// token, primes, the tiny model's (256 tokens, V = 32768, d = 64) and a V3-width row (d = 7168). Outputs are
// NaN-poisoned and guarded.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "tests/common/nn_test_util.h"
#include "kernels/nn/embedding.h"

namespace fp4moe {
namespace {

using test::Guarded;

struct Case {
  int64_t M, V, d;
  int64_t distinct;  // token ids drawn from [0, distinct) (small: many repeats)
  size_t shift;      // 1: BF16 tensors shifted by one element (2-byte path)
};

const Case kCases[] = {{1, 1, 8, 1, 0},         {13, 7, 5, 7, 0},          {101, 1000, 24, 17, 1},
                       {256, 32768, 64, 32768, 0}, {256, 32768, 64, 8, 0}, {64, 1000, 7168, 40, 0},
                       {4099, 129, 40, 129, 1}};

std::string name_of(const Case& c) {
  return "M=" + std::to_string(c.M) + " V=" + std::to_string(c.V) + " d=" + std::to_string(c.d) +
         " distinct=" + std::to_string(c.distinct) + (c.shift ? " (shifted)" : "");
}

std::vector<int32_t> random_tokens(int64_t M, int64_t distinct, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(M);
  for (auto& x : t) x = static_cast<int32_t>(rng() % static_cast<uint32_t>(distinct));
  return t;
}

TEST(NnEmbedding, ForwardMatchesReference) {
  FP4MOE_REQUIRE_DEVICE();
  for (const Case& tc : kCases) {
    SCOPED_TRACE(name_of(tc));
    const auto tokens = random_tokens(tc.M, tc.distinct, 10 + tc.M);
    const auto table = test::random_bf16(tc.V * tc.d, 20 + tc.d);
    std::vector<bf16> ref(tc.M * tc.d);
    ASSERT_EQ(embedding_forward_ref(tokens.data(), tc.M, table.data(), tc.V, tc.d, ref.data()), 0);
    Guarded<int32_t> tok_d(tc.M), flag_d(1);
    Guarded<bf16> table_d(tc.V * tc.d, tc.shift), out_d(tc.M * tc.d, tc.shift);
    tok_d.upload(tokens);
    table_d.upload(table);
    flag_d.upload({0});
    embedding_forward(tok_d.ptr(), tc.M, table_d.ptr(), tc.V, tc.d, out_d.ptr(), flag_d.ptr(), nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    test::expect_bitwise_equal(out_d.download(), ref, "out");
    EXPECT_EQ(flag_d.download()[0], 0) << "no invalid id, the flag stays 0";
    EXPECT_TRUE(out_d.guards_intact());
  }
}

TEST(NnEmbedding, ForwardFlagsInvalidIdsAndZeroesTheirRows) {
  FP4MOE_REQUIRE_DEVICE();
  const int64_t V = 50, d = 16, M = 6;
  const std::vector<int32_t> tokens = {3, -1, 49, 50, 0, 1 << 30};
  const auto table = test::random_bf16(V * d, 5);
  std::vector<bf16> ref(M * d);
  ASSERT_EQ(embedding_forward_ref(tokens.data(), M, table.data(), V, d, ref.data()), 3);
  Guarded<int32_t> tok_d(M), flag_d(1);
  Guarded<bf16> table_d(V * d), out_d(M * d);
  tok_d.upload(tokens);
  table_d.upload(table);
  flag_d.upload({0});
  embedding_forward(tok_d.ptr(), M, table_d.ptr(), V, d, out_d.ptr(), flag_d.ptr(), nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  test::expect_bitwise_equal(out_d.download(), ref, "out with zero rows");
  EXPECT_EQ(flag_d.download()[0], 1);
}

TEST(NnEmbedding, BackwardMatchesReferenceBitwise) {
  FP4MOE_REQUIRE_DEVICE();
  for (const Case& tc : kCases) {
    SCOPED_TRACE(name_of(tc));
    auto tokens = random_tokens(tc.M, tc.distinct, 30 + tc.M);
    if (tc.M > 2) {  // ids outside [0, V): skipped
      tokens[tc.M / 2] = -3;
      tokens[tc.M - 1] = static_cast<int32_t>(tc.V);
    }
    const auto dout = test::random_bf16(tc.M * tc.d, 40 + tc.d);
    const auto grad0 = test::random_f32(tc.V * tc.d, 50 + tc.V);
    std::vector<float> ref = grad0;
    embedding_backward_ref(tokens.data(), tc.M, dout.data(), tc.V, tc.d, ref.data());

    const int64_t ws_bytes = embedding_backward_workspace_bytes(tc.M, tc.V);
    Guarded<int32_t> tok_d(tc.M);
    Guarded<bf16> dout_d(tc.M * tc.d, tc.shift);
    Guarded<float> grad_d(tc.V * tc.d);
    test::DeviceBuffer<unsigned char> ws(static_cast<size_t>(ws_bytes));
    tok_d.upload(tokens);
    dout_d.upload(dout);
    grad_d.upload(grad0);
    ws.poison();
    embedding_backward(tok_d.ptr(), tc.M, dout_d.ptr(), tc.V, tc.d, grad_d.ptr(), ws.ptr, ws_bytes, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    const auto grad = grad_d.download();
    test::expect_bitwise_equal(grad, ref, "grad");
    EXPECT_TRUE(grad_d.guards_intact());

    // A second run from the same starting gradient gives the same bits.
    grad_d.upload(grad0);
    ws.poison(0x3C);
    embedding_backward(tok_d.ptr(), tc.M, dout_d.ptr(), tc.V, tc.d, grad_d.ptr(), ws.ptr, ws_bytes, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    test::expect_bitwise_equal(grad_d.download(), grad, "grad, second run");
  }
}

TEST(NnEmbedding, Rejections) {
  FP4MOE_REQUIRE_DEVICE();
  const int64_t M = 16, V = 100, d = 8;
  const int64_t ws_bytes = embedding_backward_workspace_bytes(M, V);
  Guarded<int32_t> tok_d(M);
  Guarded<bf16> dout_d(M * d);
  Guarded<float> grad_d(V * d);
  test::DeviceBuffer<unsigned char> ws(static_cast<size_t>(ws_bytes));
  EXPECT_THROW(embedding_backward(tok_d.ptr(), M, dout_d.ptr(), V, d, grad_d.ptr(), ws.ptr, ws_bytes - 1, nullptr),
               Error);
  EXPECT_THROW(embedding_backward(tok_d.ptr(), M, dout_d.ptr(), V, d, grad_d.ptr(), nullptr, ws_bytes, nullptr), Error);
  EXPECT_THROW(embedding_forward(nullptr, M, dout_d.ptr(), V, d, dout_d.ptr(), nullptr, nullptr), Error);
  EXPECT_THROW(embedding_forward(tok_d.ptr(), M, dout_d.ptr(), 0, d, dout_d.ptr(), nullptr, nullptr), Error);
  EXPECT_EQ(embedding_backward_workspace_bytes(0, V), 0);
}

}  // namespace
}  // namespace fp4moe
