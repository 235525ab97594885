// Helpers shared by the GPU tests: device detection with a clear skip reason, device buffers, poisoning, bitwise
// comparison of results and expected rejections.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "kernels/common/check.h"
#include "kernels/common/types.h"

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

// The bit patterns of BF16 values (for bitwise comparison and printing).
inline std::vector<uint16_t> bits_of(const std::vector<bf16>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = bf16_bits(v[i]);
  return out;
}

// Index of the first element whose bytes differ, or -1 when a and b are bitwise equal; 0 when the sizes differ.
template <typename T>
int64_t first_mismatch(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return static_cast<int64_t>(i);
  return -1;
}

// Runs `f`, expects fp4moe::Error with every one of `parts` in its message.
inline void expect_error_mentions(const std::function<void()>& f, std::initializer_list<const char*> parts) {
  try {
    f();
    ADD_FAILURE() << "expected fp4moe::Error";
  } catch (const Error& e) {
    for (const char* p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

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
