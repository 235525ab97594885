// Shared by the CPU tests (configuration, FLOPs, checkpoints, buffer plans, output paths): a temporary folder per test
// (tests/common/temp_dir.h), the repository root (for configs/), and the message of an expected fp4moe::Error.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <random>
#include <string>

#include "kernels/common/check.h"
#include "tests/common/temp_dir.h"

namespace fp4moe::test {


// The repository root (FP4MOE_SOURCE_DIR, set by tests/CMakeLists.txt).
inline std::string repo_root() {
  return std::filesystem::path(FP4MOE_SOURCE_DIR).string();
}
inline std::string preset(const std::string& name) { return repo_root() + "/configs/" + name + ".toml"; }

// The message of the fp4moe::Error thrown by f, or "" when nothing is thrown.
template <typename F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// f must throw fp4moe::Error whose message holds every one of `parts`.
template <typename F>
void expect_error_with(F&& f, std::initializer_list<std::string> parts) {
  const std::string msg = error_message(f);
  EXPECT_FALSE(msg.empty()) << "no fp4moe::Error thrown; expected one mentioning " << *parts.begin();
  for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
}

}  // namespace fp4moe::test
