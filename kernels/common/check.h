// One family of checks for the whole project: host argument checks, CUDA runtime calls, cuBLAS(Lt) calls.
// Each failure throws fp4moe::Error with file:line and a message that says what was wrong and what was expected.
// Checks run before any launch; kernels never validate arguments themselves.
#pragma once

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace fp4moe {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] inline void fail(const char* file, int line, const std::string& msg) {
  throw Error(fmt::format("{} ({}:{})", msg, file, line));
}

}  // namespace fp4moe

// FP4MOE_CHECK(cond, "K must be a multiple of 32, got K={}", K);
#define FP4MOE_CHECK(cond, ...)                                          \
  do {                                                                   \
    if (!(cond)) ::fp4moe::fail(__FILE__, __LINE__, fmt::format(__VA_ARGS__)); \
  } while (0)

#define CUDA_CHECK(call)                                                                          \
  do {                                                                                            \
    cudaError_t err_ = (call);                                                                    \
    if (err_ != cudaSuccess)                                                                      \
      ::fp4moe::fail(__FILE__, __LINE__,                                                          \
                     fmt::format("CUDA error {} ({}) in {}", cudaGetErrorName(err_),              \
                                 cudaGetErrorString(err_), #call));                               \
  } while (0)

// After a launch: catches bad launch configurations at once (asynchronous faults surface at the next sync).
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

#define CUBLAS_CHECK(call)                                                                        \
  do {                                                                                            \
    auto st_ = (call);                                                                            \
    if (static_cast<int>(st_) != 0)                                                               \
      ::fp4moe::fail(__FILE__, __LINE__,                                                          \
                     fmt::format("cuBLAS status {} in {}", static_cast<int>(st_), #call));        \
  } while (0)
