#include "trainer/train/resume.h"

#include <filesystem>
#include <string_view>

#include "kernels/common/check.h"

namespace fp4moe {

namespace fs = std::filesystem;

namespace {

// The step of "step_<digits>.ckpt", or -1 for any other name.
int64_t checkpoint_step(std::string_view name) {
  constexpr std::string_view prefix = "step_", suffix = ".ckpt";
  if (name.size() <= prefix.size() + suffix.size() || !name.starts_with(prefix) || !name.ends_with(suffix)) return -1;
  const std::string_view digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  if (digits.size() > 18) return -1;
  int64_t step = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return -1;
    step = step * 10 + (c - '0');
  }
  return step;
}

}  // namespace

std::string latest_checkpoint(const std::string& dir) {
  std::error_code ec;
  FP4MOE_CHECK(fs::is_directory(dir, ec), "checkpoint folder '{}' does not exist or is not a folder", dir);
  fs::directory_iterator it(dir, ec), end;
  FP4MOE_CHECK(!ec, "cannot list checkpoint folder '{}': {}", dir, ec.message());
  std::string best;
  int64_t best_step = -1;
  for (; it != end; it.increment(ec)) {
    FP4MOE_CHECK(!ec, "cannot list checkpoint folder '{}': {}", dir, ec.message());
    const int64_t step = checkpoint_step(it->path().filename().string());
    std::error_code ec2;
    if (step > best_step && it->is_regular_file(ec2)) {
      best_step = step;
      best = it->path().string();
    }
  }
  return best;
}

std::string resolve_resume_path(const std::string& arg, const std::string& checkpoint_dir) {
  FP4MOE_CHECK(!arg.empty(), "--resume: expected a checkpoint file or 'latest'");
  if (arg == "latest") {
    FP4MOE_CHECK(!checkpoint_dir.empty(), "--resume latest needs train.checkpoint_dir (the folder to search)");
    const std::string path = latest_checkpoint(checkpoint_dir);
    FP4MOE_CHECK(!path.empty(), "--resume latest: no checkpoint (step_<step>.ckpt) in '{}'", checkpoint_dir);
    return path;
  }
  std::error_code ec;
  FP4MOE_CHECK(fs::is_regular_file(arg, ec), "--resume: checkpoint '{}' does not exist or is not a file", arg);
  return arg;
}

}  // namespace fp4moe
