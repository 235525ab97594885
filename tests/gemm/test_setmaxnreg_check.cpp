// The arithmetic of the launch-time setmaxnreg check (kernels/gemm/setmaxnreg_check.h): the pool of a block,
// numRegs x threads, must hold 128 x the sum of the warpgroups' counts; the message names the kernel, numRegs,
// threads and the counts. The counts of the five warp-specialised kernels fit at the 168 registers ptxas gives a
// 384-thread block at one block per SM, and fail one allocation step (8 registers) below.
#include <gtest/gtest.h>

#include <string>

#include "kernels/gemm/setmaxnreg_check.h"

namespace fp4moe {
namespace {

void expect_refused(const std::string& msg, std::initializer_list<std::string> parts) {
  EXPECT_FALSE(msg.empty());
  for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
}

TEST(SetmaxnregCheck, ThePoolHoldsTheKernelsCountsAt168Registers) {
  // Attention (forward, dQ, dK/dV): consumers 240, producer 24; grouped GEMM: FP8 232/40, MXFP4 224/56.
  for (auto [consumer, producer] : {std::pair{240u, 24u}, {232u, 40u}, {224u, 56u}}) {
    SCOPED_TRACE(consumer);
    EXPECT_EQ(setmaxnreg_pool_shortfall("k", 168, 384, {consumer, consumer, producer}), "");
    EXPECT_EQ(setmaxnreg_pool_shortfall("k", 255, 384, {consumer, consumer, producer}), "");
    expect_refused(setmaxnreg_pool_shortfall("k", 160, 384, {consumer, consumer, producer}),
                   {"k: compiled to 160 registers per thread", "384 threads holds 61440", "wait forever"});
  }
}

TEST(SetmaxnregCheck, TheBoundIsExactAndTheMessageNamesEverything) {
  // 128 x (240 + 240 + 24) = 64512 = 168 x 384: equal is enough; one register less per thread is not.
  EXPECT_EQ(setmaxnreg_pool_shortfall("attn", 168, 384, {240, 240, 24}), "");
  expect_refused(setmaxnreg_pool_shortfall("flash_attention_forward_sm90_kernel", 167, 384, {240, 240, 24}),
                 {"flash_attention_forward_sm90_kernel", "167 registers per thread", "384 threads holds 64128",
                  "[240, 240, 24]", "128 x (240 + 240 + 24) = 64512", "168 registers per thread or more"});
  // 48 + 232 + 232 asks for 65536 of 64512 (the case sm90_ptx.cuh's notes warn about).
  expect_refused(setmaxnreg_pool_shortfall("gemm", 168, 384, {232, 232, 48}), {"= 65536", "holds 64512"});
  // Any number of warpgroups, counts in any order.
  EXPECT_EQ(setmaxnreg_pool_shortfall("two", 128, 256, {24, 232}), "");
  expect_refused(setmaxnreg_pool_shortfall("two", 127, 256, {24, 232}), {"two", "127"});
}

TEST(SetmaxnregCheck, RejectsCountsThatDoNotMatchTheWarpgroups) {
  expect_refused(setmaxnreg_pool_shortfall("k", 168, 384, {240, 24}), {"k", "[240, 24]", "384 threads"});
  expect_refused(setmaxnreg_pool_shortfall("k", 168, 300, {240, 240, 24}), {"300 threads"});
  expect_refused(setmaxnreg_pool_shortfall("k", 168, 0, {}), {"0 threads"});
  expect_refused(setmaxnreg_pool_shortfall("k", 0, 384, {240, 240, 24}), {"0 registers"});
}

}  // namespace
}  // namespace fp4moe
