// `fp4moe repro <scenario>... [--scale smoke|default|full] [--out DIR] [--data DIR] [--parallel N] [--seeds S1,S2]
// [--steps N] [--configs NAME...] [--list]`: runs reproduction
// scenarios (repro/scenarios/<scenario>.toml) through the suite's runner, repro/run.py, with the build folder of this
// binary: one run file <out>/<date>-<gpu>.h5 and its report, as `make repro-table` writes for the whole suite.
// The runner is Python: the interpreter is the one CMake was configured with (FP4MOE_PYTHON, the Makefile's first
// python3 that imports pandas, matplotlib, h5py and numpy), or $FP4MOE_PYTHON. Without a GPU the runner says so and
// exits non-zero. `--list` prints the scenario names.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

#include "cli/commands.h"

namespace fs = std::filesystem;

namespace fp4moe::cli {

namespace {

struct ReproOptions {
  bool list = false;
  std::vector<std::string> scenarios;
  std::string scale = "default";
  std::string out = "runs";
  std::string data;
  int parallel = 1;   // training cells at a time
  std::string seeds;  // "" : the scenarios' own; checked by the runner
  int steps = 0;      // 0: the scenarios' own
  std::vector<std::string> configs;  // empty: every configuration's cells; checked by the runner
};

fs::path source_dir() { return fs::path(FP4MOE_SOURCE_DIR); }

std::vector<std::string> scenario_names() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(source_dir() / "repro" / "scenarios", ec))
    if (e.path().extension() == ".toml") names.push_back(e.path().stem().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::string python() {
  if (const char* env = std::getenv("FP4MOE_PYTHON"); env != nullptr && *env != '\0') return env;
  return FP4MOE_PYTHON;
}

int run_repro(const ReproOptions& o) {
  const auto names = scenario_names();
  if (o.list) {
    for (const auto& n : names) fmt::print("{}\n", n);
    return kExitOk;
  }
  std::string available;
  for (const auto& n : names) available += (available.empty() ? "" : ", ") + n;
  if (o.scenarios.empty()) throw CliError(fmt::format("name a scenario (available: {}) or pass --list", available));
  for (const auto& s : o.scenarios)
    if (std::find(names.begin(), names.end(), s) == names.end())
      throw CliError(fmt::format("no scenario '{}' in {} (available: {})", s,
                                 (source_dir() / "repro" / "scenarios").string(), available));
  const std::string py = python();
  if (py.empty())
    throw CliError("no Python for the runner: configure with the Makefile (it finds one importing pandas, "
                   "matplotlib, h5py and numpy) or set FP4MOE_PYTHON");
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (ec) throw CliError(fmt::format("cannot locate the fp4moe binary (/proc/self/exe: {})", ec.message()));
  std::vector<std::string> argv_s = {py, (source_dir() / "repro" / "run.py").string(), "--build",
                                     self.parent_path().string(), "--scale", o.scale, "--out", o.out};
  if (!o.data.empty()) argv_s.insert(argv_s.end(), {"--data", o.data});
  if (o.parallel != 1) argv_s.insert(argv_s.end(), {"--parallel", std::to_string(o.parallel)});
  if (!o.seeds.empty()) argv_s.insert(argv_s.end(), {"--seeds", o.seeds});
  if (o.steps != 0) argv_s.insert(argv_s.end(), {"--steps", std::to_string(o.steps)});
  if (!o.configs.empty()) {
    argv_s.push_back("--configs");
    argv_s.insert(argv_s.end(), o.configs.begin(), o.configs.end());
  }
  argv_s.push_back("--only");
  argv_s.insert(argv_s.end(), o.scenarios.begin(), o.scenarios.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  ::execvp(argv[0], argv.data());  // returns only on failure
  throw CliError(fmt::format("cannot run the runner with '{}': {}", py, std::strerror(errno)));
}

}  // namespace

Command add_repro_command(CLI::App& app) {
  auto o = std::make_shared<ReproOptions>();
  CLI::App* sub = app.add_subcommand("repro", "run reproduction scenarios: fp4moe repro <scenario>... (--list)");
  sub->add_flag("--list", o->list, "list the scenarios (repro/scenarios/*.toml)");
  sub->add_option("scenarios", o->scenarios, "scenario names (file stems of repro/scenarios/*.toml)");
  sub->add_option("--scale", o->scale, "smoke (minutes), default or full")
      ->check(CLI::IsMember({"smoke", "default", "full"}))
      ->capture_default_str();
  sub->add_option("--out", o->out, "folder of run files")->capture_default_str();
  sub->add_option("--data", o->data, "token shards for the training cells that read the corpus");
  sub->add_option("--parallel", o->parallel, "training cells run N at a time on the GPU, each its own process")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  sub->add_option("--seeds", o->seeds, "training scenarios: these seeds (comma-separated) instead of their own");
  sub->add_option("--steps", o->steps, "training scenarios: N steps per run instead of their own")
      ->check(CLI::Range(1, 1 << 20));
  sub->add_option("--configs", o->configs,
                  "training scenarios: only the cells of these configurations (e.g. small), the others left out");
  return {sub, [o] { return run_repro(*o); }};
}

}  // namespace fp4moe::cli
