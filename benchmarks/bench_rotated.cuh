// Memory-bound benchmark cases measured over rotated input copies, against a device-to-device copy of the same
// byte count measured in the same run (header only, for the bench_<family>.cu programs whose kernels move bytes
// rather than compute: bench_nn, bench_quant):
//
//   RotatedCase   one case: its name parts, the bytes one launch must move (the minimal traffic: inputs read
//                 once, outputs written once) and touches (sizes the rotation), and how to build `copies` inputs
//   RotatedCases  the cases of a program, run_case (Google Benchmark manual time from CUDA events: each
//                 iteration a batch of one launch per copy, after a warm-up launch on each), add_copy_ceilings (one
//                 `copy` case per byte count, within 1%), and summarize (time_us: the median over iterations of
//                 the batch time / copies; gbps; fraction_of_copy_bw against the copy at the closest byte count)
//
// The copy is cudaMemcpyAsync device to device of half the bytes (read) into the other half (written), on copies
// rotated like the cases' inputs. A case's workload is built once and kept while Google Benchmark calls the case
// again with more iterations; it is freed when the next case starts or by release().
#pragma once

#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "benchmarks/bench_util.cuh"
#include "kernels/common/check.h"
#include "kernels/formats/formats.h"

namespace fp4moe::bench {

// One launch of a case on input copy `copy` (in [0, copies)).
using RotatedLaunch = std::function<void(int copy, cudaStream_t stream)>;

// The device memory of one case and its launch.
struct RotatedWorkload {
  DevicePool pool;
  RotatedLaunch launch;
};

struct RotatedCase {
  std::string kase, shape, recipe;  // recipe "copy" marks the ceiling cases
  int64_t bytes = 0;                // minimal traffic of one launch: bytes read + bytes written (> 0)
  int64_t working_set = 0;          // bytes one launch touches, workspaces included (sizes the rotation)
  std::function<void(RotatedWorkload&, int copies)> build;  // allocates and fills `copies` inputs, sets launch
  std::string traffic;              // what `bytes` counts, e.g. "x 2Td + weight 2d -> y 2Td + rstd 4T"
  std::string name() const { return kase + "/" + shape; }
};

// One row of the summary: the case, microseconds per launch, GB/s of its minimal traffic, the fraction of the
// copy's GB/s at the closest byte count (1 for a copy row; NaN without a measured copy).
struct RotatedRow {
  const RotatedCase* spec = nullptr;
  double us = 0, gbps = 0, fraction = NAN;
};

class RotatedCases {
 public:
  std::vector<RotatedCase>& cases() { return cases_; }

  // Adds one copy case per distinct byte count of the cases so far (sizes within 1% of the last one added share
  // it: bandwidth is flat at that scale).
  void add_copy_ceilings() {
    std::set<int64_t> sizes;
    for (const auto& c : cases_) sizes.insert(c.bytes / 2 * 2);
    int64_t last = 0;
    for (int64_t b : sizes)
      if (last == 0 || static_cast<double>(b) > 1.01 * static_cast<double>(last)) {
        add_copy(b);
        last = b;
      }
  }

  // The device's L2 size and the bytes the rotated copies of one case may take (set before the first case).
  void set_device_limits(int64_t l2_bytes, int64_t budget_bytes) {
    l2_bytes_ = l2_bytes;
    budget_bytes_ = budget_bytes;
  }
  int64_t l2_bytes() const { return l2_bytes_; }

