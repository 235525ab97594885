// --help of the benchmark programs (run_program in bench_util.cuh answers it before anything else, so it never
// needs a device): what the program measures, its own flags, the --h5 flag every program takes, and Google
// Benchmark's flags (benchmark::PrintDefaultHelp).
#pragma once

#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

namespace fp4moe::bench {

// One flag of a program for its --help: "--all", "the whole grid ...".
struct FlagHelp {
  const char* flag = "";
  const char* text = "";
};

// What a program's --help says besides the flags every program takes.
struct ProgramHelp {
  const char* summary = "";     // what the program measures, against what (one sentence)
  std::vector<FlagHelp> flags;  // its own flags, in the order they are listed
  const char* example = "";     // optional: one example of Google Benchmark's flags ("--benchmark_filter=mla")
};

// True when argv[1..] holds -h or --help.
inline bool asks_for_help(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") return true;
  }
  return false;
}

// `text` broken at spaces into lines of at most `width` characters (a longer word keeps its own line), the lines
// after the first starting with `indent`.
inline std::string wrapped(const std::string& text, size_t width, const std::string& indent) {
  std::string out, line;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find(' ', start);
    if (end == std::string::npos) end = text.size();
    const std::string word = text.substr(start, end - start);
    if (!line.empty() && line.size() + 1 + word.size() > width) {
      out += line + "\n" + indent;
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
    start = end + 1;
  }
  return out + line;
}

// Prints `program`'s help to stdout: summary, usage, its own flags, --h5 PATH, -h/--help, then Google Benchmark's.
inline void print_program_help(const char* program, const ProgramHelp& help) {
  std::vector<FlagHelp> flags = help.flags;
  flags.push_back({"--h5 PATH", "also write the results as a table of the HDF5 file PATH (the path is checked "
                                "before the first case runs)"});
  flags.push_back({"-h, --help", "this help (no GPU needed)"});
  std::string usage = program;
  for (const FlagHelp& f : help.flags) usage += fmt::format(" [{}]", f.flag);
  usage += " [--h5 PATH] [Google Benchmark flags]";
  size_t width = 0;
  for (const FlagHelp& f : flags) width = std::max(width, std::string(f.flag).size());
  constexpr size_t kColumns = 110;
  fmt::print("{}\n\nusage: {}\n\noptions:\n", wrapped(fmt::format("{}: {}", program, help.summary), kColumns, ""),
             usage);
  const std::string indent(width + 4, ' ');
  for (const FlagHelp& f : flags)
    fmt::print("  {:<{}}  {}\n", f.flag, width, wrapped(f.text, kColumns - indent.size(), indent));
  fmt::print("\n{}\n", wrapped(fmt::format("Google Benchmark's flags (--benchmark_list_tests lists the cases, "
                                            "--benchmark_filter=REGEX picks some{}):",
                                            *help.example ? fmt::format(", e.g. {}", help.example) : std::string()),
                                kColumns, ""));
  std::fflush(stdout);
  benchmark::PrintDefaultHelp();
}

}  // namespace fp4moe::bench
