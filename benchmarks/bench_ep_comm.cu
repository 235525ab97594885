// bench_ep_comm: the all-to-all traffic of the expert-parallel MoE layer (trainer/model/moe_expert_parallel.h over
// trainer/comm/ep_exchange.h) per routed-experts recipe (bf16, fp8, mxfp4) at the DeepSeek-V3 and V2 hidden sizes
// (7168, 5120), beside the formats' arithmetic, and its time over NCCL at world size 1.
//
//   bench_ep_comm [--h5 PATH] [Google Benchmark flags, e.g. --benchmark_filter=^sim_ranks/v3/]
//
// Cases <kind>/<shape>/<recipe>:
//   sim_ranks  one forward + backward of the layer over 8 simulated ranks (InProcessTransport: 8 host threads on one
//              GPU, trainer/comm/in_process_transport.h; NOT an interconnect), 512 tokens per rank (4096 over the
//              group: one V3 micro-batch). Counted per exchange (counts, dispatch, combine, dispatch_gradient,
//              combine_gradient; ep_exchange.h) over the group: the bytes the transport copied (InProcessGroup::
//              take_exchange_rounds: its own count, where the copies are issued), the layer's own count (EpExchange::
//              bytes, summed over the ranks) and the formats' arithmetic (expert_parallel_row_bytes,
//              trainer/memory/estimate.h: every routed (token, expert) row moves once per payload direction; the
//              counts exchange 4 E_l bytes per ordered pair of ranks, itself included). The three must agree, else
//              the case fails. Also the dispatch payload the layer's buffers hold per routed token
//              (MoeRoutedExperts::dispatch_bytes: what `fp4moe train` writes as the dispatch_* attributes of
//              /memory/<run>), as the table's case trainer_buffers. The case's Google Benchmark time is the host's
//              wall time of the simulated step (8 ranks share one GPU): no speed, left out of the table.
//   nccl_ws1   the same layer over NCCL at world size 1 (NcclComm::single_rank, NcclTransport), 4096 tokens (V3's
//              tokens per micro-batch on one GPU): the CUDA-event time of each exchange (EpExchange::set_timing) per
//              layer forward + backward; the case's time is their sum, the all-to-all time per layer. At world size
//              1 every row goes to the rank itself and NCCL copies it locally: no interconnect is crossed, so these
//              times are a floor of an expert-parallel all-to-all's, not an estimate of one. Beside each exchange a
//              device-to-device cudaMemcpyAsync of the same bytes, timed in the same run (the copy ceiling).
// The probe layer: top-k 8 (V3's; V2 routes 6: the bytes per routed token do not depend on k), 16 routed experts of
// FFN width 256 (the exchange does not depend on the width), no shared expert, the v3 router choosing on its own;
// weights from ParamStore::init, tokens and output gradients seeded BF16 N(0, 1) (ep_traffic.h EpLayerProbe).
// After the run: `case | shape | recipe | direction | B/routed token | formats | wire share | us | x copy`, and with
// --h5 the table /bench/ep_comm (columns in result_table below). Exit code 1 when a case failed (a disagreement
// of the counts included).
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "benchmarks/bench_util.cuh"
#include "kernels/common/check.h"
#include "trainer/comm/ep_exchange.h"
#include "trainer/comm/nccl_transport.h"
#include "trainer/config.h"
#include "trainer/model/ep_traffic.h"
#include "trainer/model/recipe.h"

