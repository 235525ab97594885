// bench_grouped_gemm: the grouped expert GEMMs of kernels/gemm/grouped_gemm.h (Fprop, Dgrad, Wgrad; BF16 and
// block-scaled FP8) against the same library's dense GEMM over the same total tokens (one group, the ceiling).
//
//   bench_grouped_gemm [Google Benchmark flags, e.g. --benchmark_filter=fp8]
//
// Shapes: DeepSeek-V3 routed experts, fused gate/up (N = 4096, K = 7168) and down (N = 7168, K = 2048), 16384
// routed tokens per GPU split over 8 experts (about 2048 each) or 32 experts (about 512 each); the split is
// seeded, ragged (+-25 %, sizes not multiples of 4) and never empty. Operands: seeded random codes and power-of-two
// scales (FP8), seeded random values (BF16), never zeros; weights alone exceed twice the 60 MB L2 except for the
// 32 x 512 down case (117 MB), so launches read from HBM.
// Timing: CUDA events around one grouped call (all its cuBLASLt launches), Google Benchmark's manual time, after a
// warm-up call that also fills the plan cache. FLOPs: 2 * M * N * K with M the routed tokens.
// After the run: `case | shape | us | TFLOP/s | x dense` (x dense: TFLOP/s over the dense GEMM's of the same
// recipe, op and shape measured in the same run) with a geometric-mean summary.
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/common/check.h"
#include "kernels/common/types.h"
#include "kernels/formats/formats.h"
#include "kernels/gemm/grouped_gemm.h"
#include "kernels/quant/layouts.h"

namespace fp4moe::bench_gemm {
namespace {

constexpr double kMinTimeS = 0.05;
constexpr int64_t kTokens = 16384;

// ---- device inputs ----------------------------------------------------------------------------------------------

__global__ void fill_codes_kernel(uint8_t* p, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    uint8_t c = static_cast<uint8_t>(mix64(seed ^ static_cast<uint64_t>(i)) >> 56);
    p[i] = (c & 0x7F) == 0x7F ? 0x38 : c;  // any finite E4M3 code (NaN -> 1.0)
  }
}
__global__ void fill_scales_kernel(float* p, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    p[i] = exp2_exact(static_cast<int>(mix64(seed ^ static_cast<uint64_t>(i)) % 9) - 6);
}
__global__ void fill_bf16_kernel(bf16* p, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    p[i] = __float2bfloat16_rn(2.0f * uniform_from_counter(seed, static_cast<uint64_t>(i)) - 1.0f);
}

unsigned grid_for(int64_t n) { return static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 65536)); }

// Device allocations of one case, freed together.
class Pool {
 public:
  ~Pool() {
    for (void* p : ptrs_) cudaFree(p);
  }
  template <typename T>
  T* alloc(int64_t count) {
    void* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(T)));
    ptrs_.push_back(p);
    return static_cast<T*>(p);
  }
  uint8_t* codes(int64_t n, uint64_t seed) {
    uint8_t* p = alloc<uint8_t>(n);
    fill_codes_kernel<<<grid_for(n), 256>>>(p, n, seed);
    CUDA_CHECK_LAUNCH();
    return p;
  }
  float* scales(int64_t n, uint64_t seed) {
    float* p = alloc<float>(n);
    fill_scales_kernel<<<grid_for(n), 256>>>(p, n, seed);
    CUDA_CHECK_LAUNCH();
    return p;
  }
  bf16* values(int64_t n, uint64_t seed) {
    bf16* p = alloc<bf16>(n);
    fill_bf16_kernel<<<grid_for(n), 256>>>(p, n, seed);
    CUDA_CHECK_LAUNCH();
    return p;
  }

 private:
  std::vector<void*> ptrs_;
};

// ---- cases --------------------------------------------------------------------------------------------------------

struct Case {
  std::string op, recipe, shape;  // op: fprop/dgrad/wgrad; recipe: bf16/fp8; shape: "up E8" etc.
  int64_t N = 0, K = 0, G = 0;
  bool dense = false;
  std::string name() const { return fmt::format("{}/{}/{}{}", op, recipe, shape, dense ? "/dense" : ""); }
};

// Ragged sizes around kTokens / G (+-25 %), summing to kTokens, none empty.
std::vector<int32_t> ragged_split(int64_t G, uint64_t seed) {
  std::vector<int32_t> sizes(G);
  int64_t left = kTokens;
  for (int64_t g = 0; g < G; ++g) {
    const int64_t base = kTokens / G, jitter = base / 4;
    int64_t s = base - jitter + static_cast<int64_t>(mix64(seed + g) % static_cast<uint64_t>(2 * jitter + 1));
    if (g == G - 1) s = left;
    sizes[g] = static_cast<int32_t>(s);
    left -= s;
  }
  return sizes;
}