  // Measures case i into `state`: SkipWithError when building or launching throws.
  void run_case(benchmark::State& state, size_t i) {
    const RotatedCase* spec = &cases_.at(i);
    Measured& m = measured_[spec->name()];
    m = Measured{};
    try {
      if (cached_spec_ != spec) {
        release();
        const int copies = rotation_copies(spec->working_set, l2_bytes_, budget_bytes_);
        auto w = std::make_unique<RotatedWorkload>();
        spec->build(*w, copies);
        for (int c = 0; c < copies; ++c) w->launch(c, nullptr);  // warm-up
        CUDA_CHECK(cudaDeviceSynchronize());
        workload_ = std::move(w);
        cached_spec_ = spec;
        copies_ = copies;
      }
    } catch (const std::exception& e) {
      release();
      state.SkipWithError(e.what());
      return;
    }
    EventTimer timer;
    double total = 0;
    int64_t launches = 0;
    std::vector<double> per_launch;
    for (auto _ : state) {
      try {
        const double s = timer.time(copies_, nullptr, [&](int c) { workload_->launch(c, nullptr); });
        state.SetIterationTime(s / copies_);
        per_launch.push_back(s / copies_);
        total += s;
        launches += copies_;
      } catch (const std::exception& e) {
        state.SkipWithError(e.what());
        release();
        return;
      }
    }
    state.counters["bytes"] = static_cast<double>(spec->bytes);
    state.counters["GB/s"] = total > 0 ? static_cast<double>(spec->bytes) * launches / total * 1e-9 : 0.0;
    state.counters["copies"] = copies_;
    m = Measured{true, median(per_launch)};
  }

  // Frees the workload of the last case run.
  void release() {
    workload_.reset();
    cached_spec_ = nullptr;
    copies_ = 0;
  }

  // True when every case that ran was measured.
  bool all_ok() const {
    for (const auto& kv : measured_)
      if (!kv.second.ok) return false;
    return true;
  }
  // Number of cases that ran and failed.
  int failed() const {
    int n = 0;
    for (const auto& kv : measured_) n += kv.second.ok ? 0 : 1;
    return n;
  }

  // The measured cases in the order of registration, copy rows included.
  std::vector<RotatedRow> summarize() const {
    std::vector<RotatedRow> rows;
    for (const auto& c : cases_) {
      auto it = measured_.find(c.name());
      if (it == measured_.end() || !it->second.ok || !(it->second.seconds > 0)) continue;
      RotatedRow r{&c};
      r.us = it->second.seconds * 1e6;
      r.gbps = static_cast<double>(c.bytes) / r.us * 1e-3;
      rows.push_back(r);
    }
    for (auto& r : rows) {
      if (r.spec->recipe == "copy") {
        r.fraction = 1.0;
        continue;
      }
      const RotatedRow* best = nullptr;
      auto distance = [&](const RotatedRow& c) {
        return std::fabs(std::log(static_cast<double>(c.spec->bytes) / static_cast<double>(r.spec->bytes)));
      };
      for (const auto& c : rows)
        if (c.spec->recipe == "copy" && (!best || distance(c) < distance(*best))) best = &c;
      if (best) r.fraction = r.gbps / best->gbps;
    }
    return rows;
  }

 private:
  struct Measured {
    bool ok = false;
    double seconds = 0;  // median seconds per launch
  };

  // The median of `v` (the mean of the two middle values for an even count); 0 for an empty list.
  static double median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const size_t h = v.size() / 2;
    return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
  }

  void add_copy(int64_t bytes) {
    const int64_t n = bytes / 2;
    cases_.push_back({"copy", fmt::format("{}B", bytes), "copy", 2 * n, 2 * n, [=](RotatedWorkload& w, int copies) {
                        std::vector<char*> src, dst;
                        for (int c = 0; c < copies; ++c) {
                          src.push_back(w.pool.alloc<char>(n));
                          dst.push_back(w.pool.alloc<char>(n));
                          CUDA_CHECK(cudaMemset(src.back(), 0x3C + c, n));  // not zeros
                        }
                        w.launch = [=](int c, cudaStream_t s) {
                          CUDA_CHECK(cudaMemcpyAsync(dst[c], src[c], n, cudaMemcpyDeviceToDevice, s));
                        };
                      },
                      "src bytes/2 -> dst bytes/2"});
  }

  std::vector<RotatedCase> cases_;
  std::map<std::string, Measured> measured_;
  std::unique_ptr<RotatedWorkload> workload_;
  const RotatedCase* cached_spec_ = nullptr;
  int copies_ = 0;
  int64_t l2_bytes_ = 0, budget_bytes_ = 0;
};

}  // namespace fp4moe::bench