namespace fp4moe::bench_ep {
namespace {

constexpr double kMinTimeS = 0.2;
constexpr int kSimRanks = 8;
constexpr int64_t kSimTokensPerRank = 512;  // 4096 over the 8 ranks
constexpr int64_t kWs1Tokens = 4096;        // configs/v3.toml: seq_len 4096 x micro_batch 1
constexpr int64_t kTopK = 8, kExperts = 16, kExpertFfn = 256;
constexpr int kCopyLaunches = 20;  // copies timed per direction for the ceiling
constexpr uint64_t kSeed = 1234;   // weights, tokens and output gradients (EpLayerProbe)

struct Shape {
  const char* name;
  int64_t hidden;
};
constexpr Shape kShapes[] = {{"v3", 7168}, {"v2", 5120}};
const char* const kRecipes[] = {"bf16", "fp8", "mxfp4"};

// The table's directions: the layer's exchanges in the order a forward + backward makes them (EpExchangeKind),
// then their sum.
constexpr int kDirections = kEpExchangeKinds + 1;
const char* direction_name(int i) {
  return i < kEpExchangeKinds ? ep_exchange_kind_name(static_cast<EpExchangeKind>(i)) : "all";
}

struct Case {
  std::string kind;  // sim_ranks | nccl_ws1
  Shape shape;
  std::string recipe;
  std::string name() const { return kind + "/" + shape.name + "/" + recipe; }
  int ranks() const { return kind == "sim_ranks" ? kSimRanks : 1; }
};

std::vector<Case> g_cases;

void define_cases() {
  for (const char* kind : {"sim_ranks", "nccl_ws1"})
    for (const Shape& s : kShapes)
      for (const char* r : kRecipes) g_cases.push_back(Case{kind, s, r});
}

TrainerConfig probe_config(const Case& c) {
  return ep_probe_config(c.shape.hidden, parse_recipe(c.recipe, "bench_ep_comm's recipe"), kTopK, kExperts,
                         kExpertFfn);
}

// Bytes of each direction over the whole group (sent between distinct ranks + copied to itself), and the part
// between distinct ranks.
struct DirectionBytes {
  std::array<double, kDirections> total{}, between{};
  void add(int i, const EpExchangeBytes& b) {
    total[static_cast<size_t>(i)] += static_cast<double>(b.sent + b.to_self);
    between[static_cast<size_t>(i)] += static_cast<double>(b.sent);
    total[kDirections - 1] += static_cast<double>(b.sent + b.to_self);
    between[kDirections - 1] += static_cast<double>(b.sent);
  }
};

// The formats' arithmetic of one layer step over `ranks` ranks with `routed` routed rows (ep_step_bytes_by_formats),
// then its sum.
std::array<double, kDirections> arithmetic_bytes(const TrainerConfig& cfg, int ranks, int64_t routed) {
  const std::array<int64_t, kEpExchangeKinds> b =
      ep_step_bytes_by_formats(cfg.recipe.routed_experts, cfg.model.hidden, ranks, kExperts, routed);
  std::array<double, kDirections> a{};
  for (int i = 0; i < kEpExchangeKinds; ++i) {
    a[static_cast<size_t>(i)] = static_cast<double>(b[static_cast<size_t>(i)]);
    a[kDirections - 1] += a[static_cast<size_t>(i)];
  }
  return a;
}

// What a case measured (one per case, kept for the report).
struct Measured {
  bool ok = false;
  std::string error;
  int64_t routed = 0;                       // routed (token, expert) rows of the step, over the group
  DirectionBytes transport, exchange;       // sim_ranks: the transport's copies; both: the layers' own counts
  std::array<double, kDirections> arithmetic{};
  double payload = 0, scales = 0;           // sim_ranks: MoeRoutedExperts::dispatch_bytes of rank 0's layer
  std::array<std::vector<double>, kDirections> ms;  // nccl_ws1: per iteration, milliseconds per direction
  std::array<double, kDirections> copy_us{};        // nccl_ws1: the copy of each direction's bytes
};
std::map<std::string, Measured> g_measured;

// fp4moe::Error unless the counts agree: `what` (per direction) against the arithmetic.
void expect_arithmetic(const Case& c, const char* what, const std::array<double, kDirections>& got,
                       const std::array<double, kDirections>& want) {
  for (int i = 0; i < kDirections; ++i)
    FP4MOE_CHECK(got[static_cast<size_t>(i)] == want[static_cast<size_t>(i)],
                 "{}: {} {} bytes of {}, the formats' arithmetic {}", c.name(), what, got[static_cast<size_t>(i)],
                 direction_name(i), want[static_cast<size_t>(i)]);
}

void simulate(const Case& c, Measured& m) {
  const TrainerConfig cfg = probe_config(c);
  const EpSimulatedStep step = simulate_ep_step(cfg, kSimRanks, kSimTokensPerRank, kSeed);
  m.routed = step.routed_rows;
  int64_t sent = 0, received = 0;
  for (int i = 0; i < kEpExchangeKinds; ++i) {
    m.transport.add(i, step.transport.kind[i]);
    m.exchange.add(i, step.layers.kind[i]);
    sent += step.layers.kind[i].sent;
    received += step.layers.kind[i].received;
  }
  m.payload = step.dispatch_payload_per_token;
  m.scales = step.dispatch_scales_per_token;
  m.arithmetic = arithmetic_bytes(cfg, kSimRanks, m.routed);
  FP4MOE_CHECK(sent == received, "{}: the ranks sent {} bytes to one another and received {}", c.name(), sent,
               received);
  expect_arithmetic(c, "the transport copied", m.transport.total, m.arithmetic);
  expect_arithmetic(c, "the layers counted", m.exchange.total, m.arithmetic);
}

// The layer over NCCL at world size 1, kept from the first iteration of a case to its last.
struct Ws1 {
  NcclComm comm;
  NcclTransport transport;
  EpLayerProbe probe;
  Ws1(const TrainerConfig& cfg, NcclComm c)
      : comm(std::move(c)), transport(comm), probe(cfg, kWs1Tokens, transport, kSeed) {}
};

// Milliseconds of each exchange of one forward + backward (its sum last); adds the bytes to m (first call only).
std::array<double, kDirections> timed_step(Ws1& w, Measured* m) {
  EpExchange& ex = w.probe.exchange();
  ex.reset_bytes();
  w.probe.step();
  const std::vector<double> ms = ex.exchange_ms();
  std::array<double, kDirections> out{};
  for (int i = 0; i < kEpExchangeKinds; ++i) {
    out[static_cast<size_t>(i)] = ms[static_cast<size_t>(i)];
    out[kDirections - 1] += ms[static_cast<size_t>(i)];
    if (m) m->exchange.add(i, ex.bytes().kind[i]);
  }
  return out;
}

// Microseconds of one device-to-device copy of `bytes` (the mean over kCopyLaunches copies, after one).
double copy_us(double bytes, cudaStream_t stream) {
  if (bytes <= 0) return 0.0;
  const size_t n = static_cast<size_t>(bytes);
  bench::DevicePool pool;
  uint8_t* src = pool.alloc<uint8_t>(static_cast<int64_t>(n));
  uint8_t* dst = pool.alloc<uint8_t>(static_cast<int64_t>(n));
  CUDA_CHECK(cudaMemsetAsync(src, 0x5A, n, stream));
  CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, stream));
  bench::EventTimer timer;
  const double s = timer.time(kCopyLaunches, stream, [&](int) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, stream));
  });
  return s / kCopyLaunches * 1e6;
}

