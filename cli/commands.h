// The subcommands of the fp4moe command line, one file each (cmd_<name>.cpp), registered by cli/main.cpp.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <stdexcept>
#include <string>

namespace fp4moe::cli {

// A problem with the user's input or request (missing file, wrong shape, no GPU for --device cuda ...):
// main prints "fp4moe <command>: error: <message>" on one line and exits with kExitUsage.
struct CliError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;  // an unexpected failure while running (CUDA, I/O)
constexpr int kExitUsage = 2;    // bad arguments or inputs

// A registered subcommand: its CLI11 node and what runs once the command line parsed (returns the exit code).
struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

Command add_env_command(CLI::App& app);       // cmd_env.cpp
Command add_quantize_command(CLI::App& app);  // cmd_quantize.cpp
Command add_bench_command(CLI::App& app);     // cmd_bench.cpp
Command add_train_command(CLI::App& app);     // cmd_train.cpp
Command add_parity_command(CLI::App& app);    // cmd_parity.cpp
Command add_repro_command(CLI::App& app);     // cmd_repro.cpp
Command add_plan_command(CLI::App& app);      // cmd_plan.cpp
Command add_launch_command(CLI::App& app);    // cmd_launch.cpp

// The full command line as given, for the `command` attribute of result files (set by main).
const std::string& invocation();

// An fp4moe::Error message (kernels/common/check.h) without its " (file.cpp:123)" suffix: the user is told what
// was wrong, not where in the sources it was noticed. Any other text is returned unchanged.
std::string user_message(const std::string& msg);

}  // namespace fp4moe::cli
