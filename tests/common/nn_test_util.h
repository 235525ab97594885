// Helpers of the GPU tests of the kernels/nn layer ops (test_nn_*.cpp): guarded device tensors poisoned with NaN,
// seeded inputs, the `tiny` model shapes, and tolerance comparisons that report the first mismatches.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tests/common/gpu_test_util.h"
#include "kernels/common/check.h"
#include "kernels/common/types.h"
#include "kernels/formats/formats.h"

namespace fp4moe::test {

// Layer widths of the `tiny` test model (DeepSeek-V3 structure at toy size): 2 sequences of 64 tokens, hidden 256,
// 4 heads with a 64-wide rope part, MLA latents of 64 (q) and 32 (kv), dense FFN 512, expert FFN 128.
struct TinyShapes {
  static constexpr int64_t batch = 2, seq_len = 64, tokens = batch * seq_len;
  static constexpr int64_t hidden = 256, heads = 4, rope_dim = 64, q_lora = 64, kv_lora = 32;
  static constexpr int64_t ffn = 512, expert_ffn = 128;
};

// Byte 0xFF in every element: NaN as BF16 (0xFFFF) and FP32 (0xFFFFFFFF), so an unwritten output fails any
// tolerance comparison.
constexpr unsigned char kNanPoison = 0xFF;

// A device tensor of n elements starting `shift` elements after a guard of kGuard elements (kGuard keeps 16-byte
// alignment; shift = 1 makes the tensor misaligned for the 16-byte paths), with guards on both sides that must stay
// poisoned.
template <typename T>
struct Guarded {
  static constexpr size_t kGuard = 64;
  size_t n, shift;
  DeviceBuffer<T> buf;
  explicit Guarded(size_t count, size_t shift_elems = 0)
      : n(count), shift(shift_elems), buf(count + shift_elems + 2 * kGuard) {
    buf.poison(kNanPoison);
  }
  T* ptr() { return buf.ptr + kGuard + shift; }
  void poison() { buf.poison(kNanPoison); }
  void upload(const std::vector<T>& h) {
    EXPECT_EQ(h.size(), n);
    if (n) CUDA_CHECK(cudaMemcpy(ptr(), h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() {
    std::vector<T> h(n);
    if (n) CUDA_CHECK(cudaMemcpy(h.data(), ptr(), n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  bool guards_intact() {
    const std::vector<T> all = buf.download();
    const auto* bytes = reinterpret_cast<const unsigned char*>(all.data());
    const size_t head = (kGuard + shift) * sizeof(T), tail = kGuard * sizeof(T), total = all.size() * sizeof(T);
    for (size_t i = 0; i < head; ++i)
      if (bytes[i] != kNanPoison) return false;
    for (size_t i = 0; i < tail; ++i)
      if (bytes[total - 1 - i] != kNanPoison) return false;
    return true;
  }
};

inline double value_of(bf16 v) { return bf16_bits_to_f32(bf16_bits(v)); }
inline double value_of(float v) { return v; }

// n BF16 values from N(mean, stddev) (rounded), seeded.
inline std::vector<bf16> random_bf16(size_t n, uint32_t seed, double mean = 0.0, double stddev = 1.0) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> dist(mean, stddev);
  std::vector<bf16> v(n);
  for (auto& x : v) x = bf16_from_bits(f32_to_bf16_bits(static_cast<float>(dist(rng))));
  return v;
}
inline std::vector<float> random_f32(size_t n, uint32_t seed, double mean = 0.0, double stddev = 1.0) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> dist(mean, stddev);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(dist(rng));
  return v;
}

// Expects |gpu[i] - ref[i]| <= rtol * |ref[i]| + atol(i) for every i (NaN never passes); reports the count and the
// first mismatches. rtol = 2^-7 allows one BF16 rounding step (one ulp) on top of the FP32 arithmetic error
// that atol bounds.
template <typename T>
void expect_close(const std::vector<T>& gpu, const std::vector<T>& ref, double rtol,
                  const std::function<double(size_t)>& atol, const std::string& what) {
  ASSERT_EQ(gpu.size(), ref.size()) << what;
  size_t bad = 0;
  std::ostringstream first;
  for (size_t i = 0; i < gpu.size(); ++i) {
    const double g = value_of(gpu[i]), r = value_of(ref[i]);
    const double tol = rtol * std::fabs(r) + atol(i);
    if (!(std::fabs(g - r) <= tol)) {
      if (bad < 5) first << "\n  [" << i << "] gpu " << g << " ref " << r << " tol " << tol;
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << gpu.size() << " elements out of tolerance" << first.str();
}

template <typename T>
void expect_bitwise_equal(const std::vector<T>& a, const std::vector<T>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0 && bad++ == 0) first = i;
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " elements differ, first at " << first;
}

constexpr double kBf16Rtol = 1.0 / 128;  // one BF16 ulp relative to the value

}  // namespace fp4moe::test
