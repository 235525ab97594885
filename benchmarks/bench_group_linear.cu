// bench_group_linear: the Group Linear layer of trainer/model/group_linear.h (the routed experts' linear layer) in
// its three recipes, forward, backward and forward+backward, against the dense cuBLASLt FP8 GEMMs of the same
// tokens measured in the same run.
//
//   bench_group_linear [--all] [--list_splits] [--h5 PATH] [Google Benchmark flags, e.g. --benchmark_filter=v3_fc1]
//
// Layers (DeepSeek-V3 and V2 routed experts): v3_fc1 K=7168 -> N=4096 (fused gate+up), v3_fc2 K=2048 -> N=7168,
// v2_fc1 K=5120 -> N=3072, v2_fc2 K=1536 -> N=5120. Experts per GPU x routed tokens per GPU: the default run takes
// {8, 32} x {16384}; --all the whole grid {8, 16, 32} x {16384, 32768, 65536}. Splits: `balanced` (equal groups)
// and `zipf` (group sizes proportional to 1/rank, ranks a fixed permutation of the experts; zipf_split below,
// integer arithmetic so that benchmarks/peers/group_linear_torch.py reproduces it exactly; --list_splits prints
// every split of the grid and exits, no GPU needed).
// Case names: <pass>/<recipe>/<layer>/e<experts>/t<tokens>/<split>, pass fwd, bwd or fwd+bwd; the dense ceiling is
// <pass>_dense/fp8/<layer>/e1/t<tokens>/dense (the same GEMMs over one group of all tokens, operands already FP8).
//
// Inputs, as the layer receives them in training: bf16 and fp8 take BF16 X; mxfp4 takes X as MXFP4, quantized once
// before timing (bf16_to_mxfp4_row), as after an FP4 dispatch. Weights are quantized once (set_weights, once per
// optimizer step) outside the timed region; the activation and gradient quantizations are inside it. dY is BF16.
// Seeded values with the spread of bench_util.cuh; the working set of every pass (weights, activations, outputs)
// exceeds twice the 60 MB L2, so no input rotation.
// Check: one forward+backward per workload on outputs poisoned with NaN; Y, dX and dW must be finite everywhere and
// mostly nonzero, else the case fails (GPU correctness itself is tests/gemm/test_group_linear_gpu.cpp).
// Timing: CUDA events around one pass per iteration (Google Benchmark manual time, at least kMinTimeS), after a
// warm-up pass; the tables report the median iteration. FLOPs: fwd 2 M N K, bwd 4 M N K (Dgrad and Wgrad),
// fwd+bwd 6 M N K, M the routed tokens (conversions add no FLOPs).
// After the run: `case | shape | recipe | us | TFLOP/s | x fp8 | x bf16 | x dense | held MiB` with geometric-mean
// summaries, and with --h5 the table /bench/group_linear (columns in result_table below).
#include <benchmark/benchmark.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "benchmarks/bench_util.cuh"
#include "kernels/common/check.h"
#include "kernels/common/types.h"
#include "kernels/formats/formats.h"
#include "kernels/gemm/grouped_gemm.h"
#include "kernels/quant/bf16_to_mxfp4_row.h"
#include "kernels/quant/layouts.h"
#include "trainer/model/group_linear.h"