void run_ws1(benchmark::State& state, const Case& c, Measured& m) {
  const TrainerConfig cfg = probe_config(c);
  setenv("NCCL_NVLS_ENABLE", "0", 0);  // no NVLink multicast (the launcher's setting), unless the caller set it
  Ws1 w(cfg, NcclComm::single_rank());
  w.probe.exchange().set_timing(true);
  timed_step(w, &m);  // warm-up: grows the exchange's buffers; its bytes are the step's
  m.routed = w.probe.tokens() * kTopK;
  m.arithmetic = arithmetic_bytes(cfg, 1, m.routed);
  expect_arithmetic(c, "the layer counted", m.exchange.total, m.arithmetic);
  FP4MOE_CHECK(m.exchange.between[kDirections - 1] == 0, "{}: {} bytes left the only rank", c.name(),
               m.exchange.between[kDirections - 1]);
  for (auto _ : state) {
    const std::array<double, kDirections> ms = timed_step(w, nullptr);
    for (int i = 0; i < kDirections; ++i) m.ms[static_cast<size_t>(i)].push_back(ms[static_cast<size_t>(i)]);
    state.SetIterationTime(ms[kDirections - 1] * 1e-3);
  }
  for (int i = 0; i < kEpExchangeKinds; ++i) {
    m.copy_us[static_cast<size_t>(i)] = copy_us(m.exchange.total[static_cast<size_t>(i)], w.probe.stream());
    m.copy_us[kDirections - 1] += m.copy_us[static_cast<size_t>(i)];
  }
}

void run_case(benchmark::State& state, const Case& c) {
  Measured& m = g_measured[c.name()];
  m = Measured{};
  try {
    if (c.kind == "sim_ranks") {
      for (auto _ : state) {
        const auto start = std::chrono::steady_clock::now();
        m = Measured{};
        simulate(c, m);
        state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      }
    } else {
      run_ws1(state, c, m);
    }
    m.ok = true;
    state.counters["B_per_routed_token"] = m.exchange.total[kDirections - 1] / static_cast<double>(m.routed);
  } catch (const std::exception& e) {
    m.error = e.what();
    state.SkipWithError(e.what());
  }
}

// ---- summary ------------------------------------------------------------------------------------------------------

