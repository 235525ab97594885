// Shared by the benchmark programs (header only: each bench_<family>.cu is its own executable):
// device buffers, seeded random inputs with a realistic spread, the number of rotated input copies needed to
// defeat the L2, CUDA-event timing of a batch of launches, the command-line flags every program takes besides
// Google Benchmark's own (--h5 PATH), the /bench/<family> table of the HDF5 result file, and the main() they all
// share (run_program).
#pragma once

#include <benchmark/benchmark.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "benchmarks/bench_help.h"
#include "kernels/common/check.h"
#include "kernels/formats/formats.h"
#include "results/env_info.h"
#include "results/h5_file.h"
#include "results/output_path.h"
#include "results/run_info.h"
#include "results/table.h"

namespace fp4moe::bench {

// Device allocations of one benchmark case, freed together.
class DevicePool {
 public:
  DevicePool() = default;
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;
  ~DevicePool() {
    for (void* p : ptrs_) cudaFree(p);
  }
  template <typename T>
  T* alloc(int64_t count) {
    void* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(T)));
    ptrs_.push_back(p);
    return static_cast<T*>(p);
  }

 private:
  std::vector<void*> ptrs_;
};

// The spread of generated values: a standard normal times a per-row power of two drawn uniformly from
// 2^[row_log2_lo, row_log2_hi] (tokens of very different magnitude), times `outlier_gain` on one column in
// `outlier_every` (the outlier channels of LLM activations; 0 disables them).
struct Spread {
  float std = 1.0f;
  int row_log2_lo = -4, row_log2_hi = 4;
  int outlier_every = 64;
  float outlier_gain = 32.0f;
};
inline Spread activation_spread() { return Spread{}; }
inline Spread weight_spread() { return Spread{0.02f, -1, 1, 0, 1.0f}; }

__global__ void fill_bf16_random_kernel(__nv_bfloat16* x, int64_t M, int64_t K, uint64_t seed, Spread s) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < M * K; i += int64_t{gridDim.x} * blockDim.x) {
    int64_t m = i / K, k = i % K;
    // Box-Muller on two counter-based uniforms: the values depend on (seed, index) only.
    float u1 = uniform_from_counter(seed, 2 * static_cast<uint64_t>(i)) + 0x1p-25f;
    float u2 = uniform_from_counter(seed, 2 * static_cast<uint64_t>(i) + 1);
    float z = sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
    float ur = uniform_from_counter(seed ^ 0x5EEDull, static_cast<uint64_t>(m));
    int span = s.row_log2_hi - s.row_log2_lo;
    int e = s.row_log2_lo + min(static_cast<int>(ur * static_cast<float>(span + 1)), span);
    float v = z * s.std * exp2_exact(e);
    if (s.outlier_every > 0 && (mix64(static_cast<uint64_t>(k) ^ seed) % s.outlier_every) == 0) v *= s.outlier_gain;
    x[i] = __float2bfloat16_rn(v);
  }
}

// x [M, K] BF16 on the device <- seeded random values with spread `s` (never all zeros).
inline void fill_bf16_random(__nv_bfloat16* x, int64_t M, int64_t K, uint64_t seed, const Spread& s,
                             cudaStream_t stream = nullptr) {
  if (M * K == 0) return;
  int64_t blocks = std::min<int64_t>((M * K + 255) / 256, 65536);
  fill_bf16_random_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(x, M, K, seed, s);
  CUDA_CHECK_LAUNCH();
}

// Number of input copies to rotate through so that their combined working set exceeds twice the L2 (each launch
// then reads from HBM, not from what the previous launch left in the cache): at least 2. working_set_bytes: the
// bytes one launch touches. Capped so that all copies fit in `budget_bytes`.
inline int rotation_copies(int64_t working_set_bytes, int64_t l2_bytes, int64_t budget_bytes) {
  int64_t ws = std::max<int64_t>(working_set_bytes, 1);
  int64_t n = std::max<int64_t>(2, 2 * l2_bytes / ws + 1);
  n = std::min<int64_t>(n, std::max<int64_t>(1, budget_bytes / ws));
  return static_cast<int>(n);
}