namespace fp4moe::bench_gl {
namespace {

constexpr double kMinTimeS = 0.05;
constexpr uint64_t kZipfUnit = uint64_t{1} << 40;  // weight of rank 0; rank r weighs kZipfUnit / (r + 1)

// ---- shapes and splits --------------------------------------------------------------------------------------------

struct Layer {
  const char* name;
  int64_t N, K;
};
constexpr Layer kLayers[] = {{"v3_fc1", 4096, 7168}, {"v3_fc2", 7168, 2048}, {"v2_fc1", 3072, 5120},
                             {"v2_fc2", 5120, 1536}};

// Balanced: tokens / G each, the first tokens % G groups one more.
std::vector<int64_t> balanced_split(int64_t G, int64_t tokens) {
  std::vector<int64_t> s(G, tokens / G);
  for (int64_t g = 0; g < tokens % G; ++g) ++s[g];
  return s;
}

// Zipf (exponent 1): expert g has rank r(g) = (7 g + 3) mod G (a permutation for G not a multiple of 7) and weight
// w = floor(2^40 / (r + 1)); size = floor(tokens w / sum w), the remaining tokens one each to the largest
// remainders (ties: lower g first), then every empty group takes one token from the largest. Integers only, so
// that the PyTorch peer computes the same sizes.
std::vector<int64_t> zipf_split(int64_t G, int64_t tokens) {
  FP4MOE_CHECK(G >= 1 && G % 7 != 0 && tokens >= G, "zipf_split: expected G >= 1 not a multiple of 7 and tokens >= G, "
               "got G={} tokens={}", G, tokens);
  std::vector<uint64_t> w(G);
  uint64_t total = 0;
  for (int64_t g = 0; g < G; ++g) total += w[g] = kZipfUnit / static_cast<uint64_t>((7 * g + 3) % G + 1);
  std::vector<int64_t> s(G);
  std::vector<uint64_t> rem(G);
  int64_t left = tokens;
  for (int64_t g = 0; g < G; ++g) {
    const unsigned __int128 p = static_cast<unsigned __int128>(tokens) * w[g];
    s[g] = static_cast<int64_t>(p / total);
    rem[g] = static_cast<uint64_t>(p % total);
    left -= s[g];
  }
  std::vector<int64_t> order(G);
  for (int64_t g = 0; g < G; ++g) order[g] = g;
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return rem[a] > rem[b]; });
  for (int64_t i = 0; i < left; ++i) ++s[order[i]];
  for (int64_t g = 0; g < G; ++g)
    if (s[g] == 0) {
      ++s[g];
      --s[std::max_element(s.begin(), s.end()) - s.begin()];
    }
  return s;
}

std::vector<int64_t> split_sizes(const std::string& split, int64_t G, int64_t tokens) {
  if (split == "zipf") return zipf_split(G, tokens);
  if (split == "balanced" || split == "dense") return balanced_split(G, tokens);
  FP4MOE_CHECK(false, "unknown split '{}' (expected balanced, zipf or dense)", split);
  return {};
}

// ---- cases --------------------------------------------------------------------------------------------------------

constexpr const char* kPasses[] = {"fwd", "bwd", "fwd+bwd"};

struct Case {
  std::string pass;    // fwd, bwd, fwd+bwd
  std::string recipe;  // bf16, fp8, mxfp4 (the dense ceiling: fp8)
  Layer layer;
  int64_t G = 0, tokens = 0;
  std::string split;   // balanced, zipf, dense
  bool dense = false;
  std::string table_case() const { return pass + (dense ? "_dense" : ""); }
  std::string shape() const { return fmt::format("{} e{} t{} {}", layer.name, G, tokens, split); }
  std::string name() const {
    return fmt::format("{}/{}/{}/e{}/t{}/{}", table_case(), recipe, layer.name, G, tokens, split);
  }
  // The workload a case runs on: the three passes of one configuration share it.
  std::string workload_key() const { return fmt::format("{}/{}/{}/{}/{}/{}", dense, recipe, layer.name, G, tokens, split); }
  int64_t flops() const {
    const int64_t mnk = 2 * tokens * layer.N * layer.K;
    return pass == "fwd" ? mnk : pass == "bwd" ? 2 * mnk : 3 * mnk;
  }
};

std::vector<Case> g_cases;

void define_cases(bool all) {
  const std::vector<int64_t> experts = all ? std::vector<int64_t>{8, 16, 32} : std::vector<int64_t>{8, 32};
  const std::vector<int64_t> tokens = all ? std::vector<int64_t>{16384, 32768, 65536} : std::vector<int64_t>{16384};
  for (const Layer& l : kLayers)
    for (int64_t t : tokens) {
      for (int64_t G : experts)
        for (const char* split : {"balanced", "zipf"})
          for (const char* recipe : {"bf16", "fp8", "mxfp4"})
            for (const char* pass : kPasses) g_cases.push_back(Case{pass, recipe, l, G, t, split, false});
      for (const char* pass : kPasses) g_cases.push_back(Case{pass, "fp8", l, 1, t, "dense", true});
    }
}

