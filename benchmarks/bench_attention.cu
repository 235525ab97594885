// bench_attention: causal flash attention (kernels/attention/flash_attention.h), forward, backward and
// forward+backward, against a dense cuBLASLt BF16 GEMM measured in the same run (the tensor-core ceiling), and each
// kernel variant (kernels/attention/flash_attention_variants.h) beside them.
//
//   bench_attention [--h5 PATH] [Google Benchmark flags, e.g. --benchmark_filter=mla]
//
// Shapes: `mla` B=1 T=4096 H=128, Dqk/Dv = 192/128 (DeepSeek-V2/V3 attention at their 4096-token sequences);
// `small` B=8 T=1024 H=12, 96/64 (the `small` config). Case names <pass>/<shape>, pass fwd, bwd or fwd+bwd (the
// public functions, i.e. variant 0), and <pass>@v<N>/<shape> for variant N of fwd or bwd (a variant pair's fwd+bwd
// is the sum of the two); the ceiling is gemm_bf16/8192x8192x8192 (cuBLASLt, BF16 in and out, FP32 accumulation).
// The variant comparison alone (20 cases and the GEMM ceiling, well under a minute): --benchmark_filter='@v|gemm'.
// FLOPs (causal, the convention of FlashAttention's benchmarks): forward 2 B H T (T+1)/2 (Dqk + Dv) (the two
// products over the visible half of the score matrix), backward 2.5x forward, forward+backward 3.5x forward. The
// backward of variants 0 to 2 actually runs 7 products instead of 5 (the scores and dP are recomputed for dQ: no
// atomics), which the convention does not count; variant 3 runs 5.
// Inputs: q, k, v, dO seeded N(0, 1) BF16, dense [B*T, H, D]; one copy (every pass is compute-bound and the mla
// tensors alone exceed the L2 many times over). Check before timing: one forward and backward of the public
// functions and of every variant on NaN-poisoned outputs; O, lse, dQ, dK, dV must be finite everywhere, and each
// variant's within 2e-2 relative L2 of the public functions' (a variant that fails is skipped with the reason;
// correctness itself is tests/gpu/test_attention.cpp). The backward passes read the O and lse of whichever forward
// ran last (any variant's: the same values up to FP32 rounding).
// Timing: CUDA events around one pass per iteration after a warm-up pass (Google Benchmark manual time, at least
// kMinTimeS); the tables report the median iteration.
// After the run: `case | shape | us | TFLOP/s | x gemm | x v0` (x gemm: TFLOP/s over the GEMM's; x v0: a variant's
// TFLOP/s over variant 0's of the same pass and shape), and with --h5 the table /bench/attention (bench_util.cuh's
// columns, then pass, B, T, H, dqk, dv, fraction_of_gemm, variant (-1: the public functions), speedup_vs_v0). The
// PyTorch peer (torch SDPA on the same shapes) is benchmarks/peers/attention_torch.py.
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "benchmarks/bench_util.cuh"
#include "kernels/attention/flash_attention.h"
#include "kernels/attention/flash_attention_variants.h"
#include "kernels/common/check.h"
#include "kernels/common/types.h"
#include "kernels/gemm/cublaslt_matmul.h"
#include "results/env_info.h"
#include "results/run_info.h"

