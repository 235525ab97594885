// Shared by the trainer foundation tests (configuration, FLOPs, checkpoints): a temporary folder per test, the
// repository root (for configs/), and the message of an expected fp4moe::Error.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <random>
#include <string>

#include "kernels/common/check.h"

namespace fp4moe::test {

// A fresh folder per test under the system temporary folder, removed afterwards.
class TrainerTempDir {
 public:
  TrainerTempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() /
            (std::string("fp4moe_trainer_") + info->test_suite_name() + "_" + info->name() + "_" +
             std::to_string(std::random_device{}()));
    std::filesystem::create_directories(path_);
  }
  ~TrainerTempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(file(name), std::ios::binary | std::ios::trunc) << text;
    return file(name);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

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
