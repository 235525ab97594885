// GPU decoupled RoPE (kernels/nn/rope.h) against its CPU reference: forward and backward on dense [T, H, 64]
// tensors (q_pe with DeepSeek-V3's 128 heads, k_pe with one), strided views of the rope part inside q [T, H, 192]
// and inside the kv down-projection output [T, 576] (the rest must stay untouched), in place, position offsets
// and sequence restarts, D not a multiple of 8 (scalar path). Outputs are NaN-poisoned and guarded.
// Tolerance per pair (x0, x1): one BF16 ulp (2^-7 relative) + 2^-18 (|x0| + |x1|), which covers sincosf's few FP32
// ulps and the rotation's FP32 rounding where x0 cos - x1 sin cancels.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "tests/common/nn_test_util.h"
#include "kernels/nn/rope.h"

namespace fp4moe {
namespace {

using test::Guarded;
using test::TinyShapes;
using test::value_of;

struct Case {
  int64_t T, H, D;
  int64_t width, offset;  // the view: each head's D elements at `offset` within rows of `width` per head
  RopeConfig cfg;
};

const Case kCases[] = {
    {1, 1, 64, 64, 0, {}},
    {7, 128, 64, 64, 0, {10000.0f, 0, 0}},
    {4099, 1, 64, 64, 0, {10000.0f, 0, 0}},                                             // k_pe, one sequence
    {TinyShapes::tokens, TinyShapes::heads, 64, 64, 0, {10000.0f, 0, TinyShapes::seq_len}},
    {TinyShapes::tokens, TinyShapes::heads, 64, 192, 128, {10000.0f, 0, TinyShapes::seq_len}},  // inside q
    {509, 1, 64, 576, 512, {10000.0f, 3, 0}},                                          // inside kv_a output
    {2048, 128, 64, 192, 128, {10000.0f, 4093, 1024}},                                 // V3 q, two sequences
    {13, 3, 2, 2, 0, {500.0f, 11, 0}},
    {31, 5, 6, 10, 2, {10000.0f, 0, 7}},
    {3, 2, 256, 256, 0, {1e6f, 100000, 0}},
};

std::string name_of(const Case& c) {
  return "T=" + std::to_string(c.T) + " H=" + std::to_string(c.H) + " D=" + std::to_string(c.D) +
         " width=" + std::to_string(c.width) + " offset=" + std::to_string(c.offset) +
         " pos0=" + std::to_string(c.cfg.position_offset) + " seq_len=" + std::to_string(c.cfg.seq_len);
}

TEST(NnRope, MatchesReference) {
  FP4MOE_REQUIRE_DEVICE();
  for (const Case& tc : kCases) {
    SCOPED_TRACE(name_of(tc));
    const int64_t T = tc.T, H = tc.H, D = tc.D, W = tc.width, n = T * H * W;
    const int64_t ts = H * W, hs = W;
    const auto x = test::random_bf16(n, 700 + T, 0.0, 2.0);
    for (bool inverse : {false, true}) {
      SCOPED_TRACE(inverse ? "backward" : "forward");
      // Reference on host copies: the output starts as the poison pattern so untouched elements compare equal.
      std::vector<bf16> y_ref(n, bf16_from_bits(0xFFFF));
      rope_ref(RopeTensor{x.data() + tc.offset, ts, hs}, T, H, D, tc.cfg,
               RopeTensorOut{y_ref.data() + tc.offset, ts, hs}, inverse);
      Guarded<bf16> x_d(n), y_d(n), inplace_d(n);
      x_d.upload(x);
      inplace_d.upload(x);
      const RopeTensor in{x_d.ptr() + tc.offset, ts, hs};
      const RopeTensorOut out{y_d.ptr() + tc.offset, ts, hs}, io{inplace_d.ptr() + tc.offset, ts, hs};
      if (inverse) {
        rope_backward(in, T, H, D, tc.cfg, out, nullptr);
        rope_backward(RopeTensor{io.data, ts, hs}, T, H, D, tc.cfg, io, nullptr);
      } else {
        rope_forward(in, T, H, D, tc.cfg, out, nullptr);
        rope_forward(RopeTensor{io.data, ts, hs}, T, H, D, tc.cfg, io, nullptr);
      }
      CUDA_CHECK(cudaDeviceSynchronize());
      const auto y = y_d.download(), inplace = inplace_d.download();
      // Inside the view: y against the reference within tolerance. Outside: y keeps its NaN poison (y_ref starts
      // with the same bits) and the in-place tensor keeps x; inside, in place equals out of place bit for bit.
      std::vector<bf16> y_in_view, ref_in_view, y_outside, ref_outside, inplace_expected = x;
      std::vector<double> view_atol;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t d = i % W - tc.offset;
        if (d >= 0 && d < D) {
          const int64_t pair = i - d % 2;
          y_in_view.push_back(y[i]);
          ref_in_view.push_back(y_ref[i]);
          view_atol.push_back(std::ldexp(1.0, -18) * (std::fabs(value_of(x[pair])) + std::fabs(value_of(x[pair + 1]))) +
                              1e-30);
          inplace_expected[i] = y[i];
        } else {
          y_outside.push_back(y[i]);
          ref_outside.push_back(y_ref[i]);
        }
      }
      test::expect_close(y_in_view, ref_in_view, test::kBf16Rtol, [&](size_t k) { return view_atol[k]; }, "y");
      test::expect_bitwise_equal(y_outside, ref_outside, "y outside the rope view (untouched)");
      test::expect_bitwise_equal(inplace, inplace_expected, "in place");
      EXPECT_TRUE(x_d.guards_intact());
      EXPECT_TRUE(y_d.guards_intact());
      EXPECT_TRUE(inplace_d.guards_intact());
    }
  }
}

TEST(NnRope, BackwardUndoesForward) {
  FP4MOE_REQUIRE_DEVICE();
  const int64_t T = 257, H = 16, D = 64;
  const RopeConfig cfg{10000.0f, 1000, 0};
  const auto x = test::random_bf16(T * H * D, 42);
  Guarded<bf16> x_d(T * H * D), y_d(T * H * D), back_d(T * H * D);
  x_d.upload(x);
  rope_forward(RopeTensor{x_d.ptr(), H * D, D}, T, H, D, cfg, RopeTensorOut{y_d.ptr(), H * D, D}, nullptr);
  rope_backward(RopeTensor{y_d.ptr(), H * D, D}, T, H, D, cfg, RopeTensorOut{back_d.ptr(), H * D, D}, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  // Two BF16 roundings: each output within two ulps of x plus the rotation error.
  test::expect_close(back_d.download(), x, 2 * test::kBf16Rtol,
                     [&](size_t i) { return 2 * test::kBf16Rtol * std::fabs(value_of(x[i ^ 1])) + 1e-30; },
                     "backward(forward(x))");
}

}  // namespace
}  // namespace fp4moe
