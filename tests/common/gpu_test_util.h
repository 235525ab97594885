// Helpers shared by the GPU tests: device detection with a clear skip reason, device buffers, poisoning.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/common/check.h"

namespace fp4moe::test {

// Empty when a CUDA device is usable, else why not.
inline std::string why_no_gpu() {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return std::string("no usable CUDA device (") + cudaGetErrorString(err) + ")";
  }
  if (n == 0) return "no CUDA device present";
  return {};
}

inline bool gpu_required() {
  const char* v = std::getenv("FP4MOE_REQUIRE_GPU");
  return v && std::strcmp(v, "0") != 0;
}

// A device buffer of n elements of T, freed on scope exit.
template <typename T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t n = 0;
  explicit DeviceBuffer(size_t count) : n(count) {
    if (n) CUDA_CHECK(cudaMalloc(&ptr, n * sizeof(T)));
  }
  ~DeviceBuffer() {
    if (ptr) cudaFree(ptr);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void upload(const std::vector<T>& h) { CUDA_CHECK(cudaMemcpy(ptr, h.data(), n * sizeof(T), cudaMemcpyHostToDevice)); }
  std::vector<T> download() const {
    std::vector<T> h(n);
    if (n) CUDA_CHECK(cudaMemcpy(h.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  // Fill every byte with `byte` so that an element the kernel fails to write shows up in the comparison.
  void poison(unsigned char byte = 0xA5) {
    if (n) CUDA_CHECK(cudaMemset(ptr, byte, n * sizeof(T)));
  }
};

}  // namespace fp4moe::test

// First statement of every GPU test.
#define FP4MOE_REQUIRE_DEVICE()                                                      \
  do {                                                                               \
    std::string why_ = ::fp4moe::test::why_no_gpu();                                 \
    if (!why_.empty()) {                                                             \
      if (::fp4moe::test::gpu_required()) FAIL() << why_ << " (FP4MOE_REQUIRE_GPU is set)"; \
      GTEST_SKIP() << why_;                                                          \
    }                                                                                \
  } while (0)