double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// One row of the table: a case's direction, or (case trainer_buffers) the dispatch buffers of a sim_ranks case.
struct Row {
  std::string kase, shape, recipe, direction;
  int64_t ranks = 0, routed = 0;
  double measured = NAN, exchange = NAN, arithmetic = NAN, wire_share = NAN;
  double us = NAN, copy_us = NAN;
  double payload = NAN, scales = NAN;  // trainer_buffers: per routed token
  double per_token(double bytes) const { return bytes / static_cast<double>(routed); }
};

std::vector<Row> summarize() {
  std::vector<Row> rows;
  for (const Case& c : g_cases) {
    auto it = g_measured.find(c.name());
    if (it == g_measured.end() || it->second.routed == 0) continue;  // not run, or failed before counting
    const Measured& m = it->second;
    const bool sim = c.kind == "sim_ranks";
    for (int i = 0; i < kDirections; ++i) {
      Row r{c.kind, c.shape.name, c.recipe, direction_name(i), c.ranks(), m.routed};
      const size_t k = static_cast<size_t>(i);
      if (sim) r.measured = m.transport.total[k];
      r.exchange = m.exchange.total[k];
      r.arithmetic = m.arithmetic[k];
      const double moved = sim ? m.transport.total[k] : m.exchange.total[k];
      r.wire_share = moved > 0 ? (sim ? m.transport.between[k] : m.exchange.between[k]) / moved : NAN;
      if (!sim) {
        r.us = median(m.ms[k]) * 1e3;
        r.copy_us = m.copy_us[k];
      }
      rows.push_back(r);
    }
    if (sim) {
      Row r{"trainer_buffers", c.shape.name, c.recipe, "dispatch", c.ranks(), m.routed};
      r.payload = m.payload;
      r.scales = m.scales;
      rows.push_back(r);
    }
  }
  return rows;
}

std::string cell(double v, const char* spec = "{:.2f}") {
  return std::isnan(v) ? std::string("-") : fmt::format(fmt::runtime(spec), v);
}

void print_table(const std::vector<Row>& rows) {
  fmt::print("\n{:<15} | {:<5} | {:<6} | {:<17} | {:>13} | {:>9} | {:>10} | {:>9} | {:>6}\n", "case", "shape",
             "recipe", "direction", "B/routed tok", "formats", "wire share", "us", "x copy");
  for (const Row& r : rows) {
    if (r.kase == "trainer_buffers") {
      fmt::print("{:<15} | {:<5} | {:<6} | {:<17} | {:>13} | {:>9} | {:>10} | {:>9} | {:>6}\n", r.kase, r.shape,
                 r.recipe, r.direction, cell(r.payload + r.scales, "{:.1f}"), "-", "-", "-", "-");
      continue;
    }
    const double bytes = std::isnan(r.measured) ? r.exchange : r.measured;
    fmt::print("{:<15} | {:<5} | {:<6} | {:<17} | {:>13} | {:>9} | {:>10} | {:>9} | {:>6}\n", r.kase, r.shape,
               r.recipe, r.direction, cell(r.per_token(bytes), "{:.3f}"), cell(r.per_token(r.arithmetic), "{:.3f}"),
               cell(r.wire_share, "{:.3f}"), cell(r.us, "{:.1f}"), cell(r.copy_us / r.us, "{:.2f}"));
  }
}

