// bench_attention: the causal attention core (kernels/attention/flash_attention.h), forward, backward and
// forward+backward, on our kernels and, where this build has cuDNN, on the cuDNN backend (kernels/attention/
// cudnn_sdpa.h: cuDNN's fused flash attention, its non-deterministic and its deterministic backward), against a
// dense cuBLASLt BF16 GEMM measured in the same run (the tensor-core ceiling).
//
//   bench_attention [--h5 PATH] [Google Benchmark flags, e.g. --benchmark_filter=mla]
//
// Shapes: `mla` B=1 T=4096 H=128, Dqk/Dv = 192/128 (DeepSeek-V2/V3 attention at their 4096-token sequences, the v2,
// v3 and v3_layer configs; on an H200 the sm90 forward and the sm90 backward of attention_heuristics.h);
// `small` B=8 T=1024 H=12, 96/64 (the small and dense_small configs; the key64 forward and column_split backward);
// `tiny` B=4 T=64 H=4, 32/16 (the tiny config). Case names [<backend>/]<pass>/<shape>: pass fwd, bwd or fwd+bwd; no
// prefix for our kernels as flash_attention_forward picks them (the program prints the forward it picks per shape),
// key32/ for our key32 forward named through flash_attention_forward_with (fwd only, at the shapes it is built for:
// the mma.sync kernel beside the rule's), role_split/ for the rule's forward with the role_split backward named through
// flash_attention_backward_with (bwd and fwd+bwd, at the shapes it is built for: on an H200 the mma.sync dQ kernel
// beside the sm90 ones), sm90_dq/ for the rule's forward with the sm90_dq backward named (role_split's dK/dV kernel and
// the sm90 dQ kernel: the previous rule; bwd and fwd+bwd, at the shapes it is built for, on a device of compute
// capability 9.0), cudnn/ for the cuDNN backend with its non-deterministic backward, cudnn_det/
// with its deterministic backward (bwd and fwd+bwd only: the forward is the same); the ceiling is
// gemm_bf16/8192x8192x8192 (cuBLASLt, BF16 in and out, FP32 accumulation). Without cuDNN in the build the cuDNN cases
// are left out (the program says so).
// FLOPs (causal, the convention of FlashAttention's benchmarks): forward 2 B H T (T+1)/2 (Dqk + Dv) (the two
// products over the visible half of the score matrix), backward 2.5x forward, forward+backward 3.5x forward. Our
// backward actually runs 7 products instead of 5 (the scores and dP are recomputed for dQ: no atomics), which the
// convention does not count.
// Inputs: q, k, v, dO seeded N(0, 1) BF16, dense [B*T, H, D]; one copy (every pass is compute-bound and the mla
// tensors alone exceed the L2 many times over). Check before timing: one forward and backward on NaN-poisoned
// outputs; O, lse, dQ, dK, dV must be finite everywhere (correctness itself is tests/attention/
// test_attention_gpu.cpp and test_cudnn_sdpa_gpu.cpp). The cuDNN backend's workspace (the larger of its forward and
// backward plans') comes from the case's pool, allocated once; its plans are built before timing.
// Timing: CUDA events around one pass per iteration after a warm-up pass (Google Benchmark manual time, at least
// kMinTimeS); the tables report the median iteration.
// After the run: `case | shape | us | TFLOP/s | x gemm | x cudnn | ws MiB` (x gemm: TFLOP/s over the GEMM's; x cudnn:
// over the cuDNN backend's for the same pass and shape, its non-deterministic backward; ws: the cuDNN workspace), and
// with --h5 the table /bench/attention (bench_util.cuh's columns, then pass, backend, B, T, H, dqk, dv,
// fraction_of_gemm, fraction_of_cudnn, workspace_bytes). The PyTorch peer (torch SDPA on the same shapes) is
// benchmarks/peers/attention_torch.py.
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "benchmarks/bench_util.cuh"
#include "kernels/attention/cudnn_sdpa.h"
#include "kernels/attention/flash_attention.h"
#include "kernels/common/check.h"
#include "kernels/common/types.h"
#include "kernels/gemm/cublaslt_matmul.h"