// ---- device inputs and checks -------------------------------------------------------------------------------------

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

// counts[0] += elements that are NaN or +-Inf, counts[1] += nonzero elements.
template <typename T>
__global__ void count_values_kernel(const T* p, int64_t n, unsigned long long* counts) {
  unsigned long long bad = 0, nonzero = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const float v = static_cast<float>(p[i]);
    bad += !isfinite(v);
    nonzero += v != 0.0f;
  }
  if (bad) atomicAdd(&counts[0], bad);
  if (nonzero) atomicAdd(&counts[1], nonzero);
}

unsigned grid_for(int64_t n) { return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((n + 255) / 256, 65536))); }

// Rejects (fp4moe::Error) a tensor with a NaN/Inf element (an unwritten element of a NaN-poisoned output, or an
// overflow) or with at most half of its elements nonzero.
template <typename T>
void check_output(const char* what, const T* p, int64_t n, unsigned long long* d_counts) {
  CUDA_CHECK(cudaMemset(d_counts, 0, 2 * sizeof(unsigned long long)));
  count_values_kernel<T><<<grid_for(n), 256>>>(p, n, d_counts);
  CUDA_CHECK_LAUNCH();
  unsigned long long h[2] = {0, 0};
  CUDA_CHECK(cudaMemcpy(h, d_counts, sizeof(h), cudaMemcpyDeviceToHost));
  FP4MOE_CHECK(h[0] == 0 && 2 * h[1] > static_cast<unsigned long long>(n),
               "output check: {} has {} NaN/Inf elements and {} nonzero of {} (expected all finite, mostly nonzero)",
               what, h[0], h[1], n);
}

// ---- workloads ----------------------------------------------------------------------------------------------------

// One configuration ready to run its three passes repeatedly.
struct Workload {
  bench::DevicePool pool;
  std::unique_ptr<GroupLinear> layer;  // layer cases
  std::unique_ptr<GroupedGemm> gemm;   // dense cases
  std::vector<int32_t> host_offsets;
  GroupSplit split;
  std::map<std::string, std::function<void()>> pass;  // "fwd", "bwd", "fwd+bwd"
  double held_bytes = NAN, weight_copy_bytes = NAN;
};