// The /bench/ep_comm table: bench_util.cuh's columns (case sim_ranks, trainer_buffers or nccl_ws1; shape v3 or
// v2; recipe; time_us and fraction_of_copy_bw on nccl_ws1 rows; gbps = 2 x bytes / time, read + written as the
// copy ceiling counts them; tflops and speedup NaN), then the columns of result_table's attributes.
Table result_table(const std::vector<Row>& rows) {
  Table t = bench::bench_table();
  t.add_column("direction", ColumnType::str)
      .add_column("ranks", ColumnType::i64)
      .add_column("routed_tokens", ColumnType::i64)
      .add_column("measured_bytes", ColumnType::f64)
      .add_column("exchange_bytes", ColumnType::f64)
      .add_column("arithmetic_bytes", ColumnType::f64)
      .add_column("bytes_per_routed_token", ColumnType::f64)
      .add_column("arithmetic_bytes_per_routed_token", ColumnType::f64)
      .add_column("wire_share", ColumnType::f64)
      .add_column("copy_time_us", ColumnType::f64)
      .add_column("dispatch_payload_bytes", ColumnType::f64)
      .add_column("dispatch_scale_bytes", ColumnType::f64)
      .add_column("dispatch_bytes", ColumnType::f64);
  const double none = NAN;
  for (const Row& r : rows) {
    const double bytes = std::isnan(r.measured) ? r.exchange : r.measured;
    const bool buffers = r.kase == "trainer_buffers";
    t.add_row({r.kase, r.shape, r.recipe, r.us, none, r.us > 0 ? 2.0 * bytes / (r.us * 1e3) : none,
               r.copy_us / r.us, none, r.direction, r.ranks, r.routed, r.measured, r.exchange, r.arithmetic,
               buffers ? none : r.per_token(bytes), buffers ? none : r.per_token(r.arithmetic), r.wire_share,
               r.copy_us, r.payload, r.scales, buffers ? r.payload + r.scales : none});
  }
  t.set_attribute("cases", "sim_ranks: one forward + backward of the layer over 8 simulated ranks (one GPU, "
                           "InProcessTransport), 512 tokens per rank; trainer_buffers: the dispatch payload the "
                           "layer's buffers hold (MoeRoutedExperts::dispatch_bytes); nccl_ws1: the layer over NCCL "
                           "at world size 1, 4096 tokens: a local copy, a floor of the all-to-all's time");
  t.set_attribute("probe", "top-k 8, 16 routed experts of FFN 256, no shared expert, v3 router; hidden v3 7168, "
                           "v2 5120");
  t.set_attribute("direction", "the layer's exchanges (counts, dispatch, combine, dispatch_gradient, "
                               "combine_gradient: trainer/comm/ep_exchange.h) and all (their sum)");
  t.set_attribute("measured_bytes", "sim_ranks: bytes the in-process transport copied for the direction, over "
                                    "every ordered pair of ranks, self included (NaN elsewhere)");
  t.set_attribute("exchange_bytes", "bytes the layers counted (EpExchange::bytes: sent + to itself), summed over "
                                    "the ranks");
  t.set_attribute("arithmetic_bytes", "the formats' arithmetic: routed rows x expert_parallel_row_bytes per payload "
                                      "direction, ranks^2 x 4 E_l for the counts");
  t.set_attribute("bytes_per_routed_token", "measured_bytes (sim_ranks) or exchange_bytes (nccl_ws1) / "
                                            "routed_tokens (routed (token, expert) rows over the group)");
  t.set_attribute("wire_share", "fraction of the bytes moved between distinct ranks (the rest: each rank to itself)");
  t.set_attribute("time_us", "nccl_ws1: median over iterations of the direction's CUDA-event time per layer "
                             "forward + backward, microseconds (NaN elsewhere)");
  t.set_attribute("fraction_of_copy_bw", "copy_time_us / time_us: a device-to-device cudaMemcpyAsync of the same "
                                         "bytes over the exchange");
  t.set_attribute("dispatch_bytes", "trainer_buffers: dispatch payload + scale bytes per routed token, as "
                                    "`fp4moe train` writes them in /memory/<run> (dispatch_* attributes)");
  t.set_attribute("min_time_s", kMinTimeS);
  return t;
}

}  // namespace
}  // namespace fp4moe::bench_ep

int main(int argc, char** argv) {
  using namespace fp4moe;
  using namespace fp4moe::bench_ep;
  bench::Program program;
  program.name = "bench_ep_comm";
  program.needs = "the expert-parallel exchange benchmarks";
  program.help.summary =
      "the expert-parallel MoE layer's all-to-all bytes per exchange over 8 simulated ranks (one GPU) beside the "
      "formats' arithmetic, and its all-to-all time over NCCL at world size 1 (a local copy: a floor) beside a "
      "device copy of the same bytes, per recipe at the DeepSeek-V3 and V2 hidden sizes";
  program.help.example = "--benchmark_filter=^sim_ranks/v3/";
  program.min_time_s = kMinTimeS;
  program.cases = [] {
    define_cases();
    std::vector<std::string> names;
    for (const Case& c : g_cases) names.push_back(c.name());
    return names;
  };
  program.run_case = [](benchmark::State& st, size_t i) { run_case(st, g_cases[i]); };
  program.report = [](const std::string& h5_path, const std::string& command) {
    const std::vector<Row> rows = summarize();
    print_table(rows);
    int rc = 0;
    for (const auto& [name, m] : g_measured)
      if (!m.ok) {
        fmt::print(stderr, "bench_ep_comm: {} failed: {}\n", name, m.error);
        rc = 1;
      }
    if (!h5_path.empty() &&
        bench::write_bench_result("bench_ep_comm", h5_path, "ep_comm", result_table(rows), command) != 0)
      rc = 1;
    return rc;
  };
  return bench::run_program(argc, argv, program);
}
