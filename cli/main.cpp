// fp4moe: one binary for the project's tasks (DESIGN.md "Layout"): env, quantize, bench, train, parity, repro, plan,
// launch.
// Exit codes: 0 success, 1 unexpected failure, 2 bad arguments or inputs (one line on stderr, no trace).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>
#include <vector>

#include "cli/commands.h"
#include "kernels/common/check.h"
#include "results/run_info.h"

namespace fp4moe::cli {

static std::string g_invocation;
const std::string& invocation() { return g_invocation; }

std::string user_message(const std::string& msg) {
  const size_t open = msg.rfind(" (");
  if (open == std::string::npos || msg.empty() || msg.back() != ')') return msg;
  const std::string where = msg.substr(open + 2, msg.size() - open - 3);
  const size_t colon = where.rfind(':');
  const bool file_line = colon != std::string::npos && colon + 1 < where.size() &&
                         where.find_first_not_of("0123456789", colon + 1) == std::string::npos;
  return file_line ? msg.substr(0, open) : msg;
}

// A CLI11 parse error as one line of text: its message with any line breaks joined by "; ", and, for arguments
// that were not expected, those arguments in the order given (CLI11 lists them in reverse).
static std::string parse_error_message(const CLI::ParseError& e, const CLI::App& app) {
  std::string msg;
  if (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr) {
    std::vector<std::string> extras = app.remaining(true);
    msg = fmt::format("unexpected argument{} '{}' (see --help for the options)", extras.size() == 1 ? "" : "s",
                      fmt::join(extras, " "));
  } else {
    msg = e.what();
  }
  for (size_t nl; (nl = msg.find('\n')) != std::string::npos;) msg.replace(nl, 1, "; ");
  return msg;
}

}  // namespace fp4moe::cli

int main(int argc, char** argv) {
  using namespace fp4moe::cli;
  g_invocation = fp4moe::command_line(argc, argv);

  CLI::App app{"fp4moe: FP4 storage and communication with FP8 compute for MoE training on Hopper"};
  app.require_subcommand(1);
  std::vector<Command> commands = {add_env_command(app), add_quantize_command(app), add_bench_command(app),
                                   add_train_command(app), add_parity_command(app),
                                   add_repro_command(app), add_plan_command(app),
                                   add_launch_command(app)};

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);  // --help
    const std::vector<CLI::App*> subs = app.get_subcommands();
    const std::string who = subs.empty() ? "fp4moe" : "fp4moe " + subs.front()->get_name();
    std::fprintf(stderr, "%s: error: %s\n", who.c_str(), parse_error_message(e, app).c_str());
    return kExitUsage;
  }

  for (const auto& c : commands) {
    if (!c.app->parsed()) continue;
    const std::string name = c.app->get_name();
    try {
      return c.run();
    } catch (const CliError& e) {
      std::fprintf(stderr, "fp4moe %s: error: %s\n", name.c_str(), e.what());
      return kExitUsage;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "fp4moe %s: failed: %s\n", name.c_str(), e.what());
      return kExitFailure;
    }
  }
  return kExitUsage;  // unreachable: require_subcommand(1)
}
