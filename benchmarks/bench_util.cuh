// Shared by the benchmark programs (header only: each bench_<family>.cu is its own executable):
// device buffers, seeded random inputs with a realistic spread, the number of rotated input copies needed to
// defeat the L2, CUDA-event timing of a batch of launches, the command-line flags every program takes besides
// Google Benchmark's own (--h5 PATH), and the /bench/<family> table of the HDF5 result file.
#pragma once

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
#include <string>
#include <vector>

#include "kernels/common/check.h"
#include "kernels/formats/formats.h"
#include "results/h5_file.h"
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

// Makes sure the result file `path` can be written before any benchmark runs (the write comes only after all of
// them): creates its folder when missing, and ends the program (exit code 2, one line on stderr) when the path is
// a folder, its folder cannot be created, or the folder is not writable.
inline void prepare_h5_output(const char* program, const std::string& path) {
  namespace fs = std::filesystem;
  auto refuse = [&](const std::string& why) {
    std::fprintf(stderr, "%s: --h5 '%s': %s\n", program, path.c_str(), why.c_str());
    std::exit(2);
  };
  if (path.empty()) refuse("empty path, expected the HDF5 result file to write");
  std::error_code ec;
  if (fs::is_directory(path, ec)) refuse("is a folder, expected the path of a file to write");
  const fs::path dir = fs::path(path).has_parent_path() ? fs::path(path).parent_path() : fs::path(".");
  if (!fs::is_directory(dir, ec)) {
    fs::create_directories(dir, ec);
    if (ec) refuse(fmt::format("cannot create the folder '{}': {}", dir.string(), ec.message()));
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) refuse(fmt::format("the folder '{}' is not writable", dir.string()));
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
  if (given) prepare_h5_output(argv[0], path);
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

}  // namespace fp4moe::bench