std::unique_ptr<Workload> build(const Case& c) {
  auto w = std::make_unique<Workload>();
  const int64_t N = c.layer.N, K = c.layer.K;
  const std::vector<int64_t> sizes = split_sizes(c.split, c.G, c.tokens);
  const int64_t G = c.G;
  w->host_offsets.assign(G + 1, 0);
  for (int64_t g = 0; g < G; ++g) w->host_offsets[g + 1] = w->host_offsets[g] + static_cast<int32_t>(sizes[g]);
  const int64_t M = w->host_offsets[G];
  bench::DevicePool& p = w->pool;
  int32_t* d_offsets = p.alloc<int32_t>(G + 1);
  CUDA_CHECK(cudaMemcpy(d_offsets, w->host_offsets.data(), sizeof(int32_t) * (G + 1), cudaMemcpyHostToDevice));
  w->split = GroupSplit{d_offsets, w->host_offsets.data(), G};
  const GroupSplit split = w->split;
  auto* counts = p.alloc<unsigned long long>(2);

  if (c.dense) {  // the ceiling: FP8 GEMMs alone over one group, operands seeded E4M3 codes and power-of-two scales
    w->gemm = std::make_unique<GroupedGemm>();
    GroupedGemm& gemm = *w->gemm;
    auto codes = [&](int64_t n, uint64_t seed) {
      uint8_t* q = p.alloc<uint8_t>(n);
      fill_codes_kernel<<<grid_for(n), 256>>>(q, n, seed);
      CUDA_CHECK_LAUNCH();
      return q;
    };
    auto scales = [&](int64_t n, uint64_t seed) {
      float* q = p.alloc<float>(n);
      fill_scales_kernel<<<grid_for(n), 256>>>(q, n, seed);
      CUDA_CHECK_LAUNCH();
      return q;
    };
    const Fp8RowOperand x{codes(M * K, 1), scales(fp8_row_scale_count(M, K), 2)};
    const Fp8BlockStack wt{codes(N * K, 3), scales(fp8_block_scale_count(N, K), 4)};
    const Fp8RowOperand dy{codes(M * N, 5), scales(fp8_row_scale_count(M, N), 6)};
    const Fp8BlockStack wtt{codes(N * K, 7), scales(fp8_block_scale_count(K, N), 8)};
    const Fp8ColOperand dyc{codes(fp8_col_codes_capacity(M, N, 1), 9), scales(fp8_col_scales_capacity(M, N, 1), 10)};
    const Fp8ColOperand xc{codes(fp8_col_codes_capacity(M, K, 1), 11), scales(fp8_col_scales_capacity(M, K, 1), 12)};
    bf16* y = p.alloc<bf16>(M * N);
    bf16* dx = p.alloc<bf16>(M * K);
    float* dw = p.alloc<float>(N * K);
    CUDA_CHECK(cudaMemset(y, 0xFF, sizeof(bf16) * M * N));  // NaN poison
    CUDA_CHECK(cudaMemset(dx, 0xFF, sizeof(bf16) * M * K));
    CUDA_CHECK(cudaMemset(dw, 0, sizeof(float) * N * K));
    gemm.reserve(M, std::max(N, K), std::max(N, K), 1);
    auto fwd = [=, &gemm] { gemm.fprop_fp8(x, wt, N, K, split, GemmOutput{y, GemmOutType::bf16, false}, nullptr); };
    auto bwd = [=, &gemm] {
      gemm.dgrad_fp8(dy, wtt, N, K, split, GemmOutput{dx, GemmOutType::bf16, false}, nullptr);
      gemm.wgrad_fp8(dyc, xc, N, K, split, GemmOutput{dw, GemmOutType::fp32, true}, nullptr);
    };
    fwd();
    bwd();
    check_output("dense Y", y, M * N, counts);
    check_output("dense dX", dx, M * K, counts);
    check_output("dense dW", dw, N * K, counts);
    w->pass["fwd"] = fwd;
    w->pass["bwd"] = bwd;
    w->pass["fwd+bwd"] = [=] { fwd(); bwd(); };
    CUDA_CHECK(cudaDeviceSynchronize());
    return w;
  }

  const Recipe recipe = parse_recipe(c.recipe, "recipe");
  bf16* wt = p.alloc<bf16>(G * N * K);
  bench::fill_bf16_random(wt, G * N, K, 101, bench::weight_spread());
  bf16* x = p.alloc<bf16>(M * K);
  bench::fill_bf16_random(x, M, K, 102, bench::activation_spread());
  bf16* dy = p.alloc<bf16>(M * N);
  bench::fill_bf16_random(dy, M, N, 103, bench::Spread{1.0f, -2, 2, 0, 1.0f});
  bf16* y = p.alloc<bf16>(M * N);
  bf16* dx = p.alloc<bf16>(M * K);
  float* dw = p.alloc<float>(G * N * K);
  GroupLinearInput in{};
  if (recipe == Recipe::mxfp4) {  // as after an FP4 dispatch: quantized once, outside the timed region
    in.mx_codes = p.alloc<uint8_t>(M * K / 2);
    in.mx_scales = p.alloc<uint8_t>(M * K / kMxBlock);
    bf16_to_mxfp4_row(x, M, K, const_cast<uint8_t*>(in.mx_codes), const_cast<uint8_t*>(in.mx_scales), MxQuantConfig{},
                      nullptr, nullptr);
  } else {
    in.x = x;
  }
  w->layer = std::make_unique<GroupLinear>(G, N, K, recipe, nullptr);
  GroupLinear& layer = *w->layer;
  layer.set_weights(wt, nullptr);  // once per optimizer step: outside the timed region
  CUDA_CHECK(cudaMemset(y, 0xFF, sizeof(bf16) * M * N));  // NaN poison
  CUDA_CHECK(cudaMemset(dx, 0xFF, sizeof(bf16) * M * K));
  CUDA_CHECK(cudaMemset(dw, 0, sizeof(float) * G * N * K));
  auto fwd = [=, &layer] { layer.forward(in, split, y, nullptr); };
  auto bwd = [=, &layer] { layer.backward(in, dy, split, dx, dw, nullptr); };
  fwd();
  bwd();
  check_output("Y", y, M * N, counts);
  check_output("dX", dx, M * K, counts);
  check_output("dW", dw, G * N * K, counts);
  w->held_bytes = static_cast<double>(layer.held_activation_bytes());
  w->weight_copy_bytes = static_cast<double>(GroupLinear::weight_copy_bytes(recipe, G, N, K));
  w->pass["fwd"] = fwd;
  w->pass["bwd"] = bwd;  // the layer keeps the forward above: backward may run again and again
  w->pass["fwd+bwd"] = [=] { fwd(); bwd(); };
  CUDA_CHECK(cudaDeviceSynchronize());
  return w;
}

