// `fp4moe bench <name> [args...]`: runs the benchmark program bench_<name> from the benchmarks/ folder next to
// the fp4moe binary, passing every remaining argument through (e.g. --h5 PATH, --benchmark_filter=..., and --help,
// which the program answers with its own options). `fp4moe bench --list` lists the programs found there;
// `fp4moe bench --help` says how to run them and lists them too.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

#include "cli/commands.h"

namespace fs = std::filesystem;

namespace fp4moe::cli {

namespace {

struct BenchOptions {
  bool list = false;
  bool help = false;              // -h or --help before the name
  std::string name;               // the benchmark program's name (bench_<name>)
  std::vector<std::string> args;  // the program's own arguments, in the order given
};

fs::path benchmarks_dir() {
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (ec) throw CliError(fmt::format("cannot locate the fp4moe binary (/proc/self/exe: {})", ec.message()));
  return self.parent_path() / "benchmarks";
}

std::vector<std::string> available(const fs::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string f = e.path().filename().string();
    if (f.rfind("bench_", 0) == 0 && e.is_regular_file() && ::access(e.path().c_str(), X_OK) == 0)
      names.push_back(f.substr(6));
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) {
    if (!s.empty()) s += ", ";
    s += x;
  }
  return s.empty() ? "none built" : s;
}

void print_help(const std::string& description, const fs::path& dir, const std::vector<std::string>& names) {
  fmt::print(
      "{}\n\n"
      "usage:\n"
      "  fp4moe bench NAME [ARGS...]  run {}/bench_NAME with ARGS, untouched and in order\n"
      "  fp4moe bench NAME --help     the options of bench_NAME: its own flags, --h5 PATH (the HDF5 result file)\n"
      "                               and Google Benchmark's flags (--benchmark_filter=REGEX ...); no GPU needed\n"
      "  fp4moe bench --list          the program names, one a line\n"
      "  fp4moe bench --help          this help\n\n"
      "programs: {}\n",
      description, dir.string(), joined(names));
}

bool is_help(const std::string& arg) { return arg == "-h" || arg == "--help"; }

int run_bench(const BenchOptions& o, const std::string& description) {
  const fs::path dir = benchmarks_dir();
  const auto names = available(dir);
  if (o.help) {
    print_help(description, dir, names);
    return kExitOk;
  }
  if (o.list) {
    if (names.empty()) fmt::print("no benchmark programs in {} (build them first)\n", dir.string());
    for (const auto& n : names) fmt::print("{}\n", n);
    return kExitOk;
  }
  if (o.name.empty() && !o.args.empty())
    throw CliError(fmt::format("unknown option '{}' before the benchmark's name (its own options follow the name: "
                               "fp4moe bench NAME --help lists them)",
                               o.args.front()));
  if (o.name.empty())
    throw CliError(fmt::format("name a benchmark (available: {}) or pass --list (--help: how to run them)",
                               joined(names)));
  const std::string& name = o.name;
  const fs::path prog = dir / ("bench_" + name);
  if (std::find(names.begin(), names.end(), name) == names.end())
    throw CliError(fmt::format("no benchmark '{}' ({} not found; available: {})", name, prog.string(), joined(names)));
  std::vector<std::string> argv_s = {prog.string()};
  argv_s.insert(argv_s.end(), o.args.begin(), o.args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  ::execv(prog.c_str(), argv.data());  // returns only on failure
  throw std::runtime_error(fmt::format("cannot run {}: {}", prog.string(), std::strerror(errno)));
}

}  // namespace

Command add_bench_command(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  CLI::App* sub = app.add_subcommand("bench", "run a benchmark program: fp4moe bench <name> [its arguments...]");
  // No CLI11 help flag here: after the name, --help belongs to the program (its own options); before it,
  // run_bench prints this command's help.
  sub->set_help_flag();
  sub->add_flag("--list", o->list, "list the benchmark programs");
  sub->add_option("name", o->name, "benchmark name (e.g. quant), followed by the program's own arguments");
  // One positional only: once the name is taken, prefix_command stops parsing at the next argument, so that every
  // argument after the name reaches the program untouched and in order ("--h5 PATH" stays "--h5 PATH"; a
  // positional vector here would collect the words first and pass the options after them).
  sub->prefix_command();
  return {sub, [o, sub] {
            BenchOptions opts = *o;
            opts.args = sub->remaining();
            // Without a name, an argument left over can only be this command's -h/--help (the unknown rest is an
            // error below). A "--" before the name only separates it (after the name CLI11 hands "--" and what
            // follows back to fp4moe's own parser).
            if (opts.name.empty() && !opts.args.empty()) opts.help = is_help(opts.args.front());
            if (!opts.args.empty() && opts.args.front() == "--") opts.args.erase(opts.args.begin());
            return run_bench(opts, sub->get_description());
          }};
}

}  // namespace fp4moe::cli
