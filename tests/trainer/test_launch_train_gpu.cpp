// `fp4moe launch --gpus 1 -- train`: one rank over a real NCCL communicator of world size 1 (NcclTransport from the
// rank environment the launcher sets), three steps of configs/tiny.toml on synthetic tokens, through the CLI binary
// this build made (FP4MOE_CLI, tests/CMakeLists.txt). Checks the exit code, the run's closing line and its result file
// (its all-to-all columns: every byte to the rank itself).
// Run: fp4moe_tests_gpu_trainer --gtest_filter='LaunchTrainGpu*'
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "results/h5_read.h"
#include "tests/common/gpu_test_util.h"
#include "tests/common/temp_dir.h"
#include "tests/common/trainer_test_util.h"

namespace fp4moe {
namespace {

// The shell's word for s (single-quoted).
std::string quoted(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

#ifdef FP4MOE_CLI  // the CLI is built with the trainer (tests/CMakeLists.txt)
TEST(LaunchTrainGpu, OneRankTrainsOverNccl) {
  FP4MOE_REQUIRE_DEVICE();
  test::TempDir dir;
  const std::string out = dir.file("launch.h5");
  const std::string cmd = quoted(FP4MOE_CLI) + " launch --gpus 1 -- train --config " + quoted(test::preset("tiny")) +
                          " --synthetic-data --train.steps 3 --train.warmup_steps 1 --train.eval_interval 2"
                          " --log-interval 1 --out " + quoted(out) + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr) << cmd;
  std::string text;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;) text.append(buf, n);
  const int status = pclose(pipe);
  ASSERT_TRUE(WIFEXITED(status)) << text;
  EXPECT_EQ(WEXITSTATUS(status), 0) << text;
  EXPECT_TRUE(std::regex_search(text, std::regex("done at step 3/3 after [^\\n]*: loss [0-9.]+, val_loss [0-9.]+")))
      << text;
  ASSERT_TRUE(std::filesystem::exists(out)) << text;
  // World size 1: every all-to-all byte is a copy to the rank itself, timed (metrics.h StepRecord).
  const H5Reader h5(out);
  EXPECT_EQ(h5.read_f64("train/tiny/steps/all_to_all_sent_bytes"), std::vector<double>(3, 0.0));
  EXPECT_EQ(h5.read_f64("train/tiny/steps/all_to_all_received_bytes"), std::vector<double>(3, 0.0));
  for (double b : h5.read_f64("train/tiny/steps/all_to_all_to_self_bytes")) EXPECT_GT(b, 0);
  for (double ms : h5.read_f64("train/tiny/steps/all_to_all_ms")) EXPECT_GT(ms, 0);
}
#endif

}  // namespace
}  // namespace fp4moe
