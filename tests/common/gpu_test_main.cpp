// main() of the GPU test programs (tests/CMakeLists.txt builds one per kernel family, each run by ctest as one
// test): GoogleTest's main, plus one line when no CUDA device is usable. The tests that need the device skip then,
// with the reason (FP4MOE_REQUIRE_DEVICE; they fail instead under FP4MOE_REQUIRE_GPU=1), and when no test failed
// the output ends with "<program>: S of N tests skipped: <why>" (exit code 0), on which ctest reports the program
// as skipped (SKIP_REGULAR_EXPRESSION in tests/CMakeLists.txt). A program with a failed test prints no such line
// and fails, whatever else skipped or passed. Listing the tests (--gtest_list_tests) never looks for a device.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "tests/common/gpu_test_util.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (GTEST_FLAG_GET(list_tests)) return RUN_ALL_TESTS();
  const int rc = RUN_ALL_TESTS();
  const std::string why = ::fp4moe::test::why_no_gpu();
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  if (rc == 0 && !why.empty() && unit.skipped_test_count() > 0)
    std::printf("%s: %d of %d tests skipped: %s\n", std::filesystem::path(argv[0]).filename().c_str(),
                unit.skipped_test_count(), unit.test_to_run_count(), why.c_str());
  return rc;
}