// One grouped call of the case, ready to launch repeatedly.
struct Workload {
  Pool pool;
  GroupedGemm gemm;
  std::vector<int32_t> host_offsets;
  GroupSplit split;
  std::function<void()> launch;
  int64_t flops = 0;
};

std::unique_ptr<Workload> build(const Case& c) {
  auto w = std::make_unique<Workload>();
  const std::vector<int32_t> sizes = c.dense ? std::vector<int32_t>{static_cast<int32_t>(kTokens)}
                                             : ragged_split(c.G, static_cast<uint64_t>(c.G * 1000 + c.N));
  const int64_t G = static_cast<int64_t>(sizes.size()), N = c.N, K = c.K;
  w->host_offsets.assign(G + 1, 0);
  for (int64_t g = 0; g < G; ++g) w->host_offsets[g + 1] = w->host_offsets[g] + sizes[g];
  const int64_t M = w->host_offsets[G];
  int32_t* d_offsets = w->pool.alloc<int32_t>(G + 1);
  CUDA_CHECK(cudaMemcpy(d_offsets, w->host_offsets.data(), sizeof(int32_t) * (G + 1), cudaMemcpyHostToDevice));
  w->split = GroupSplit{d_offsets, w->host_offsets.data(), G};
  w->flops = 2 * M * N * K;
  Pool& p = w->pool;
  GroupedGemm& gemm = w->gemm;
  const GroupSplit split = w->split;
  if (c.recipe == "bf16") {
    if (c.op == "fprop") {
      bf16 *x = p.values(M * K, 1), *wt = p.values(G * N * K, 2);
      GemmOutput y{p.alloc<bf16>(M * N), GemmOutType::bf16, false};
      w->launch = [=, &gemm] { gemm.fprop_bf16(x, wt, N, K, split, y, nullptr); };
    } else if (c.op == "dgrad") {
      bf16 *dy = p.values(M * N, 3), *wt = p.values(G * N * K, 2);
      GemmOutput dx{p.alloc<bf16>(M * K), GemmOutType::bf16, false};
      w->launch = [=, &gemm] { gemm.dgrad_bf16(dy, wt, N, K, split, dx, nullptr); };
    } else {
      bf16 *dy = p.values(M * N, 3), *x = p.values(M * K, 1);
      GemmOutput dw{p.alloc<float>(G * N * K), GemmOutType::fp32, true};
      CUDA_CHECK(cudaMemset(dw.data, 0, sizeof(float) * G * N * K));
      w->launch = [=, &gemm] { gemm.wgrad_bf16(dy, x, N, K, split, dw, nullptr); };
    }
  } else {
    if (c.op == "fprop") {
      Fp8RowOperand x{p.codes(M * K, 4), p.scales(fp8_row_scale_count(M, K), 5)};
      Fp8BlockStack wt{p.codes(G * N * K, 6), p.scales(G * fp8_block_scale_count(N, K), 7)};
      GemmOutput y{p.alloc<bf16>(M * N), GemmOutType::bf16, false};
      gemm.reserve(M, K, N, G);
      w->launch = [=, &gemm] { gemm.fprop_fp8(x, wt, N, K, split, y, nullptr); };
    } else if (c.op == "dgrad") {
      Fp8RowOperand dy{p.codes(M * N, 8), p.scales(fp8_row_scale_count(M, N), 9)};
      Fp8BlockStack wt{p.codes(G * N * K, 6), p.scales(G * fp8_block_scale_count(K, N), 7)};
      GemmOutput dx{p.alloc<bf16>(M * K), GemmOutType::bf16, false};
      gemm.reserve(M, N, K, G);
      w->launch = [=, &gemm] { gemm.dgrad_fp8(dy, wt, N, K, split, dx, nullptr); };
    } else {
      Fp8ColOperand dy{p.codes(fp8_col_codes_capacity(M, N, G), 10), p.scales(fp8_col_scales_capacity(M, N, G), 11)};
      Fp8ColOperand x{p.codes(fp8_col_codes_capacity(M, K, G), 12), p.scales(fp8_col_scales_capacity(M, K, G), 13)};
      GemmOutput dw{p.alloc<float>(G * N * K), GemmOutType::fp32, true};
      CUDA_CHECK(cudaMemset(dw.data, 0, sizeof(float) * G * N * K));
      w->launch = [=, &gemm] { gemm.wgrad_fp8(dy, x, N, K, split, dw, nullptr); };
    }
  }
  CUDA_CHECK(cudaDeviceSynchronize());
  return w;
}