// The workload of the last case run (the passes of one configuration are registered one after the other).
std::string g_workload_key;
std::unique_ptr<Workload> g_workload;

Workload& workload_for(const Case& c) {
  if (g_workload && g_workload_key == c.workload_key()) return *g_workload;
  g_workload.reset();  // free the previous configuration's memory first
  g_workload_key.clear();
  g_workload = build(c);
  g_workload_key = c.workload_key();
  return *g_workload;
}

struct Measured {
  bool ok = false;
  std::vector<double> seconds;  // one per timed iteration
  double held_bytes = NAN, weight_copy_bytes = NAN;
};
std::map<std::string, Measured> g_measured;

double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void run_case(benchmark::State& state, const Case* c) {
  Measured& m = g_measured[c->name()];
  m = Measured{};
  try {
    Workload& w = workload_for(*c);
    const std::function<void()>& launch = w.pass.at(c->pass);
    launch();  // warm-up
    CUDA_CHECK(cudaDeviceSynchronize());
    bench::EventTimer timer;
    for (auto _ : state) {
      const double s = timer.time(1, nullptr, [&](int) { launch(); });
      state.SetIterationTime(s);
      m.seconds.push_back(s);
    }
    m.held_bytes = w.held_bytes;
    m.weight_copy_bytes = w.weight_copy_bytes;
    m.ok = true;
    const double med = median(m.seconds);
    state.counters["TFLOP/s"] = med > 0 ? static_cast<double>(c->flops()) / med * 1e-12 : 0.0;
    if (!std::isnan(m.held_bytes)) state.counters["held_MiB"] = m.held_bytes / (1 << 20);
  } catch (const std::exception& e) {
    g_workload.reset();
    g_workload_key.clear();
    state.SkipWithError(e.what());
  }
}

// ---- summary ------------------------------------------------------------------------------------------------------

struct Row {
  const Case* c;
  double us = 0, tflops = 0;
  double over_fp8 = NAN, over_bf16 = NAN;  // time of the fp8 (bf16) recipe over this row's, same pass and shape
  double fraction_of_dense = NAN;          // TFLOP/s over the dense FP8 GEMMs' of the same pass, layer and tokens
  double held_bytes = NAN, weight_copy_bytes = NAN;
};

std::vector<Row> summarize() {
  std::vector<Row> rows;
  for (const Case& c : g_cases) {
    auto it = g_measured.find(c.name());
    if (it == g_measured.end() || !it->second.ok || it->second.seconds.empty()) continue;
    Row r{&c};
    r.us = median(it->second.seconds) * 1e6;
    r.tflops = static_cast<double>(c.flops()) / r.us * 1e-6;
    r.held_bytes = it->second.held_bytes;
    r.weight_copy_bytes = it->second.weight_copy_bytes;
    rows.push_back(r);
  }
  for (Row& r : rows) {
    if (r.c->dense) continue;
    for (const Row& o : rows) {
      const Case &c = *r.c, &d = *o.c;
      if (d.pass != c.pass || std::string(d.layer.name) != c.layer.name || d.tokens != c.tokens) continue;
      if (d.dense) r.fraction_of_dense = r.tflops / o.tflops;
      if (!d.dense && d.G == c.G && d.split == c.split) {
        if (d.recipe == "fp8") r.over_fp8 = o.us / r.us;
        if (d.recipe == "bf16") r.over_bf16 = o.us / r.us;
      }
    }
  }
  return rows;
}

