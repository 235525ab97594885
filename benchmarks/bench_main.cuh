// The main() steps every benchmark program shares (header only; each bench_<family>.cu is its own executable):
// taking this project's flags from argv before Google Benchmark parses the rest, registering one benchmark per
// case, the no-GPU refusal, and the exit code after the run. A program's main() keeps what is its
// own: extra flags, a device probe, freeing its workload, the summary and the result table.
//
// A program's main() runs, in order:
//   args = take_program_args(argc, argv);                     // --h5 PATH, --benchmark_list_tests
//   define the cases;
//   if (auto rc = start_benchmarks(...)) return *rc;          // register, parse, list or refuse without a GPU
//   benchmark::RunSpecifiedBenchmarks(); benchmark::Shutdown();
//   summarize and print;
//   rc = exit_code_of(measured);                              // 1 when a case failed
//   with --h5: write_bench_result(...) (bench_util.cuh), rc = 1 when it fails; return rc.
#pragma once

#include <benchmark/benchmark.h>

#include <cstdio>
#include <optional>
#include <string>

#include "benchmarks/bench_util.cuh"
#include "results/env_info.h"
#include "results/run_info.h"

namespace fp4moe::bench {

// What a benchmark program takes from its command line besides Google Benchmark's own flags.
struct ProgramArgs {
  std::string command;   // the whole command line as given (results/run_info.h), for the result file's attributes
  std::string h5_path;   // --h5 PATH; "" when absent
  bool listing = false;  // --benchmark_list_tests: print the case names and exit, no GPU needed
};

// Records the command line, removes --h5 PATH from argv (take_h5_flag: a given PATH is checked at once and an
// unusable one ends the program with exit code 2) and notes --benchmark_list_tests (left in argv for Google
// Benchmark).
inline ProgramArgs take_program_args(int& argc, char** argv) {
  ProgramArgs a;
  a.command = command_line(argc, argv);
  a.h5_path = take_h5_flag(argc, argv);
  a.listing = has_flag(argc, argv, "--benchmark_list_tests");
  return a;
}

// Registers one Google Benchmark per element c of `cases` (a container whose elements stay in place until the run
// ends and have name()), running run_case(state, &c) with manual time, in microseconds, for at least `min_time_s`
// seconds; then hands the rest of argv to Google Benchmark. Returns the exit code when main() must stop now:
// 2 on a flag Google Benchmark does not know (it prints which); 0 after --benchmark_list_tests has printed the case
// names; 1 when there is no usable CUDA device, after "<program>: <why>: <needs>" on stderr (`needs` says what the
// benchmarks need, e.g. "the conversion benchmarks need a Hopper GPU"). std::nullopt: go on and run them.
template <typename Cases, typename RunCase>
std::optional<int> start_benchmarks(const char* program, const char* needs, const ProgramArgs& args, int& argc,
                                    char** argv, const Cases& cases, double min_time_s, RunCase run_case) {
  for (const auto& c : cases)
    benchmark::RegisterBenchmark(c.name().c_str(), [&c, run_case](benchmark::State& st) { run_case(st, &c); })
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond)
        ->MinTime(min_time_s);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  if (args.listing) {
    benchmark::RunSpecifiedBenchmarks();
    return 0;
  }
  const std::string why = why_no_cuda_device();
  if (!why.empty()) {
    std::fprintf(stderr, "%s: %s: %s\n", program, why.c_str(), needs);
    return 1;
  }
  return std::nullopt;
}

// The exit code of a finished run before its result file is written: 1 when any case of `measured` (a map from
// case name to a record with `bool ok`) failed, else 0.
template <typename Measured>
int exit_code_of(const Measured& measured) {
  int rc = 0;
  for (const auto& [name, m] : measured)
    if (!m.ok) rc = 1;
  return rc;
}

}  // namespace fp4moe::bench