std::vector<Case> g_cases;
struct Measured {
  bool ok = false;
  double seconds = 0;
  int64_t calls = 0, flops = 0, heuristic_queries = 0, fallbacks = 0;
};
std::map<std::string, Measured> g_measured;

void define_cases() {
  struct Shape {
    const char* name;
    int64_t N, K;
  };
  for (const char* op : {"fprop", "dgrad", "wgrad"})
    for (const char* recipe : {"bf16", "fp8"})
      for (Shape s : {Shape{"up", 4096, 7168}, Shape{"down", 7168, 2048}}) {
        for (int64_t G : {8, 32})
          g_cases.push_back(Case{op, recipe, fmt::format("{} {}x{}", s.name, G, kTokens / G), s.N, s.K, G, false});
        g_cases.push_back(Case{op, recipe, fmt::format("{} 1x{}", s.name, kTokens), s.N, s.K, 1, true});
      }
}

void run_case(benchmark::State& state, const Case* c) {
  Measured& m = g_measured[c->name()];
  m = Measured{};
  std::unique_ptr<Workload> w;
  cudaEvent_t start = nullptr, stop = nullptr;
  try {
    w = build(*c);
    w->launch();  // warm-up: plans and scratch
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    for (auto _ : state) {
      CUDA_CHECK(cudaEventRecord(start, nullptr));
      w->launch();
      CUDA_CHECK(cudaEventRecord(stop, nullptr));
      CUDA_CHECK(cudaEventSynchronize(stop));
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      state.SetIterationTime(ms * 1e-3);
      m.seconds += ms * 1e-3;
      ++m.calls;
    }
    m.flops = w->flops;
    m.heuristic_queries = w->gemm.lt().heuristic_queries();
    m.fallbacks = w->gemm.lt().exact_shape_fallbacks();
    m.ok = true;
    state.counters["TFLOP/s"] = m.seconds > 0 ? static_cast<double>(m.flops) * m.calls / m.seconds * 1e-12 : 0.0;
    state.counters["heuristic_queries"] = static_cast<double>(m.heuristic_queries);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
  if (start) cudaEventDestroy(start);
  if (stop) cudaEventDestroy(stop);
}

double geomean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += std::log(x);
  return v.empty() ? NAN : std::exp(s / static_cast<double>(v.size()));
}

void print_table() {
  fmt::print("\n{:<22} | {:<14} | {:>9} | {:>8} | {:>7}\n", "case", "shape", "us", "TFLOP/s", "x dense");
  fmt::print("{:-<22}-+-{:-<14}-+-{:->9}-+-{:->8}-+-{:->7}\n", "", "", "", "", "");
  std::vector<double> ratios;
  for (const Case& c : g_cases) {
    auto it = g_measured.find(c.name());
    if (it == g_measured.end() || !it->second.ok || it->second.calls == 0) continue;
    const Measured& m = it->second;
    const double us = m.seconds / static_cast<double>(m.calls) * 1e6;
    const double tflops = static_cast<double>(m.flops) / us * 1e-6;
    double ratio = NAN;
    if (!c.dense)
      for (const Case& d : g_cases) {
        auto jt = g_measured.find(d.name());
        if (d.dense && d.op == c.op && d.recipe == c.recipe && d.N == c.N && d.K == c.K && jt != g_measured.end() &&
            jt->second.ok && jt->second.calls > 0) {
          const double dense_tflops = static_cast<double>(jt->second.flops) * jt->second.calls / jt->second.seconds * 1e-12;
          ratio = tflops / dense_tflops;
        }
      }
    fmt::print("{:<22} | {:<14} | {:>9.1f} | {:>8.1f} | {:>7}\n", fmt::format("{} {}", c.op, c.recipe), c.shape, us,
               tflops, c.dense ? "ceiling" : (std::isnan(ratio) ? "-" : fmt::format("{:.2f}", ratio)));
    if (!std::isnan(ratio)) ratios.push_back(ratio);
  }
  fmt::print("geomean: {:.2f} x dense over {} grouped cases\n", geomean(ratios), ratios.size());
}

}  // namespace
}  // namespace fp4moe::bench_gemm

int main(int argc, char** argv) {
  using namespace fp4moe::bench_gemm;
  bool listing = false;
  for (int i = 1; i < argc; ++i) listing = listing || std::string(argv[i]).rfind("--benchmark_list_tests", 0) == 0;
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
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "bench_grouped_gemm: no CUDA device: the grouped GEMM benchmarks need a Hopper GPU\n");
    return 1;
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  print_table();
  int rc = 0;
  for (const auto& [name, m] : g_measured)
    if (!m.ok) rc = 1;
  return rc;
}
