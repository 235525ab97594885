#include "kernels/gemm/grouped_gemm_ref.h"

#include <cmath>
#include <functional>
#include <limits>
#include <thread>
#include <vector>

#include "kernels/common/check.h"
#include "kernels/common/offsets.h"

namespace fp4moe {

namespace {

// Calls body(i) for i in [0, n) on the hardware threads; each i is handled by exactly one thread.
void parallel_for(int64_t n, const std::function<void(int64_t)>& body) {
  int64_t threads = std::thread::hardware_concurrency();
  if (threads < 1) threads = 1;
  if (threads > n) threads = n;
  if (threads <= 1) {
    for (int64_t i = 0; i < n; ++i) body(i);
    return;
  }
  std::vector<std::thread> pool;
  for (int64_t t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      for (int64_t i = t; i < n; i += threads) body(i);
    });
  for (auto& th : pool) th.join();
}

std::vector<int64_t> rows_to_compute(std::span<const int64_t> rows, int64_t limit, const char* what) {
  std::vector<int64_t> out;
  if (rows.empty()) {
    out.resize(static_cast<size_t>(limit));
    for (int64_t i = 0; i < limit; ++i) out[static_cast<size_t>(i)] = i;
    return out;
  }
  for (int64_t r : rows) {
    FP4MOE_CHECK(r >= 0 && r < limit, "{}: requested row {} is outside [0, {})", what, r, limit);
    out.push_back(r);
  }
  return out;
}

// Group of each token row.
std::vector<int64_t> group_of_rows(const int32_t* offsets, int64_t G, int64_t M) {
  std::vector<int64_t> group(static_cast<size_t>(M));
  for (int64_t g = 0; g < G; ++g)
    for (int64_t r = offsets[g]; r < offsets[g + 1]; ++r) group[static_cast<size_t>(r)] = g;
  return group;
}

// The operands may be null when there are no tokens (M = 0: nothing is read); the output only where it is then
// empty too (Fprop, Dgrad: [0, N]), not for Wgrad ([G, N, K] zeros).
void check_args(const char* what, const void* a, const void* b, const void* out, int64_t M, int64_t N, int64_t K,
                const int32_t* offsets, int64_t G, bool out_empty_without_tokens) {
  FP4MOE_CHECK(M >= 0 && N >= 1 && K >= 1, "{}: expected M >= 0, N >= 1, K >= 1, got M={} N={} K={}", what, M, N, K);
  FP4MOE_CHECK(M == 0 || (a && b), "{}: both operands must be non-null when M > 0, got {} and {} with M={}", what,
               a, b, M);
  FP4MOE_CHECK(out || (M == 0 && out_empty_without_tokens),
               "{}: the output must be non-null{}", what,
               out_empty_without_tokens ? " when M > 0" : " (Wgrad writes [G, N, K] even when M = 0)");
  validate_group_offsets(offsets, G, M, what);
}

}  // namespace

void grouped_fprop_ref(const float* x, const float* w, int64_t M, int64_t N, int64_t K, const int32_t* offsets,
                       int64_t G, float* y, std::span<const int64_t> rows) {
  const char* what = "grouped_fprop_ref";
  check_args(what, x, w, y, M, N, K, offsets, G, true);
  const auto todo = rows_to_compute(rows, M, what);
  const auto group = group_of_rows(offsets, G, M);
  parallel_for(static_cast<int64_t>(todo.size()), [&](int64_t i) {
    const int64_t r = todo[static_cast<size_t>(i)];
    const float* xr = x + r * K;
    const float* wg = w + group[static_cast<size_t>(r)] * N * K;
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0.0;
      for (int64_t k = 0; k < K; ++k) acc += static_cast<double>(xr[k]) * static_cast<double>(wg[n * K + k]);
      y[r * N + n] = static_cast<float>(acc);
    }
  });
}

void grouped_dgrad_ref(const float* dy, const float* w, int64_t M, int64_t N, int64_t K, const int32_t* offsets,
                       int64_t G, float* dx, std::span<const int64_t> rows) {
  const char* what = "grouped_dgrad_ref";
  check_args(what, dy, w, dx, M, N, K, offsets, G, true);
  const auto todo = rows_to_compute(rows, M, what);
  const auto group = group_of_rows(offsets, G, M);
  parallel_for(static_cast<int64_t>(todo.size()), [&](int64_t i) {
    const int64_t r = todo[static_cast<size_t>(i)];
    const float* dyr = dy + r * N;
    const float* wg = w + group[static_cast<size_t>(r)] * N * K;
    std::vector<double> acc(static_cast<size_t>(K), 0.0);
    for (int64_t n = 0; n < N; ++n) {
      const double d = dyr[n];
      for (int64_t k = 0; k < K; ++k) acc[static_cast<size_t>(k)] += d * static_cast<double>(wg[n * K + k]);
    }
    for (int64_t k = 0; k < K; ++k) dx[r * K + k] = static_cast<float>(acc[static_cast<size_t>(k)]);
  });
}

void grouped_wgrad_ref(const float* dy, const float* x, int64_t M, int64_t N, int64_t K, const int32_t* offsets,
                       int64_t G, float* dw, std::span<const int64_t> rows) {
  const char* what = "grouped_wgrad_ref";
  check_args(what, dy, x, dw, M, N, K, offsets, G, false);
  const auto todo = rows_to_compute(rows, N, what);
  const int64_t items = G * static_cast<int64_t>(todo.size());
  parallel_for(items, [&](int64_t i) {
    const int64_t g = i / static_cast<int64_t>(todo.size());
    const int64_t n = todo[static_cast<size_t>(i % static_cast<int64_t>(todo.size()))];
    std::vector<double> acc(static_cast<size_t>(K), 0.0);
    for (int64_t r = offsets[g]; r < offsets[g + 1]; ++r) {
      const double d = dy[r * N + n];
      const float* xr = x + r * K;
      for (int64_t k = 0; k < K; ++k) acc[static_cast<size_t>(k)] += d * static_cast<double>(xr[k]);
    }
    float* out = dw + (g * N + n) * K;
    for (int64_t k = 0; k < K; ++k) out[k] = static_cast<float>(acc[static_cast<size_t>(k)]);
  });
}

double relative_l2_error(const float* got, const float* want, int64_t n) {
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(got[i])) return std::numeric_limits<double>::quiet_NaN();
    const double e = static_cast<double>(got[i]) - static_cast<double>(want[i]);
    num += e * e;
    den += static_cast<double>(want[i]) * static_cast<double>(want[i]);
  }
  if (den == 0.0) return num == 0.0 ? 0.0 : std::numeric_limits<double>::infinity();
  return std::sqrt(num / den);
}

}  // namespace fp4moe
