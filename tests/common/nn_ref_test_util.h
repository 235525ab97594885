// Helpers of the CPU tests of the kernels/nn references (test_nn_ref_*.cpp): seeded inputs, BF16 conversions,
// expected rejections, and central finite differences in double for the backward passes.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "kernels/common/check.h"
#include "kernels/common/types.h"
#include "kernels/formats/formats.h"

namespace fp4moe::test {

inline double bf16_to_f64(bf16 v) { return bf16_bits_to_f32(bf16_bits(v)); }
inline bf16 f64_to_bf16(double v) { return bf16_from_bits(f32_to_bf16_bits(static_cast<float>(v))); }

inline std::vector<bf16> to_bf16(const std::vector<double>& v) {
  std::vector<bf16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = f64_to_bf16(v[i]);
  return out;
}
inline std::vector<double> to_f64(const std::vector<bf16>& v) {
  std::vector<double> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = bf16_to_f64(v[i]);
  return out;
}

// n values from N(mean, stddev), seeded.
inline std::vector<double> normal_values(size_t n, uint32_t seed, double mean = 0.0, double stddev = 1.0) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> dist(mean, stddev);
  std::vector<double> v(n);
  for (double& x : v) x = dist(rng);
  return v;
}

// Runs `f`, expects fp4moe::Error, and checks that its message contains every one of `parts`.
inline void expect_error_mentions(const std::function<void()>& f, std::initializer_list<const char*> parts) {
  try {
    f();
    ADD_FAILURE() << "expected fp4moe::Error mentioning " << *parts.begin();
  } catch (const Error& e) {
    for (const char* p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

// d loss / d x[i] by central differences in double, with step h * max(1, |x[i]|). `loss` reads x.
inline std::vector<double> finite_difference_gradient(std::vector<double>& x, const std::function<double()>& loss,
                                                      double h = 1e-6) {
  std::vector<double> grad(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i], step = h * std::max(1.0, std::fabs(saved));
    x[i] = saved + step;
    const double up = loss();
    x[i] = saved - step;
    const double down = loss();
    x[i] = saved;
    grad[i] = (up - down) / (2 * step);
  }
  return grad;
}

// Analytic gradient against finite differences: |a - fd| <= tol * max(1, |fd|) per element.
inline void expect_gradient_matches(const std::vector<double>& analytic, const std::vector<double>& fd,
                                    const char* name, double tol = 1e-6) {
  ASSERT_EQ(analytic.size(), fd.size()) << name;
  for (size_t i = 0; i < fd.size(); ++i)
    EXPECT_NEAR(analytic[i], fd[i], tol * std::max(1.0, std::fabs(fd[i]))) << name << "[" << i << "]";
}

// sum_i y[i] * g[i]: the loss whose gradient with respect to y is g.
inline double dot(const std::vector<double>& y, const std::vector<double>& g) {
  double s = 0;
  for (size_t i = 0; i < y.size(); ++i) s += y[i] * g[i];
  return s;
}

}  // namespace fp4moe::test