// Times `launches` back-to-back launches with CUDA events on `stream`; returns the elapsed seconds.
class EventTimer {
 public:
  EventTimer() {
    CUDA_CHECK(cudaEventCreate(&start_));
    CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~EventTimer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  template <typename Launch>
  double time(int launches, cudaStream_t stream, Launch&& launch) {
    CUDA_CHECK(cudaEventRecord(start_, stream));
    for (int i = 0; i < launches; ++i) launch(i);
    CUDA_CHECK(cudaEventRecord(stop_, stream));
    CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return ms * 1e-3;
  }

 private:
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

// ---- summaries ------------------------------------------------------------------------------------------------

// Geometric mean of positive ratios; NaN for an empty list.
inline double geomean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += std::log(x);
  return v.empty() ? NAN : std::exp(s / static_cast<double>(v.size()));
}

// ---- command line ---------------------------------------------------------------------------------------------

// True when argv holds `flag` alone or as `flag=VALUE` with VALUE other than "false" and "0".
inline bool has_flag(int argc, char** argv, const char* flag) {
  const size_t n = std::strlen(flag);
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.compare(0, n, flag) != 0) continue;
    if (a.size() == n) return true;
    if (a[n] == '=' && a.substr(n + 1) != "false" && a.substr(n + 1) != "0") return true;
  }
  return false;
}

// The value of Google Benchmark's --benchmark_out=PATH in argv ("" when absent): another output of the program.
inline std::string benchmark_out_flag(int argc, char** argv) {
  constexpr const char* prefix = "--benchmark_out=";
  std::string path;
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], prefix, std::strlen(prefix)) == 0) path = argv[i] + std::strlen(prefix);
  return path;
}

// Makes sure the result file `path` can be written before any benchmark runs (the write comes only after all of
// them): check_output_path (results/output_path.h: a new path or a regular file, not a directory, device, FIFO or
// socket, not the --benchmark_out file `benchmark_out`), then creates its folder when missing. Ends the program
// (exit code 2, one line "<program>: <reason>" on stderr) when the path is refused or the folder cannot be created.
inline void prepare_h5_output(const char* program, const std::string& path, const std::string& benchmark_out) {
  namespace fs = std::filesystem;
  try {
    check_output_path("--h5", path, {{"--benchmark_out", benchmark_out}}, OutputFolder::may_be_created);
  } catch (const Error& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    std::exit(2);
  }
  const fs::path dir = fs::path(output_file_target(path)).parent_path();
  std::error_code ec;
  if (!dir.empty() && !fs::is_directory(dir, ec)) {
    fs::create_directories(dir, ec);
    if (ec) {
      std::fprintf(stderr, "%s: --h5 '%s': cannot create the folder '%s': %s\n", program, path.c_str(),
                   dir.string().c_str(), ec.message().c_str());
      std::exit(2);
    }
  }
}

// Removes "--h5 PATH" / "--h5=PATH" from argv (Google Benchmark rejects flags it does not know) and returns PATH
// ("" when absent); a given PATH is checked at once with prepare_h5_output (argv[0] names the program).
inline std::string take_h5_flag(int& argc, char** argv) {
  std::string path;
  bool given = false;
  int out = 1;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--h5" && i + 1 < argc) path = argv[++i], given = true;
    else if (a.rfind("--h5=", 0) == 0) path = a.substr(5), given = true;
    else argv[out++] = argv[i];
  }
  argc = out;
  if (given) prepare_h5_output(argv[0], path, benchmark_out_flag(argc, argv));
  return path;
}

// ---- result file ----------------------------------------------------------------------------------------------

// An empty /bench/<family> table with the columns every family has (DESIGN.md "Results"), in this order:
// case, shape, recipe (strings); time_us (microseconds per launch or call), tflops (TFLOP/s), gbps (GB/s of
// minimal traffic), fraction_of_copy_bw, speedup (float64; NaN where a column does not apply to a row).
// A family may add its own columns after these (add_column before the first row).
inline Table bench_table() {
  Table t;
  t.add_column("case", ColumnType::str)
      .add_column("shape", ColumnType::str)
      .add_column("recipe", ColumnType::str)
      .add_column("time_us", ColumnType::f64)
      .add_column("tflops", ColumnType::f64)
      .add_column("gbps", ColumnType::f64)
      .add_column("fraction_of_copy_bw", ColumnType::f64)
      .add_column("speedup", ColumnType::f64);
  return t;
}

// Writes `table` as /bench/<family> of a new result file at `path` (atomically; root attributes from this
// machine's environment and `command`, results/run_info.h) and prints "wrote PATH (...)"; on failure prints
// "<program>: <reason>" to stderr. Returns 0 when written, 1 otherwise.
inline int write_bench_result(const char* program, const std::string& path, const std::string& family, Table table,
                              const std::string& command) {
  try {
    const int64_t rows = table.rows();
    ResultFile f;
    fill_root_attributes(f, command);
    f.add_table("/bench/" + family, std::move(table));
    f.write(path);
    fmt::print("wrote {} (/bench/{}, {} rows)\n", path, family, rows);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    return 1;
  }
}

// ---- program --------------------------------------------------------------------------------------------------

// The names of `cases` (any container of objects with a name() method), in order: Program::cases' usual answer.
template <typename Cases>
std::vector<std::string> case_names(const Cases& cases) {
  std::vector<std::string> names;
  for (const auto& c : cases) names.push_back(c.name());
  return names;
}

