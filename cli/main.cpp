// fp4moe: one binary for the project's tasks (DESIGN.md "Layout"): env, quantize, bench, train, parity, repro.
// Exit codes: 0 success, 1 unexpected failure, 2 bad arguments or inputs (one line on stderr, no trace).
#include <fmt/format.h>

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

}  // namespace fp4moe::cli

int main(int argc, char** argv) {
  using namespace fp4moe::cli;
  g_invocation = fp4moe::command_line(argc, argv);

  CLI::App app{"fp4moe: FP4 storage and communication with FP8 compute for MoE training on Hopper"};
  app.require_subcommand(1);
  std::vector<Command> commands = {add_env_command(app), add_quantize_command(app), add_bench_command(app),
                                   add_train_command(app), add_parity_command(app),
                                   add_repro_command(app)};

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);  // prints help (rc 0) or the parse error
    return rc == 0 ? kExitOk : kExitUsage;
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