namespace fp4moe::bench_attn {
namespace {

constexpr double kMinTimeS = 0.05;
constexpr int64_t kGemmSize = 8192;

// ---- cases --------------------------------------------------------------------------------------------------------

struct Shape {
  const char* name;
  int64_t B, T, H, Dqk, Dv;
};
constexpr Shape kShapes[] = {{"mla", 1, 4096, 128, 192, 128}, {"small", 8, 1024, 12, 96, 64}};
constexpr const char* kPasses[] = {"fwd", "bwd", "fwd+bwd"};

struct Case {
  std::string pass;  // fwd, bwd, fwd+bwd; "gemm_bf16" for the ceiling
  Shape shape{};
  bool gemm = false;
  int variant = -1;  // -1: the public functions; else the variant id of fwd or bwd (flash_attention_variants.h)
  std::string shape_text() const {
    return gemm ? fmt::format("{0}x{0}x{0}", kGemmSize)
                : fmt::format("{} B{} T{} H{} {}/{}", shape.name, shape.B, shape.T, shape.H, shape.Dqk, shape.Dv);
  }
  // The workload's key of the pass: fwd, bwd, fwd+bwd, fwd@v<N>, bwd@v<N>.
  std::string key() const { return variant < 0 ? pass : fmt::format("{}@v{}", pass, variant); }
  std::string name() const { return gemm ? "gemm_bf16/" + shape_text() : key() + "/" + shape.name; }
  double flops() const {
    if (gemm) return 2.0 * kGemmSize * kGemmSize * kGemmSize;
    const double fwd = 2.0 * shape.B * shape.H * (shape.T * (shape.T + 1) / 2.0) * (shape.Dqk + shape.Dv);
    return pass == "fwd" ? fwd : pass == "bwd" ? 2.5 * fwd : 3.5 * fwd;
  }
};

std::vector<Case> g_cases;

// Per shape the public passes, then every variant of fwd and bwd (one workload per shape serves them all).
void define_cases() {
  for (const Shape& s : kShapes) {
    for (const char* pass : kPasses) g_cases.push_back(Case{pass, s, false});
    for (int v = 0; v < attn_detail::kForwardVariants; ++v) g_cases.push_back(Case{"fwd", s, false, v});
    for (int v = 0; v < attn_detail::kBackwardVariants; ++v) g_cases.push_back(Case{"bwd", s, false, v});
  }
  g_cases.push_back(Case{"gemm_bf16", Shape{}, true});
}

// ---- workloads ----------------------------------------------------------------------------------------------------

// counts[0] += elements of p[0..n) that are NaN or +-Inf.
template <typename T>
__global__ void count_nonfinite_kernel(const T* p, int64_t n, unsigned long long* count) {
  unsigned long long bad = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    bad += !isfinite(static_cast<float>(p[i]));
  if (bad) atomicAdd(count, bad);
}

// Rejects (fp4moe::Error) a tensor with a NaN/Inf element: an unwritten element of a NaN-poisoned output, or an
// overflow.
template <typename T>
void check_finite(const char* what, const T* p, int64_t n, unsigned long long* d_count) {
  CUDA_CHECK(cudaMemset(d_count, 0, sizeof(unsigned long long)));
  const auto blocks = static_cast<unsigned>(std::clamp<int64_t>((n + 255) / 256, 1, 65536));
  count_nonfinite_kernel<T><<<blocks, 256>>>(p, n, d_count);
  CUDA_CHECK_LAUNCH();
  unsigned long long h = 0;
  CUDA_CHECK(cudaMemcpy(&h, d_count, sizeof(h), cudaMemcpyDeviceToHost));
  FP4MOE_CHECK(h == 0, "output check: {} has {} NaN/Inf elements of {} (expected all finite)", what, h, n);
}

// partial[2 b], partial[2 b + 1] = sum over block b's share of (a - b)^2 and b^2 (double), for rel_diff.
template <typename T>
__global__ void diff_norms_kernel(const T* a, const T* b, int64_t n, double* partial) {
  __shared__ double s_diff[256], s_ref[256];
  double diff = 0, ref = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const double x = static_cast<float>(a[i]), y = static_cast<float>(b[i]);
    diff += (x - y) * (x - y);
    ref += y * y;
  }
  s_diff[threadIdx.x] = diff;
  s_ref[threadIdx.x] = ref;
  __syncthreads();
  for (int w = 128; w > 0; w >>= 1) {
    if (static_cast<int>(threadIdx.x) < w) {
      s_diff[threadIdx.x] += s_diff[threadIdx.x + w];
      s_ref[threadIdx.x] += s_ref[threadIdx.x + w];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[2 * blockIdx.x] = s_diff[0], partial[2 * blockIdx.x + 1] = s_ref[0];
}

constexpr int kDiffBlocks = 1024;

// Rejects (fp4moe::Error) a variant's output a that differs from variant 0's b by more than `tol` in relative L2
// (variants differ from variant 0 by the order of FP32 sums only: ~1e-3 expected). partial: 2 * kDiffBlocks doubles.
template <typename T>
void check_close(const char* what, const T* a, const T* b, int64_t n, double tol, double* partial) {
  diff_norms_kernel<T><<<kDiffBlocks, 256>>>(a, b, n, partial);
  CUDA_CHECK_LAUNCH();
  std::vector<double> h(2 * kDiffBlocks);
  CUDA_CHECK(cudaMemcpy(h.data(), partial, h.size() * sizeof(double), cudaMemcpyDeviceToHost));
  double diff = 0, ref = 0;
  for (int i = 0; i < kDiffBlocks; ++i) diff += h[2 * i], ref += h[2 * i + 1];
  const double rel = std::sqrt(diff / std::max(ref, 1e-30));
  FP4MOE_CHECK(rel <= tol, "output check: {} differs from variant 0's by {:.3g} relative L2 (expected <= {})", what,
               rel, tol);
}

constexpr double kVariantTol = 2e-2;

struct Workload {
  bench::DevicePool pool;
  std::unique_ptr<CublasLtMatmul> lt;
  std::map<std::string, std::function<void()>> pass;
  std::map<std::string, std::string> broken;  // pass key -> why its output check failed (the case is skipped)
};

std::unique_ptr<Workload> build_gemm() {
  auto w = std::make_unique<Workload>();
  const int64_t n = kGemmSize;
  bf16* a = w->pool.alloc<bf16>(n * n);
  bf16* b = w->pool.alloc<bf16>(n * n);
  bf16* d = w->pool.alloc<bf16>(n * n);
  bench::fill_bf16_random(a, n, n, 11, bench::weight_spread());
  bench::fill_bf16_random(b, n, n, 12, bench::weight_spread());
  w->lt = std::make_unique<CublasLtMatmul>();
  CublasLtMatmul& lt = *w->lt;
  // D (n x n) = A^T B with both operands contiguous along k, as the FP8 GEMMs of this project take them.
  const LtOperand A{a, CUDA_R_16BF, true, n}, B{b, CUDA_R_16BF, false, n};
  const LtOutput D{d, CUDA_R_16BF, n, false};
  w->pass["gemm_bf16"] = [&lt, A, B, D, n] { lt.matmul(n, n, n, A, B, D, RaggedDim::none, nullptr); };
  w->pass["gemm_bf16"]();
  CUDA_CHECK(cudaDeviceSynchronize());
  return w;
}

std::unique_ptr<Workload> build_attention(const Shape& sh) {
  auto w = std::make_unique<Workload>();
  bench::DevicePool& p = w->pool;
  const AttentionShape s{sh.B, sh.T, sh.H, sh.Dqk, sh.Dv, static_cast<float>(1.0 / std::sqrt(double(sh.Dqk)))};
  const int64_t rows = sh.B * sh.T;
  const bench::Spread normal{1.0f, 0, 0, 0, 1.0f};  // N(0, 1), no per-token scaling or outlier channels
  auto tensor = [&](int64_t D, uint64_t seed) {
    bf16* t = p.alloc<bf16>(rows * sh.H * D);
    if (seed) bench::fill_bf16_random(t, rows, sh.H * D, seed, normal);
    else CUDA_CHECK(cudaMemset(t, 0xFF, sizeof(bf16) * rows * sh.H * D));  // NaN poison
    return t;
  };
  bf16 *q = tensor(sh.Dqk, 1), *k = tensor(sh.Dqk, 2), *v = tensor(sh.Dv, 3), *dout = tensor(sh.Dv, 4);
  bf16 *o = tensor(sh.Dv, 0), *dq = tensor(sh.Dqk, 0), *dk = tensor(sh.Dqk, 0), *dv = tensor(sh.Dv, 0);
  float* lse = p.alloc<float>(sh.B * sh.H * sh.T);
  CUDA_CHECK(cudaMemset(lse, 0xFF, sizeof(float) * sh.B * sh.H * sh.T));
  int64_t ws_bytes = flash_attention_backward_workspace_bytes(s);
  for (int id = 0; id < attn_detail::kBackwardVariants; ++id)
    ws_bytes = std::max(ws_bytes, attn_detail::flash_attention_backward_variant_workspace_bytes(id, s));
  void* ws = p.alloc<unsigned char>(ws_bytes);
  auto* count = p.alloc<unsigned long long>(1);
  const AttnIn qi{q, sh.H * sh.Dqk, sh.Dqk}, ki{k, sh.H * sh.Dqk, sh.Dqk}, vi{v, sh.H * sh.Dv, sh.Dv};
  const AttnIn oi{o, sh.H * sh.Dv, sh.Dv}, gi{dout, sh.H * sh.Dv, sh.Dv};
  const AttnOut oo{o, sh.H * sh.Dv, sh.Dv}, dqo{dq, sh.H * sh.Dqk, sh.Dqk}, dko{dk, sh.H * sh.Dqk, sh.Dqk},
      dvo{dv, sh.H * sh.Dv, sh.Dv};
  auto fwd = [=] { flash_attention_forward(s, qi, ki, vi, oo, lse, nullptr); };
  auto bwd = [=] { flash_attention_backward(s, qi, ki, vi, oi, gi, lse, dqo, dko, dvo, ws, nullptr); };
  fwd();
  bwd();
  check_finite("O", o, rows * sh.H * sh.Dv, count);
  check_finite("lse", lse, sh.B * sh.H * sh.T, count);
  check_finite("dQ", dq, rows * sh.H * sh.Dqk, count);
  check_finite("dK", dk, rows * sh.H * sh.Dqk, count);
  check_finite("dV", dv, rows * sh.H * sh.Dv, count);
  w->pass["fwd"] = fwd;
  w->pass["bwd"] = bwd;  // backward reads forward's O and lse, which stay valid
  w->pass["fwd+bwd"] = [=] { fwd(); bwd(); };

  // The variants, each run once on poisoned outputs before timing: finite everywhere and within kVariantTol of the
  // public functions' (variant 0's) outputs, kept as references; otherwise the case is skipped with the reason.
  // Forward variants first, then variant 0's O and lse are put back for the backward variants.
  const auto copy = [](void* dst, const void* src, int64_t bytes) {
    CUDA_CHECK(cudaMemcpy(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice));
  };
  const int64_t o_bytes = sizeof(bf16) * rows * sh.H * sh.Dv, lse_bytes = sizeof(float) * sh.B * sh.H * sh.T;
  const int64_t qk_bytes = sizeof(bf16) * rows * sh.H * sh.Dqk;
  bf16* o_ref = p.alloc<bf16>(rows * sh.H * sh.Dv);
  float* lse_ref = p.alloc<float>(sh.B * sh.H * sh.T);
  bf16 *dq_ref = p.alloc<bf16>(rows * sh.H * sh.Dqk), *dk_ref = p.alloc<bf16>(rows * sh.H * sh.Dqk);
  bf16* dv_ref = p.alloc<bf16>(rows * sh.H * sh.Dv);
  auto* partial = p.alloc<double>(2 * kDiffBlocks);
  copy(o_ref, o, o_bytes);
  copy(lse_ref, lse, lse_bytes);
  copy(dq_ref, dq, qk_bytes);
  copy(dk_ref, dk, qk_bytes);
  copy(dv_ref, dv, o_bytes);
  for (int id = 0; id < attn_detail::kForwardVariants; ++id) {
    const std::string key = fmt::format("fwd@v{}", id);
    w->pass[key] = [=] { attn_detail::flash_attention_forward_variant(id, s, qi, ki, vi, oo, lse, nullptr); };
    try {
      CUDA_CHECK(cudaMemset(o, 0xFF, static_cast<size_t>(o_bytes)));
      CUDA_CHECK(cudaMemset(lse, 0xFF, static_cast<size_t>(lse_bytes)));
      w->pass[key]();
      check_finite("O", o, rows * sh.H * sh.Dv, count);
      check_finite("lse", lse, sh.B * sh.H * sh.T, count);
      check_close("O", o, o_ref, rows * sh.H * sh.Dv, kVariantTol, partial);
      check_close("lse", lse, lse_ref, sh.B * sh.H * sh.T, kVariantTol, partial);
    } catch (const Error& e) {
      w->broken[key] = e.what();
    }
  }
  copy(o, o_ref, o_bytes);
  copy(lse, lse_ref, lse_bytes);
  for (int id = 0; id < attn_detail::kBackwardVariants; ++id) {
    const std::string key = fmt::format("bwd@v{}", id);
    w->pass[key] = [=] {
      attn_detail::flash_attention_backward_variant(id, s, qi, ki, vi, oi, gi, lse, dqo, dko, dvo, ws, nullptr);
    };
    try {
      CUDA_CHECK(cudaMemset(dq, 0xFF, static_cast<size_t>(qk_bytes)));
      CUDA_CHECK(cudaMemset(dk, 0xFF, static_cast<size_t>(qk_bytes)));
      CUDA_CHECK(cudaMemset(dv, 0xFF, static_cast<size_t>(o_bytes)));
      w->pass[key]();
      check_finite("dQ", dq, rows * sh.H * sh.Dqk, count);
      check_finite("dK", dk, rows * sh.H * sh.Dqk, count);
      check_finite("dV", dv, rows * sh.H * sh.Dv, count);
      check_close("dQ", dq, dq_ref, rows * sh.H * sh.Dqk, kVariantTol, partial);
      check_close("dK", dk, dk_ref, rows * sh.H * sh.Dqk, kVariantTol, partial);
      check_close("dV", dv, dv_ref, rows * sh.H * sh.Dv, kVariantTol, partial);
    } catch (const Error& e) {
      w->broken[key] = e.what();
    }
  }
  CUDA_CHECK(cudaDeviceSynchronize());
  return w;
}

// The workload of the last case run: the passes of one shape follow each other.
std::string g_workload_key;
std::unique_ptr<Workload> g_workload;

Workload& workload_for(const Case& c) {
  const std::string key = c.gemm ? "gemm" : c.shape.name;
  if (g_workload && g_workload_key == key) return *g_workload;
  g_workload.reset();  // free the previous shape's memory first
  g_workload_key.clear();
  g_workload = c.gemm ? build_gemm() : build_attention(c.shape);
  g_workload_key = key;
  return *g_workload;
}

// ---- running ------------------------------------------------------------------------------------------------------

std::map<std::string, std::vector<double>> g_seconds;  // per case: one entry per timed iteration
std::map<std::string, bool> g_ok;

double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void run_case(benchmark::State& state, const Case* c) {
  std::vector<double>& seconds = g_seconds[c->name()];
  seconds.clear();
  g_ok[c->name()] = false;
  try {
    Workload& w = workload_for(*c);
    const auto broken = w.broken.find(c->key());
    if (broken != w.broken.end()) {
      state.SkipWithError(broken->second.c_str());
      return;
    }
    const std::function<void()>& launch = w.pass.at(c->key());
    launch();  // warm-up
    CUDA_CHECK(cudaDeviceSynchronize());
    bench::EventTimer timer;
    for (auto _ : state) {
      const double s = timer.time(1, nullptr, [&](int) { launch(); });
      state.SetIterationTime(s);
      seconds.push_back(s);
    }
    g_ok[c->name()] = true;
    const double med = median(seconds);
    state.counters["TFLOP/s"] = med > 0 ? c->flops() / med * 1e-12 : 0.0;
  } catch (const std::exception& e) {
    g_workload.reset();
    g_workload_key.clear();
    state.SkipWithError(e.what());
  }
}

// ---- summary ------------------------------------------------------------------------------------------------------

struct Row {
  const Case* c;
  double us = 0, tflops = 0, fraction_of_gemm = NAN;
  double speedup_vs_v0 = NAN;  // variant rows: tflops over variant 0's of the same pass and shape
};

std::vector<Row> summarize() {
  std::vector<Row> rows;
  double gemm_tflops = NAN;
  for (const Case& c : g_cases) {
    auto it = g_seconds.find(c.name());
    if (it == g_seconds.end() || !g_ok[c.name()] || it->second.empty()) continue;
    Row r{&c};
    r.us = median(it->second) * 1e6;
    r.tflops = c.flops() / r.us * 1e-6;
    if (c.gemm) gemm_tflops = r.tflops;
    rows.push_back(r);
  }
  for (Row& r : rows) {
    r.fraction_of_gemm = r.tflops / gemm_tflops;
    if (r.c->variant < 0) continue;
    for (const Row& base : rows)
      if (base.c->variant == 0 && base.c->pass == r.c->pass && std::string(base.c->shape.name) == r.c->shape.name)
        r.speedup_vs_v0 = r.tflops / base.tflops;
  }
  return rows;
}

void print_table(const std::vector<Row>& rows) {
  fmt::print("\n{:<16} | {:<30} | {:>10} | {:>8} | {:>6} | {:>5}\n", "case", "shape", "us", "TFLOP/s", "x gemm",
             "x v0");
  fmt::print("{:-<16}-+-{:-<30}-+-{:->10}-+-{:->8}-+-{:->6}-+-{:->5}\n", "", "", "", "", "", "");
  std::vector<double> fractions;
  bool variants = false;
  for (const Row& r : rows) {
    const std::string ratio = r.c->gemm                       ? std::string("ceil.")
                              : std::isnan(r.fraction_of_gemm) ? std::string("-")
                                                               : fmt::format("{:.2f}", r.fraction_of_gemm);
    const std::string vs_v0 = std::isnan(r.speedup_vs_v0) ? std::string("-") : fmt::format("{:.2f}", r.speedup_vs_v0);
    fmt::print("{:<16} | {:<30} | {:>10.1f} | {:>8.1f} | {:>6} | {:>5}\n", r.c->gemm ? "gemm_bf16" : r.c->key(),
               r.c->shape_text(), r.us, r.tflops, ratio, vs_v0);
    if (!r.c->gemm && r.c->variant < 0 && r.fraction_of_gemm > 0) fractions.push_back(r.fraction_of_gemm);
    variants = variants || r.c->variant >= 0;
  }
  if (!fractions.empty())
    fmt::print("geomean: {:.2f} x the BF16 GEMM's TFLOP/s over {} attention cases (public functions)\n",
               bench::geomean(fractions), fractions.size());
  if (variants) {
    for (int v = 0; v < attn_detail::kForwardVariants; ++v)
      fmt::print("fwd@v{}: {}\n", v, attn_detail::forward_variant_summary(v));
    for (int v = 0; v < attn_detail::kBackwardVariants; ++v)
      fmt::print("bwd@v{}: {}\n", v, attn_detail::backward_variant_summary(v));
  }
}

// The /bench/attention table: bench_util.cuh's columns (case = pass, pass@v<N> or gemm_bf16, shape, recipe "bf16",
// time_us, tflops; gbps, fraction_of_copy_bw and speedup NaN), then pass, B, T, H, dqk, dv, fraction_of_gemm,
// variant (-1 for the public functions and the GEMM), speedup_vs_v0.
Table result_table(const std::vector<Row>& rows) {
  Table t = bench::bench_table();
  t.add_column("pass", ColumnType::str)
      .add_column("B", ColumnType::i64)
      .add_column("T", ColumnType::i64)
      .add_column("H", ColumnType::i64)
      .add_column("dqk", ColumnType::i64)
      .add_column("dv", ColumnType::i64)
      .add_column("fraction_of_gemm", ColumnType::f64)
      .add_column("variant", ColumnType::i64)
      .add_column("speedup_vs_v0", ColumnType::f64);
  const double not_measured = NAN;
  for (const Row& r : rows) {
    const Case& c = *r.c;
    t.add_row({c.gemm ? std::string("gemm_bf16") : c.key(), c.shape_text(), std::string("bf16"), r.us, r.tflops,
               not_measured, not_measured, not_measured, c.pass, c.shape.B, c.shape.T, c.shape.H, c.shape.Dqk,
               c.shape.Dv, r.fraction_of_gemm, static_cast<int64_t>(c.variant), r.speedup_vs_v0});
  }
  t.set_attribute("variant", "kernel variant of the pass (kernels/attention/flash_attention_variants.h); -1: the "
                             "public functions (variant 0's kernels)");
  t.set_attribute("speedup_vs_v0", "variant rows: tflops over variant 0's of the same pass and shape; else NaN");
  t.set_attribute("time_us", "median over the timed iterations of one pass (CUDA events), microseconds");
  t.set_attribute("tflops", "causal: fwd 2 B H T (T+1)/2 (dqk + dv), bwd 2.5x fwd, fwd+bwd 3.5x fwd, over time_us; "
                            "gemm_bf16 2 n^3");
  t.set_attribute("fraction_of_gemm", "tflops over the cuBLASLt BF16 GEMM's (8192^3) measured in the same run");
  t.set_attribute("gbps", "not measured (NaN)");
  t.set_attribute("speedup", "NaN: the ratios to the PyTorch peer (benchmarks/peers/attention_torch.py) are computed "
                             "from its table /bench/attention_torch");
  t.set_attribute("min_time_s", kMinTimeS);
  return t;
}

}  // namespace
}  // namespace fp4moe::bench_attn

int main(int argc, char** argv) {
  using namespace fp4moe;
  using namespace fp4moe::bench_attn;
  const std::string command = command_line(argc, argv);
  const std::string h5_path = bench::take_h5_flag(argc, argv);
  const bool listing = bench::has_flag(argc, argv, "--benchmark_list_tests");
  define_cases();
  for (const auto& c : g_cases)
    benchmark::RegisterBenchmark(c.name().c_str(), [&c](benchmark::State& st) { run_case(st, &c); })
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond)
        ->MinTime(kMinTimeS);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  if (listing) {
    benchmark::RunSpecifiedBenchmarks();
    return 0;
  }
  const std::string why = why_no_cuda_device();
  if (!why.empty()) {
    std::fprintf(stderr, "bench_attention: %s: the attention benchmarks need a Hopper GPU\n", why.c_str());
    return 1;
  }
  try {
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    cudaDeviceProp p{};
    CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
    FP4MOE_CHECK(p.major == 9, "the kernels are built for sm_90a (Hopper); device {} is {} (sm_{}{})", dev, p.name,
                 p.major, p.minor);
    fmt::print("bench_attention on {}: min time {} s per case\n", p.name, kMinTimeS);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_attention: %s\n", e.what());
    return 1;
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  g_workload.reset();
  const std::vector<Row> rows = summarize();
  print_table(rows);
  int rc = 0;
  for (const auto& [name, ok] : g_ok)
    if (!ok) rc = 1;
  if (!h5_path.empty() &&
      bench::write_bench_result("bench_attention", h5_path, "attention", result_table(rows), command) != 0)
    rc = 1;
  return rc;
}