// One benchmark program, as run_program runs it. The fields without "optional" must be set.
struct Program {
  const char* name = "";     // "bench_attention": the first word of its error lines
  const char* needs = "";    // "the attention benchmarks": "<name>: <why>: <needs> need a Hopper GPU" without device
  ProgramHelp help;          // what -h/--help prints besides the common flags (bench_help.h)
  double min_time_s = 0.05;  // Google Benchmark's MinTime of every case, seconds
  // Optional: takes the program's own flags out of argv (after --h5, before Google Benchmark sees the rest);
  // returns an exit code to end the program with at once, or -1 to go on.
  std::function<int(int& argc, char** argv)> take_flags;
  // Defines the cases; returns their names, in the order of registration (Google Benchmark lists and runs them in
  // that order, filtered by --benchmark_filter).
  std::function<std::vector<std::string>()> cases;
  // Measures case i (its index in cases()' answer) into `state`: manual time (SetIterationTime), SkipWithError on
  // failure.
  std::function<void(benchmark::State& state, size_t i)> run_case;
  // Optional: called once before the first case with the current device and its properties, after run_program has
  // checked that the device is sm_90 (Hopper); prints the program's banner and sets up what the cases need. May
  // throw (the program then ends with exit code 1). When absent, neither the check nor the call happens.
  std::function<void(int device, const cudaDeviceProp& prop)> on_device;
  // Optional: called right after the last case, before benchmark::Shutdown (frees what the last case kept).
  std::function<void()> after_cases;
  // Called last, after benchmark::Shutdown: summarizes what the cases measured, prints the tables and, when h5_path
  // is not empty (the --h5 PATH; "" without --h5), writes the /bench/<family> table with write_bench_result
  // (`command`: the whole command line, for the file's root attributes). Returns the program's exit code: 0 when
  // every case ran and the file (if asked for) was written, 1 otherwise.
  std::function<int(const std::string& h5_path, const std::string& command)> report;
};

// The main() of every benchmark program, in this order:
//  0. with -h or --help: prints the program's help (print_program_help) and returns 0;
//  1. command_line of the whole argv (for the result file), take_h5_flag (exit code 2 when the --h5 path cannot be
//     written), program.take_flags (ends here with its exit code when it returns one >= 0);
//  2. program.cases, each registered with manual time, microseconds and MinTime(min_time_s);
//     benchmark::Initialize; exit code 2 on a flag that Google Benchmark does not know either;
//  3. with --benchmark_list_tests: lists the cases (no device needed) and returns 0;
//  4. without a usable CUDA device: one line "<name>: <why>: <needs> need a Hopper GPU" on stderr, returns 1;
//  5. with program.on_device: refuses a device other than sm_90 and calls on_device; an exception from either is
//     printed as "<name>: <what>" on stderr and returns 1;
//  6. runs the cases (benchmark::RunSpecifiedBenchmarks), program.after_cases, benchmark::Shutdown;
//  7. returns program.report(h5_path, command).
inline int run_program(int argc, char** argv, const Program& program) {
  if (asks_for_help(argc, argv)) {
    print_program_help(program.name, program.help);
    return 0;
  }
  const std::string command = command_line(argc, argv);
  const std::string h5_path = take_h5_flag(argc, argv);
  if (program.take_flags) {
    const int rc = program.take_flags(argc, argv);
    if (rc >= 0) return rc;
  }
  const bool listing = has_flag(argc, argv, "--benchmark_list_tests");
  const std::vector<std::string> names = program.cases();
  for (size_t i = 0; i < names.size(); ++i)
    benchmark::RegisterBenchmark(names[i].c_str(), [run = program.run_case, i](benchmark::State& st) { run(st, i); })
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond)
        ->MinTime(program.min_time_s);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  if (listing) {
    benchmark::RunSpecifiedBenchmarks();
    return 0;
  }
  const std::string why = why_no_cuda_device();
  if (!why.empty()) {
    std::fprintf(stderr, "%s: %s: %s need a Hopper GPU\n", program.name, why.c_str(), program.needs);
    return 1;
  }
  if (program.on_device) {
    try {
      int dev = 0;
      CUDA_CHECK(cudaGetDevice(&dev));
      cudaDeviceProp p{};
      CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
      FP4MOE_CHECK(p.major == 9, "the kernels are built for sm_90a (Hopper); device {} is {} (sm_{}{})", dev, p.name,
                   p.major, p.minor);
      program.on_device(dev, p);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: %s\n", program.name, e.what());
      return 1;
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  if (program.after_cases) program.after_cases();
  benchmark::Shutdown();
  return program.report(h5_path, command);
}

}  // namespace fp4moe::bench