namespace fp4moe::bench_attn {
namespace {

constexpr double kMinTimeS = 0.05;
constexpr int64_t kGemmSize = 8192;

// ---- cases --------------------------------------------------------------------------------------------------------

struct Shape {
  const char* name;
  int64_t B, T, H, Dqk, Dv;
};
constexpr Shape kShapes[] = {
    {"mla", 1, 4096, 128, 192, 128}, {"small", 8, 1024, 12, 96, 64}, {"tiny", 4, 64, 4, 32, 16}};
constexpr const char* kPasses[] = {"fwd", "bwd", "fwd+bwd"};

// Who runs the attention: our kernels (both passes by the rule; the key32 forward named; the rule's forward and the
// role_split or the sm90_dq backward named), or the cuDNN backend with its non-deterministic or deterministic backward.
enum class Backend { own, key32, role_split, sm90_dq, cudnn, cudnn_det };
const char* backend_name(Backend b) {
  return b == Backend::own          ? "own"
         : b == Backend::key32      ? "key32"
         : b == Backend::role_split ? "role_split"
         : b == Backend::sm90_dq    ? "sm90_dq"
         : b == Backend::cudnn      ? "cudnn"
                                    : "cudnn_det";
}
// The backward variant a backend names (flash_attention_backward_with), for those that name one.
attn::BwdKernels named_backward(Backend b) {
  return b == Backend::sm90_dq ? attn::BwdKernels::sm90_dq : attn::BwdKernels::role_split;
}
bool names_backward(Backend b) { return b == Backend::role_split || b == Backend::sm90_dq; }
bool is_cudnn(Backend b) { return b == Backend::cudnn || b == Backend::cudnn_det; }

struct Case {
  std::string pass;  // fwd, bwd, fwd+bwd; "gemm_bf16" for the ceiling
  Shape shape{};
  Backend backend = Backend::own;
  bool gemm = false;
  std::string shape_text() const {
    return gemm ? fmt::format("{0}x{0}x{0}", kGemmSize)
                : fmt::format("{} B{} T{} H{} {}/{}", shape.name, shape.B, shape.T, shape.H, shape.Dqk, shape.Dv);
  }
  // The table's case column: the pass, prefixed by the cuDNN backend.
  std::string label() const {
    return gemm ? "gemm_bf16" : backend == Backend::own ? pass : std::string(backend_name(backend)) + "/" + pass;
  }
  std::string name() const { return gemm ? "gemm_bf16/" + shape_text() : label() + "/" + shape.name; }
  double flops() const {
    if (gemm) return 2.0 * kGemmSize * kGemmSize * kGemmSize;
    const double fwd = 2.0 * shape.B * shape.H * (shape.T * (shape.T + 1) / 2.0) * (shape.Dqk + shape.Dv);
    return pass == "fwd" ? fwd : pass == "bwd" ? 2.5 * fwd : 3.5 * fwd;
  }
};

std::vector<Case> g_cases;

void define_cases() {
  for (const Shape& s : kShapes)
    for (Backend b : {Backend::own, Backend::key32, Backend::role_split, Backend::sm90_dq, Backend::cudnn,
                      Backend::cudnn_det}) {
      if (is_cudnn(b) && !cudnn_sdpa_built()) continue;
      if (b == Backend::key32 && !attn::forward_kernel_builds(attn::FwdKernel::key32, s.Dqk, s.Dv)) continue;
      if (names_backward(b) && !attn::backward_kernels_build(named_backward(b), s.Dqk, s.Dv)) continue;
      for (const char* pass : kPasses) {
        const bool fwd = std::string(pass) == "fwd";
        if (((b == Backend::cudnn_det || names_backward(b)) && fwd) || (b == Backend::key32 && !fwd)) continue;
        g_cases.push_back(Case{pass, s, b, false});
      }
    }
  g_cases.push_back(Case{"gemm_bf16", Shape{}, Backend::own, true});
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

struct Workload {
  bench::DevicePool pool;
  std::unique_ptr<CublasLtMatmul> lt;
  std::unique_ptr<CudnnSdpa> sdpa;
  int64_t workspace_bytes = 0;  // the cuDNN backend's
  std::map<std::string, std::function<void()>> pass;
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

std::unique_ptr<Workload> build_attention(const Shape& sh, Backend backend) {
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
  auto* count = p.alloc<unsigned long long>(1);
  const AttnIn qi{q, sh.H * sh.Dqk, sh.Dqk}, ki{k, sh.H * sh.Dqk, sh.Dqk}, vi{v, sh.H * sh.Dv, sh.Dv};
  const AttnIn oi{o, sh.H * sh.Dv, sh.Dv}, gi{dout, sh.H * sh.Dv, sh.Dv};
  const AttnOut oo{o, sh.H * sh.Dv, sh.Dv}, dqo{dq, sh.H * sh.Dqk, sh.Dqk}, dko{dk, sh.H * sh.Dqk, sh.Dqk},
      dvo{dv, sh.H * sh.Dv, sh.Dv};
  std::function<void()> fwd, bwd;
  if (!is_cudnn(backend)) {
    void* ws = p.alloc<unsigned char>(flash_attention_backward_workspace_bytes(s));
    if (backend == Backend::key32)
      fwd = [=] { flash_attention_forward_with(attn::FwdKernel::key32, s, qi, ki, vi, oo, lse, nullptr); };
    else fwd = [=] { flash_attention_forward(s, qi, ki, vi, oo, lse, nullptr); };
    if (names_backward(backend))
      bwd = [=, kernels = named_backward(backend)] {
        flash_attention_backward_with(kernels, s, qi, ki, vi, oi, gi, lse, dqo, dko, dvo, ws, nullptr);
      };
    else bwd = [=] { flash_attention_backward(s, qi, ki, vi, oi, gi, lse, dqo, dko, dvo, ws, nullptr); };
  } else {
    const bool det = backend == Backend::cudnn_det;
    w->sdpa = std::make_unique<CudnnSdpa>();
    CudnnSdpa* sdpa = w->sdpa.get();
    const SdpaLayout layout = SdpaLayout::dense(s);  // builds both plans
    const int64_t bytes = std::max(sdpa->forward_workspace_bytes(s, layout), sdpa->backward_workspace_bytes(s, layout, det));
    void* ws = p.alloc<unsigned char>(bytes);
    w->workspace_bytes = bytes;
    fwd = [=] { sdpa->forward(s, qi, ki, vi, oo, lse, ws, bytes, nullptr); };
    bwd = [=] { sdpa->backward(s, qi, ki, vi, oi, gi, lse, dqo, dko, dvo, det, ws, bytes, nullptr); };
  }
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
  CUDA_CHECK(cudaDeviceSynchronize());
  return w;
}

// The workload of the last case run: the passes of one shape and backend follow each other.
std::string g_workload_key;
std::unique_ptr<Workload> g_workload;

Workload& workload_for(const Case& c) {
  const std::string key = c.gemm ? "gemm" : fmt::format("{}/{}", c.shape.name, backend_name(c.backend));
  if (g_workload && g_workload_key == key) return *g_workload;
  g_workload.reset();  // free the previous shape's memory first
  g_workload_key.clear();
  g_workload = c.gemm ? build_gemm() : build_attention(c.shape, c.backend);
  g_workload_key = key;
  return *g_workload;
}

// ---- running ------------------------------------------------------------------------------------------------------

std::map<std::string, std::vector<double>> g_seconds;  // per case: one entry per timed iteration
std::map<std::string, bool> g_ok;
std::map<std::string, int64_t> g_workspace;  // per case: the cuDNN backend's workspace bytes (0 for ours)

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
    const std::function<void()>& launch = w.pass.at(c->pass);
    g_workspace[c->name()] = w.workspace_bytes;
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
  double us = 0, tflops = 0, fraction_of_gemm = NAN, fraction_of_cudnn = NAN;
  int64_t workspace_bytes = 0;
};

std::vector<Row> summarize() {
  std::vector<Row> rows;
  double gemm_tflops = NAN;
  std::map<std::string, double> cudnn_tflops;  // per "pass/shape": the cuDNN backend's (non-deterministic backward)
  for (const Case& c : g_cases) {
    auto it = g_seconds.find(c.name());
    if (it == g_seconds.end() || !g_ok[c.name()] || it->second.empty()) continue;
    Row r{&c};
    r.us = median(it->second) * 1e6;
    r.tflops = c.flops() / r.us * 1e-6;
    r.workspace_bytes = g_workspace[c.name()];
    if (c.gemm) gemm_tflops = r.tflops;
    if (!c.gemm && c.backend == Backend::cudnn) cudnn_tflops[c.pass + "/" + c.shape.name] = r.tflops;
    rows.push_back(r);
  }
  for (Row& r : rows) {
    r.fraction_of_gemm = r.tflops / gemm_tflops;
    if (r.c->gemm || r.c->backend == Backend::cudnn) continue;  // the GEMM's case has no shape name
    const auto peer = cudnn_tflops.find(r.c->pass + "/" + r.c->shape.name);
    if (peer != cudnn_tflops.end()) r.fraction_of_cudnn = r.tflops / peer->second;
  }
  return rows;
}

std::string ratio_text(double x) { return std::isnan(x) ? std::string("-") : fmt::format("{:.2f}", x); }

void print_table(const std::vector<Row>& rows) {
  fmt::print("\n{:<20} | {:<30} | {:>10} | {:>8} | {:>6} | {:>7} | {:>8}\n", "case", "shape", "us", "TFLOP/s", "x gemm",
             "x cudnn", "ws MiB");
  fmt::print("{:-<20}-+-{:-<30}-+-{:->10}-+-{:->8}-+-{:->6}-+-{:->7}-+-{:->8}\n", "", "", "", "", "", "", "");
  std::vector<double> fractions, own_vs_cudnn;
  for (const Row& r : rows) {
    const bool cudnn = !r.c->gemm && is_cudnn(r.c->backend);
    fmt::print("{:<20} | {:<30} | {:>10.1f} | {:>8.1f} | {:>6} | {:>7} | {:>8}\n", r.c->label(), r.c->shape_text(),
               r.us, r.tflops, r.c->gemm ? std::string("ceil.") : ratio_text(r.fraction_of_gemm),
               ratio_text(r.fraction_of_cudnn),
               cudnn ? fmt::format("{:.1f}", static_cast<double>(r.workspace_bytes) / (1 << 20)) : std::string("-"));
    if (!r.c->gemm && r.c->backend == Backend::own && r.fraction_of_gemm > 0) fractions.push_back(r.fraction_of_gemm);
    if (!r.c->gemm && r.c->backend == Backend::own && r.fraction_of_cudnn > 0)
      own_vs_cudnn.push_back(r.fraction_of_cudnn);
  }
  if (!fractions.empty())
    fmt::print("geomean: {:.2f} x the BF16 GEMM's TFLOP/s over {} cases of our kernels\n", bench::geomean(fractions),
               fractions.size());
  if (!own_vs_cudnn.empty())
    fmt::print("geomean: our kernels at {:.2f} x the cuDNN backend's TFLOP/s over {} cases\n",
               bench::geomean(own_vs_cudnn), own_vs_cudnn.size());
}

// The /bench/attention table: bench_util.cuh's columns (case = the pass, cudnn/<pass> or cudnn_det/<pass>, or
// gemm_bf16; shape, recipe "bf16", time_us, tflops; gbps, fraction_of_copy_bw and speedup NaN), then pass, backend,
// B, T, H, dqk, dv, fraction_of_gemm, fraction_of_cudnn, workspace_bytes.
Table result_table(const std::vector<Row>& rows) {
  Table t = bench::bench_table();
  t.add_column("pass", ColumnType::str)
      .add_column("backend", ColumnType::str)
      .add_column("B", ColumnType::i64)
      .add_column("T", ColumnType::i64)
      .add_column("H", ColumnType::i64)
      .add_column("dqk", ColumnType::i64)
      .add_column("dv", ColumnType::i64)
      .add_column("fraction_of_gemm", ColumnType::f64)
      .add_column("fraction_of_cudnn", ColumnType::f64)
      .add_column("workspace_bytes", ColumnType::i64);
  const double not_measured = NAN;
  for (const Row& r : rows) {
    const Case& c = *r.c;
    t.add_row({c.label(), c.shape_text(), std::string("bf16"), r.us, r.tflops, not_measured, not_measured,
               not_measured, c.pass, std::string(c.gemm ? "cublaslt" : backend_name(c.backend)), c.shape.B, c.shape.T,
               c.shape.H, c.shape.Dqk, c.shape.Dv, r.fraction_of_gemm, r.fraction_of_cudnn, r.workspace_bytes});
  }
  t.set_attribute("time_us", "median over the timed iterations of one pass (CUDA events), microseconds");
  t.set_attribute("tflops", "causal: fwd 2 B H T (T+1)/2 (dqk + dv), bwd 2.5x fwd, fwd+bwd 3.5x fwd, over time_us; "
                            "gemm_bf16 2 n^3");
  t.set_attribute("fraction_of_gemm", "tflops over the cuBLASLt BF16 GEMM's (8192^3) measured in the same run");
  t.set_attribute("fraction_of_cudnn", "tflops over the cuDNN backend's (non-deterministic backward) for the same "
                                       "pass and shape in the same run; NaN for that backend's own rows and without "
                                       "cuDNN");
  t.set_attribute("backend", "own: our kernels as flash_attention_forward/backward pick them (flash_attention.h); "
                             "key32: our key32 forward named (flash_attention_forward_with); role_split: the rule's forward and "
                             "the role_split backward named (flash_attention_backward_with); sm90_dq: the rule's "
                             "forward and the sm90_dq backward named; cudnn, cudnn_det: "
                             "cuDNN's fused attention (cudnn_sdpa.h), non-deterministic or deterministic backward; "
                             "cublaslt: the ceiling");
  t.set_attribute("workspace_bytes", "the cuDNN backend's workspace (the larger of its forward and backward plans'); "
                                     "0 for our kernels");
  t.set_attribute("cudnn", cudnn_sdpa_version_text());
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
  bench::Program program;
  program.name = "bench_attention";
  program.needs = "the attention benchmarks";
  program.help.summary =
      "causal attention (kernels/attention), forward, backward and forward+backward, on our kernels and on cuDNN's "
      "fused attention (where built), at the MLA shape (B1 T4096 H128, 192/128) and the small (B8 T1024 H12, 96/64) "
      "and tiny (B4 T64 H4, 32/16) configs', against a cuBLASLt BF16 GEMM measured in the same run";
  program.help.example = "--benchmark_filter=mla";
  program.min_time_s = kMinTimeS;
  program.cases = [] {
    define_cases();
    return bench::case_names(g_cases);
  };
  program.run_case = [](benchmark::State& st, size_t i) { run_case(st, &g_cases[i]); };
  program.on_device = [](int, const cudaDeviceProp& p) {
    fmt::print("bench_attention on {}: min time {} s per case; cuDNN backend: {}\n", p.name, kMinTimeS,
               cudnn_sdpa_built() ? cudnn_sdpa_version_text() : "left out (" + cudnn_sdpa_version_text() + ")");
    for (const Shape& s : kShapes)
      fmt::print("  {}: our forward is the {} kernel, our backward the {} kernels\n", s.name,
                 attn::forward_kernel_name(flash_attention_forward_kernel(s.Dqk, s.Dv)),
                 attn::backward_kernels_name(flash_attention_backward_kernels(s.Dqk, s.Dv)));
  };
  program.report = [](const std::string& h5_path, const std::string& command) {
    g_workload.reset();
    const std::vector<Row> rows = summarize();
    print_table(rows);
    int rc = std::all_of(g_ok.begin(), g_ok.end(), [](const auto& kv) { return kv.second; }) ? 0 : 1;
    if (!h5_path.empty() &&
        bench::write_bench_result("bench_attention", h5_path, "attention", result_table(rows), command) != 0)
      rc = 1;
    return rc;
  };
  return bench::run_program(argc, argv, program);
}
