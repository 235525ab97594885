#include "trainer/train/out_file.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <optional>

#include "kernels/common/check.h"
#include "results/h5_read.h"
#include "trainer/train/metrics.h"

namespace fp4moe {

namespace {

// Why the existing file `path` is not the result file of run `run` under `cfg` ("" when it is: continuable).
std::string why_not_this_run(const std::string& path, const std::string& run, const TrainerConfig& cfg) {
  std::optional<H5Reader> file;
  try {
    file.emplace(path);
  } catch (const Error&) {
    return "is not an HDF5 result file";
  }
  const std::string train = "train/" + run, memory = "memory/" + run;
  const std::optional<std::string> hash = file->string_attribute(train, "model_config_hash");
  if (!hash) return fmt::format("holds no run '{}' (no /{} with a model_config_hash)", run, train);
  const std::string ours = fmt::format("{:016x}", model_config_hash(cfg));
  if (*hash != ours)
    return fmt::format("holds run '{}' of another model configuration (model_config_hash {}, this one's {})", run,
                       *hash, ours);
  for (const std::string& d : file->datasets())
    if (!d.starts_with(train + "/") && !d.starts_with(memory + "/"))
      return fmt::format("holds results besides run '{}' (/{})", run, d);
  try {
    TrainMetrics(run, {}, "", EnvInfo{}).load_previous(path, std::numeric_limits<int64_t>::max());
  } catch (const Error&) {
    return fmt::format("holds run '{}' in tables that cannot be read", run);
  }
  return "";
}

// The folder the checkpoints are written to (step_<step>.ckpt) holds nothing else: --out may not be it or lie
// under it. Compared as absolute paths with the links of their existing parts resolved.
void check_out_outside_checkpoint_dir(const std::string& out, const std::string& checkpoint_dir) {
  if (checkpoint_dir.empty()) return;
  namespace fs = std::filesystem;
  std::error_code ec_out, ec_dir;
  const fs::path o = fs::weakly_canonical(fs::absolute(out), ec_out);
  const fs::path d = fs::weakly_canonical(fs::absolute(checkpoint_dir), ec_dir);
  const bool inside = !ec_out && !ec_dir && std::mismatch(d.begin(), d.end(), o.begin(), o.end()).first == d.end();
  FP4MOE_CHECK(!inside,
               "--out '{}' is inside train.checkpoint_dir '{}', where the run writes its checkpoints, expected a path "
               "outside it",
               out, checkpoint_dir);
}

}  // namespace

TrainOutUse check_train_out(const std::string& out, const std::string& run, const TrainerConfig& cfg, bool resuming,
                            bool overwrite, const std::vector<NamedPath>& inputs) {
  check_output_path("--out", out, inputs, OutputFolder::may_be_created);
  check_out_outside_checkpoint_dir(out, cfg.train.checkpoint_dir);
  std::error_code ec;
  if (!std::filesystem::exists(out, ec)) return TrainOutUse::create;
  const std::string why = resuming ? why_not_this_run(out, run, cfg) : "";
  if (resuming && why.empty()) return TrainOutUse::resume;
  if (overwrite) return TrainOutUse::replace;
  FP4MOE_CHECK(resuming,
               "--out '{}' already exists and a fresh run would replace it, expected a new path (pass --overwrite to "
               "replace it, or --resume a checkpoint of the run it holds to continue it)",
               out);
  fail(__FILE__, __LINE__,
       fmt::format("--out '{}' {}, expected a path that does not exist or the result file of the resumed run '{}' "
                   "(pass --overwrite to replace it, or another --out)",
                   out, why, run));
}

}  // namespace fp4moe