std::string cell(double v, const char* spec = "{:.2f}") {
  return std::isnan(v) ? std::string("-") : fmt::format(fmt::runtime(spec), v);
}

void print_table(const std::vector<Row>& rows) {
  fmt::print("\n{:<13} | {:<26} | {:<6} | {:>9} | {:>8} | {:>6} | {:>6} | {:>7} | {:>8}\n", "case", "shape", "recipe",
             "us", "TFLOP/s", "x fp8", "x bf16", "x dense", "held MiB");
  fmt::print("{:-<13}-+-{:-<26}-+-{:-<6}-+-{:->9}-+-{:->8}-+-{:->6}-+-{:->6}-+-{:->7}-+-{:->8}\n", "", "", "", "", "", "",
             "", "", "");
  std::map<std::string, std::vector<double>> over_fp8, over_bf16;
  for (const Row& r : rows) {
    fmt::print("{:<13} | {:<26} | {:<6} | {:>9.1f} | {:>8.1f} | {:>6} | {:>6} | {:>7} | {:>8}\n", r.c->table_case(),
               r.c->shape(), r.c->recipe, r.us, r.tflops, cell(r.over_fp8), cell(r.over_bf16),
               r.c->dense ? std::string("ceiling") : cell(r.fraction_of_dense), cell(r.held_bytes / (1 << 20), "{:.0f}"));
    if (r.c->recipe == "mxfp4" && !std::isnan(r.over_fp8)) over_fp8[r.c->pass].push_back(r.over_fp8);
    if (r.c->recipe == "mxfp4" && !std::isnan(r.over_bf16)) over_bf16[r.c->pass].push_back(r.over_bf16);
  }
  for (const char* pass : kPasses)
    if (!over_fp8[pass].empty())
      fmt::print("geomean {:<7}: mxfp4 {:.3f}x fp8, {:.3f}x bf16 over {} configurations\n", pass,
                 bench::geomean(over_fp8[pass]), bench::geomean(over_bf16[pass]), over_fp8[pass].size());
}

// The /bench/group_linear table: bench_util.cuh's columns (case = pass, "_dense" appended for the ceiling; shape
// "<layer> e<experts> t<tokens> <split>"; recipe bf16/fp8/mxfp4; speedup = time of the fp8 recipe over this row's),
// then pass, layer, experts, tokens, split, n, k, speedup_vs_bf16, fraction_of_dense, held_bytes, weight_copy_bytes.
Table result_table(const std::vector<Row>& rows) {
  Table t = bench::bench_table();
  t.add_column("pass", ColumnType::str)
      .add_column("layer", ColumnType::str)
      .add_column("experts", ColumnType::i64)
      .add_column("tokens", ColumnType::i64)
      .add_column("split", ColumnType::str)
      .add_column("n", ColumnType::i64)
      .add_column("k", ColumnType::i64)
      .add_column("speedup_vs_bf16", ColumnType::f64)
      .add_column("fraction_of_dense", ColumnType::f64)
      .add_column("held_bytes", ColumnType::f64)
      .add_column("weight_copy_bytes", ColumnType::f64);
  const double not_measured = NAN;  // gbps and fraction_of_copy_bw do not apply
  for (const Row& r : rows) {
    const Case& c = *r.c;
    t.add_row({c.table_case(), c.shape(), c.recipe, r.us, r.tflops, not_measured, not_measured, r.over_fp8, c.pass,
               std::string(c.layer.name), c.G, c.tokens, c.split, c.layer.N, c.layer.K, r.over_bf16,
               r.fraction_of_dense, r.held_bytes, r.weight_copy_bytes});
  }
  t.set_attribute("time_us", "median over the timed iterations of one pass (CUDA events), microseconds");
  t.set_attribute("tflops", "fwd 2 M N K, bwd 4 M N K, fwd+bwd 6 M N K over time_us; M = tokens");
  t.set_attribute("speedup", "time of the fp8 recipe over this row's, same pass and shape (NaN on dense rows)");
  t.set_attribute("speedup_vs_bf16", "time of the bf16 recipe over this row's, same pass and shape (NaN on dense rows)");
  t.set_attribute("fraction_of_dense",
                  "TFLOP/s over that of the dense cuBLASLt FP8 GEMMs of the same pass, layer and tokens (one group, "
                  "operands already FP8) measured in the same run (NaN on dense rows)");
  t.set_attribute("held_bytes",
                  "activation bytes kept from forward to backward (GroupLinear::held_activation_bytes): bf16 the BF16 "
                  "X, fp8 the FP8 column copy of X, mxfp4 the MXFP4 X (NaN on dense rows)");
  t.set_attribute("weight_copy_bytes", "FP8 copies of W and W^T held for the whole step (0 for bf16; NaN on dense "
                                       "rows)");
  t.set_attribute("inputs", "bf16/fp8: BF16 X; mxfp4: MXFP4 X quantized before timing (as after an FP4 dispatch); "
                            "weights quantized before timing (once per optimizer step); dY BF16");
  t.set_attribute("shape", "layers v3_fc1 K=7168 N=4096, v3_fc2 K=2048 N=7168, v2_fc1 K=5120 N=3072, v2_fc2 K=1536 "
                           "N=5120; e<experts> t<routed tokens> <split>: balanced, zipf (1/rank), dense (one group)");
  t.set_attribute("gbps", "not measured (NaN)");
  t.set_attribute("min_time_s", kMinTimeS);
  return t;
}

// Removes `flag` from argv; true when it was there.
bool take_flag(int& argc, char** argv, const char* flag) {
  bool found = false;
  int out = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == flag) found = true;
    else argv[out++] = argv[i];
  }
  argc = out;
  return found;
}

// Every split of the full grid, one line each: "e<G> t<tokens> <split>: size size ...".
void print_splits() {
  for (int64_t G : {8, 16, 32})
    for (int64_t t : {16384, 32768, 65536})
      for (const char* split : {"balanced", "zipf"})
        fmt::print("e{} t{} {}: {}\n", G, t, split, fmt::join(split_sizes(split, G, t), " "));
}

}  // namespace
}  // namespace fp4moe::bench_gl

int main(int argc, char** argv) {
  using namespace fp4moe;
  using namespace fp4moe::bench_gl;
  bool all = false;
  bench::Program program;
  program.name = "bench_group_linear";
  program.needs = "the Group Linear benchmarks";
  program.help.summary =
      "the Group Linear layer (trainer/model/group_linear.h) in its three recipes, forward, backward and "
      "forward+backward, against the dense cuBLASLt FP8 GEMMs of the same tokens measured in the same run";
  program.help.flags = {
      {"--all", "the whole grid: {8, 16, 32} experts x {16384, 32768, 65536} routed tokens (default {8, 32} x 16384)"},
      {"--list_splits", "print the group sizes of every split of the grid and exit (no GPU needed)"}};
  program.help.example = "--benchmark_filter=v3_fc1";
  program.min_time_s = kMinTimeS;
  program.take_flags = [&all](int& argc, char** argv) {
    all = take_flag(argc, argv, "--all");
    if (take_flag(argc, argv, "--list_splits")) {
      print_splits();
      return 0;
    }
    return -1;
  };
  program.cases = [&all] {
    define_cases(all);
    return bench::case_names(g_cases);
  };
  program.run_case = [](benchmark::State& st, size_t i) { run_case(st, &g_cases[i]); };
  program.report = [](const std::string& h5_path, const std::string& command) {
    g_workload.reset();
    const std::vector<Row> rows = summarize();
    print_table(rows);
    int rc = std::all_of(g_measured.begin(), g_measured.end(), [](const auto& kv) { return kv.second.ok; }) ? 0 : 1;
    if (!h5_path.empty() &&
        bench::write_bench_result("bench_group_linear", h5_path, "group_linear", result_table(rows), command) != 0)
      rc = 1;
    return rc;
  };
  return bench::run_program(argc, argv, program);
}
