// GPU tests of the MoE layer over the expert-parallel exchange (trainer/model/moe_expert_parallel.h).
//   - N = 2, 4, 8 simulated ranks (InProcessTransport: one host thread and one stream per rank, one device), every
//     rank with its own micro-batch (uneven sizes; from N = 4 on one rank has no token), against ONE single-GPU
//     MoeLayer holding all E experts with the same weights (each rank's experts a copy of the reference's slice),
//     run on each rank's tokens in turn (its grads accumulate over the ranks). The routing is forced to one skewed
//     selection on both sides (random_ep_routing: uneven loads, expert 5 never chosen, so its rank's copy receives
//     no row and at N = 8 rank 5 receives no row at all); one case uses the router's own selection, which must be
//     the reference's. Routed recipes bf16, fp8, mxfp4.
//     Checked: y and dx per rank; the router's and shared experts' grads summed over the ranks; the expert grads of
//     each rank against the reference's slice (expert 5's exactly zero); the bytes each rank's exchange counted,
//     per kind, against the formats' arithmetic (ep_payload.h: BF16 2 d, FP8 d + 4 ceil(d/128), MXFP4 d/2 + d/32
//     per row; counts 4 E_l per peer) on the rows the selection sends; the exchange's buffers counted by the rank's
//     DeviceMemory under MemCategory::comm.
//     Tolerances (relative L2). The rows each expert multiplies are the same bits as the reference's (the dispatch
//     formats' rules are per row); an expert's GEMMs here run over all ranks' rows at once, which changes their
//     summation order only: bf16 y, dx, router grads 5e-3 (a BF16 rounding flip here and there), grads of the
//     experts 2e-3 and of the shared experts 1e-3 (FP32). fp8, mxfp4: y, dx 1e-2 and router grads 2e-2 (the same
//     codes, the summation order); expert grads 0.15: Wgrad's FP8 column blocks (1x128 along tokens) hold other
//     tokens than the reference's (all ranks' rows of an expert against one rank's), and the backward's dY columns
//     are made from the FP8 rows that crossed the exchange, each about 3-5% off the reference's; a wrong wiring is
//     off by O(1).
//   - World size 1 over NCCL (NcclComm::single_rank) against the single-GPU MoeLayer on the same tokens: y, dx, the
//     router's and shared experts' grads bit for bit in every recipe (the same rows in the same order, the same
//     GEMMs; FP8 rows quantized again after the exchange give the same values), the expert grads bit for bit for
//     bf16 and within 0.15 for fp8 / mxfp4 (the Wgrad dY columns come from the FP8 rows that crossed, above).
//   - ep_fp8_rows_to_bf16 (the receiver's FP8 rows back to BF16) against its reference, bit for bit.
//   - The constructor's refusals: routed experts not a multiple of the world size, a recompute policy that drops the
//     routed experts' tensors.
// Run: fp4moe_tests_gpu_trainer --gtest_filter='*MoeExpertParallel*'
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/common/check.h"
#include "kernels/quant/layouts.h"
#include "tests/common/ep_comm_test_util.h"
#include "tests/common/ep_ranks_test_util.h"
#include "tests/common/gpu_test_util.h"
#include "tests/common/moe_test_util.h"
#include "tests/common/param_printers.h"
#include "trainer/comm/in_process_transport.h"
#include "trainer/comm/nccl_transport.h"
#include "trainer/config.h"
#include "trainer/model/moe.h"
#include "trainer/model/moe_expert_parallel.h"

namespace fp4moe {
namespace {

using test::DeviceBuffer;
using test::LayerHarness;
using test::Vec;

constexpr int64_t kD = 64, kE = 8, kK = 2, kF = 32, kShared = 1, kMaxTokens = 128;
constexpr int kEmptyExpert = 5;
const std::string kPrefix = "layers.1.moe";

Recipe recipe_of(EpRowFormat f) {
  return f == EpRowFormat::bf16 ? Recipe::bf16 : f == EpRowFormat::fp8 ? Recipe::fp8 : Recipe::mxfp4;
}

TrainerConfig tiny_moe(Recipe routed) {
  TrainerConfig c;
  c.model.hidden = kD;
  c.model.layers = 2;
  c.moe.routed_experts = kE;
  c.moe.shared_experts = kShared;
  c.moe.top_k = kK;
  c.moe.expert_ffn = kF;
  c.moe.router = RouterStyle::v3_sigmoid;
  c.moe.routed_scale = 2.5;
  c.moe.bias_update_rate = 0.001;
  c.recipe.routed_experts = routed;
  return c;
}

// The reference's parameter values (BF16-exact doubles) and v3 bias.
struct Weights {
  Vec wr, w1, w2, ws1, ws2;
  std::vector<float> bias;
};

// Writes values[offset, offset + p.n) to parameter `name` (BF16 copy and FP32 master).
void upload_param(LayerHarness& h, const std::string& name, const Vec& values, size_t offset) {
  Param& p = h.param(name);
  FP4MOE_CHECK(offset + static_cast<size_t>(p.n) <= values.size(), "upload_param {}: {} values from {}, have {}", name,
               p.n, offset, values.size());
  std::vector<bf16> b(static_cast<size_t>(p.n));
  std::vector<float> f(static_cast<size_t>(p.n));
  for (size_t i = 0; i < f.size(); ++i) {
    f[i] = static_cast<float>(values[offset + i]);
    b[i] = bf16_from_bits(f32_to_bf16_bits(f[i]));
  }
  CUDA_CHECK(cudaMemcpy(p.param, b.data(), b.size() * sizeof(bf16), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(p.master, f.data(), f.size() * sizeof(float), cudaMemcpyHostToDevice));
}

void upload_bias(LayerHarness& h, const std::vector<float>& bias) {
  CUDA_CHECK(cudaMemcpy(h.state(kPrefix + ".router_bias").data, bias.data(), bias.size() * sizeof(float),
                        cudaMemcpyHostToDevice));
}

// One rank's micro-batch: tokens, upstream gradient, forced selection (empty: the router's own).
struct RankData {
  int64_t M = 0;
  std::vector<bf16> x, dy;
  std::vector<int32_t> topk;
};

// What a layer produced on one micro-batch.
struct LayerResult {
  Vec y, dx;
  std::vector<int32_t> idx;
  Vec g_router, g_fc1, g_fc2, g_s1, g_s2;  // the expert-parallel ranks' own grads
  EpLayerBytes bytes;
  int64_t received = 0;
  size_t comm_bytes = 0;  // DeviceMemory's MemCategory::comm after the run (the exchange's buffers)
};

template <typename T>
void upload_if(DeviceBuffer<T>& d, const std::vector<T>& h) {
  if (d.n) d.upload(h);
}

// Runs forward and backward of `layer` (MoeLayer or ExpertParallelMoeLayer) on one micro-batch; grads +=.
template <typename Layer>
LayerResult run_layer(LayerHarness& h, Layer& layer, const RankData& in) {
  const int64_t M = in.M;
  DeviceBuffer<bf16> x(static_cast<size_t>(M * kD)), y(static_cast<size_t>(M * kD)), dy(static_cast<size_t>(M * kD)),
      dx(static_cast<size_t>(M * kD));
  DeviceBuffer<int32_t> sel(in.topk.size());
  upload_if(x, in.x);
  upload_if(dy, in.dy);
  upload_if(sel, in.topk);
  y.poison(0xFF);
  dx.poison(0xFF);
  layer.force_routing(in.topk.empty() ? nullptr : sel.ptr);
  layer.forward(h.ctx, x.ptr, M, y.ptr);
  layer.backward(h.ctx, dy.ptr, x.ptr, M, dx.ptr);
  h.sync();
  LayerResult r;
  r.y = test::as_doubles(y.download());
  r.dx = test::as_doubles(dx.download());
  r.idx.resize(static_cast<size_t>(M * kK));
  if (M > 0)
    CUDA_CHECK(cudaMemcpy(r.idx.data(), layer.topk_idx(), r.idx.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
  layer.force_routing(nullptr);
  return r;
}

// The single-GPU layer with all E experts, its weights drawn as test_moe_layer_gpu.cpp draws them.
struct Reference {
  LayerHarness h;
  TrainerConfig cfg;
  std::unique_ptr<MoeLayer> layer;
  Weights w;
  explicit Reference(const TrainerConfig& c) : cfg(c) {
    layer = std::make_unique<MoeLayer>(h.store, kPrefix, cfg, kMaxTokens, h.mem);
    h.fit_scratch(layer->scratch_bytes());
    h.store.allocate(h.mem);
    h.store.init(7, h.stream);
    w.wr = h.set_param(kPrefix + ".router", 0.15, 1);
    w.w1 = h.set_param(kPrefix + ".experts.fc1", 0.1, 2);
    w.w2 = h.set_param(kPrefix + ".experts.fc2", 0.1, 3);
    w.ws1 = h.set_param(kPrefix + ".shared.fc1", 0.1, 4);
    w.ws2 = h.set_param(kPrefix + ".shared.fc2", 0.1, 5);
    for (int64_t e = 0; e < kE; ++e) w.bias.push_back(0.01f * static_cast<float>((e * 5) % 7 - 3));
    upload_bias(h, w.bias);
    h.store.zero_grads(h.stream);
  }
  ~Reference() { layer.reset(); }  // before the harness's allocator goes
};

// One expert-parallel rank: a layer over `t` with the reference's weights (its slice of the experts), run once.
LayerResult run_ep_rank(EpTransport& t, const TrainerConfig& cfg, const Weights& w, const RankData& in) {
  LayerHarness h;
  auto layer = std::make_unique<ExpertParallelMoeLayer>(h.store, kPrefix, cfg, kMaxTokens, h.mem, t);
  h.fit_scratch(layer->scratch_bytes());
  h.store.allocate(h.mem);
  h.store.init(7, h.stream);
  const size_t E_l = static_cast<size_t>(layer->local_experts()), r = static_cast<size_t>(t.rank());
  upload_param(h, kPrefix + ".router", w.wr, 0);
  upload_param(h, kPrefix + ".experts.fc1", w.w1, r * E_l * 2 * kF * kD);
  upload_param(h, kPrefix + ".experts.fc2", w.w2, r * E_l * kD * kF);
  upload_param(h, kPrefix + ".shared.fc1", w.ws1, 0);
  upload_param(h, kPrefix + ".shared.fc2", w.ws2, 0);
  upload_bias(h, w.bias);
  h.store.zero_grads(h.stream);
  LayerResult res = run_layer(h, *layer, in);
  res.g_router = h.grad(kPrefix + ".router");
  res.g_fc1 = h.grad(kPrefix + ".experts.fc1");
  res.g_fc2 = h.grad(kPrefix + ".experts.fc2");
  res.g_s1 = h.grad(kPrefix + ".shared.fc1");
  res.g_s2 = h.grad(kPrefix + ".shared.fc2");
  res.bytes = layer->exchange().bytes();
  res.received = layer->exchange().counts().recv_total();
  res.comm_bytes = h.mem.current(MemCategory::comm);
  layer.reset();  // before the harness
  return res;
}

// The micro-batches of N ranks: sizes uneven (rank 2 without tokens from N = 4 on), tokens and gradients N(0, 1).
std::vector<RankData> make_ranks(int N, bool forced, uint64_t seed) {
  const int64_t sizes[] = {100, 37, 0, 128, 64, 5, 77, 16};
  std::vector<int64_t> M(sizes, sizes + N);
  const std::vector<std::vector<int32_t>> topk = test::random_ep_routing(M, kK, kE, {kEmptyExpert}, seed);
  std::vector<RankData> ranks(static_cast<size_t>(N));
  for (int r = 0; r < N; ++r) {
    RankData& d = ranks[static_cast<size_t>(r)];
    d.M = M[static_cast<size_t>(r)];
    Vec unused;
    d.x = test::random_bf16_values(static_cast<size_t>(d.M * kD), static_cast<uint32_t>(seed + 10 * r + 1), 1.0,
                                   unused);
    d.dy = test::random_bf16_values(static_cast<size_t>(d.M * kD), static_cast<uint32_t>(seed + 10 * r + 2), 1.0,
                                    unused);
    if (forced) d.topk = topk[static_cast<size_t>(r)];
  }
  return ranks;
}

// Runs the N ranks on their threads over one InProcessGroup (ep_ranks_test_util.h).
std::vector<LayerResult> run_in_process(const TrainerConfig& cfg, const Weights& w, const std::vector<RankData>& in) {
  return test::run_simulated_ranks<LayerResult>(static_cast<int>(in.size()), [&](EpTransport& t) {
    return run_ep_rank(t, cfg, w, in[static_cast<size_t>(t.rank())]);
  });
}

// Wire bytes of one row of format f at hidden d: the formats' arithmetic (ep_payload.h), written out.
int64_t row_bytes(EpRowFormat f, int64_t d) {
  if (f == EpRowFormat::bf16) return 2 * d;
  if (f == EpRowFormat::fp8) return d + 4 * ((d + 127) / 128);
  return d / 2 + d / 32;
}

// Each rank's exchange bytes against the rows its selection sends: rows[s][p] = rank s's rows for rank p's experts.
void expect_bytes(const std::vector<std::vector<int32_t>>& idx, const std::vector<LayerResult>& out, Recipe recipe) {
  const int N = static_cast<int>(out.size());
  const int64_t E_l = kE / N;
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(N), std::vector<int64_t>(static_cast<size_t>(N), 0));
  for (int s = 0; s < N; ++s)
    for (int32_t e : idx[static_cast<size_t>(s)]) ++rows[static_cast<size_t>(s)][static_cast<size_t>(e / E_l)];
  const int64_t fwd = row_bytes(ep_dispatch_format(recipe), kD);
  const int64_t bwd = row_bytes(ep_backward_dispatch_format(recipe), kD), back = row_bytes(EpRowFormat::bf16, kD);
  for (int r = 0; r < N; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    int64_t to_others = 0, from_others = 0, received = 0;
    for (int p = 0; p < N; ++p) {
      received += rows[static_cast<size_t>(p)][static_cast<size_t>(r)];
      if (p == r) continue;
      to_others += rows[static_cast<size_t>(r)][static_cast<size_t>(p)];
      from_others += rows[static_cast<size_t>(p)][static_cast<size_t>(r)];
    }
    const int64_t self = rows[static_cast<size_t>(r)][static_cast<size_t>(r)];
    const EpLayerBytes& b = out[static_cast<size_t>(r)].bytes;
    EXPECT_EQ(out[static_cast<size_t>(r)].received, received);
    // The exchange's buffers are counted: at least the receive wire of the dispatch and the send wire of the combine.
    EXPECT_GE(static_cast<int64_t>(out[static_cast<size_t>(r)].comm_bytes), received * (std::max(fwd, bwd) + back));
    auto expect = [&](EpExchangeKind k, int64_t sent, int64_t recv, int64_t to_self) {
      SCOPED_TRACE(ep_exchange_kind_name(k));
      EXPECT_EQ(b[k].sent, sent);
      EXPECT_EQ(b[k].received, recv);
      EXPECT_EQ(b[k].to_self, to_self);
    };
    expect(EpExchangeKind::counts, (N - 1) * 4 * E_l, (N - 1) * 4 * E_l, 4 * E_l);
    expect(EpExchangeKind::dispatch, to_others * fwd, from_others * fwd, self * fwd);
    expect(EpExchangeKind::combine, from_others * back, to_others * back, self * back);
    expect(EpExchangeKind::dispatch_gradient, to_others * bwd, from_others * bwd, self * bwd);
    expect(EpExchangeKind::combine_gradient, from_others * back, to_others * back, self * back);
  }
}

struct Tolerances {
  double y, dx, router, experts, shared;
};

Tolerances tolerances(Recipe recipe) {
  if (recipe == Recipe::bf16) return {5e-3, 5e-3, 5e-3, 2e-3, 1e-3};
  return {1e-2, 1e-2, 2e-2, 0.15, 1e-3};
}

Vec slice(const Vec& v, size_t begin, size_t n) {
  return Vec(v.begin() + static_cast<std::ptrdiff_t>(begin), v.begin() + static_cast<std::ptrdiff_t>(begin + n));
}

void add_into(Vec& sum, const Vec& v) {
  if (sum.empty()) sum.assign(v.size(), 0.0);
  ASSERT_EQ(sum.size(), v.size());
  for (size_t i = 0; i < v.size(); ++i) sum[i] += v[i];
}

// N ranks against the reference on the same micro-batches; `forced`: the skewed selection, else the router's own.
void check_ranks(int N, Recipe recipe, bool forced) {
  SCOPED_TRACE("N=" + std::to_string(N) + " routed " + recipe_name(recipe) + (forced ? " forced" : " own routing"));
  const TrainerConfig cfg = tiny_moe(recipe);
  Reference ref(cfg);
  const std::vector<RankData> ranks = make_ranks(N, forced, 1000 + 17 * static_cast<uint64_t>(N));
  std::vector<LayerResult> want;
  for (const RankData& d : ranks) want.push_back(run_layer(ref.h, *ref.layer, d));  // grads accumulate
  const std::vector<LayerResult> got = run_in_process(cfg, ref.w, ranks);
  ASSERT_FALSE(testing::Test::HasFailure());

  const Tolerances tol = tolerances(recipe);
  std::vector<std::vector<int32_t>> idx;
  Vec g_router, g_s1, g_s2;
  for (int r = 0; r < N; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const LayerResult &g = got[static_cast<size_t>(r)], &w = want[static_cast<size_t>(r)];
    ASSERT_EQ(g.idx, w.idx) << "the selection differs from the reference's";
    idx.push_back(g.idx);
    test::expect_rel_l2(g.y, w.y, tol.y, "y");
    test::expect_rel_l2(g.dx, w.dx, tol.dx, "dx");
    add_into(g_router, g.g_router);
    add_into(g_s1, g.g_s1);
    add_into(g_s2, g.g_s2);
    // This rank's experts against the reference's slice.
    const size_t E_l = static_cast<size_t>(kE / N), n1 = E_l * 2 * kF * kD, n2 = E_l * kD * kF;
    const Vec ref_fc1 = slice(ref.h.grad(kPrefix + ".experts.fc1"), static_cast<size_t>(r) * n1, n1);
    const Vec ref_fc2 = slice(ref.h.grad(kPrefix + ".experts.fc2"), static_cast<size_t>(r) * n2, n2);
    test::expect_rel_l2(g.g_fc1, ref_fc1, tol.experts, "experts.fc1 grad");
    test::expect_rel_l2(g.g_fc2, ref_fc2, tol.experts, "experts.fc2 grad");
    if (forced && static_cast<size_t>(kEmptyExpert) / E_l == static_cast<size_t>(r)) {  // the expert without rows
      const size_t e = static_cast<size_t>(kEmptyExpert) % E_l;
      for (double v : slice(g.g_fc1, e * 2 * kF * kD, 2 * kF * kD)) ASSERT_EQ(v, 0.0) << "expert 5 fc1 grad";
      for (double v : slice(g.g_fc2, e * kD * kF, kD * kF)) ASSERT_EQ(v, 0.0) << "expert 5 fc2 grad";
    }
  }
  test::expect_rel_l2(g_router, ref.h.grad(kPrefix + ".router"), tol.router, "router grad (sum over ranks)");
  test::expect_rel_l2(g_s1, ref.h.grad(kPrefix + ".shared.fc1"), tol.shared, "shared.fc1 grad (sum over ranks)");
  test::expect_rel_l2(g_s2, ref.h.grad(kPrefix + ".shared.fc2"), tol.shared, "shared.fc2 grad (sum over ranks)");
  expect_bytes(idx, got, recipe);
  if (N == 8 && forced) {
    EXPECT_EQ(got[kEmptyExpert].received, 0) << "rank 5 holds only expert 5, which no token chose";
  }
}

class MoeExpertParallelGpu : public testing::TestWithParam<std::tuple<int, EpRowFormat>> {};

TEST_P(MoeExpertParallelGpu, SimulatedRanksMatchOneGpuLayer) {
  FP4MOE_REQUIRE_DEVICE();
  check_ranks(std::get<0>(GetParam()), recipe_of(std::get<1>(GetParam())), true);
}

INSTANTIATE_TEST_SUITE_P(RanksFormats, MoeExpertParallelGpu,
                         testing::Combine(testing::Values(2, 4, 8),
                                          testing::Values(EpRowFormat::bf16, EpRowFormat::fp8, EpRowFormat::mxfp4)),
                         [](const testing::TestParamInfo<std::tuple<int, EpRowFormat>>& i) {
                           return "N" + std::to_string(std::get<0>(i.param)) + "_" +
                                  ep_row_format_name(std::get<1>(i.param));
                         });

TEST(MoeExpertParallelGpuRouting, RoutersOwnSelectionMatchesOneGpuLayer) {
  FP4MOE_REQUIRE_DEVICE();
  check_ranks(4, Recipe::bf16, false);
  check_ranks(4, Recipe::mxfp4, false);
}

// Bit-for-bit equality of two BF16- or FP32-valued vectors (the first mismatches named).
void expect_same(const Vec& got, const Vec& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (!(got[i] == want[i]) && bad++ < 3) ADD_FAILURE() << what << "[" << i << "]: " << got[i] << " vs " << want[i];
  EXPECT_EQ(bad, 0) << what << ": elements that differ";
}

class MoeExpertParallelNcclGpu : public testing::TestWithParam<EpRowFormat> {};

TEST_P(MoeExpertParallelNcclGpu, WorldSizeOneEqualsOneGpuLayer) {
  FP4MOE_REQUIRE_DEVICE();
  const Recipe recipe = recipe_of(GetParam());
  const TrainerConfig cfg = tiny_moe(recipe);
  Reference ref(cfg);
  const std::vector<RankData> ranks = make_ranks(1, true, 4242);
  const LayerResult want = run_layer(ref.h, *ref.layer, ranks[0]);
  setenv("NCCL_NVLS_ENABLE", "0", 0);  // no NVLink multicast (the launcher's setting), unless the caller set it
  NcclComm comm = NcclComm::single_rank();
  NcclTransport transport(comm);
  const LayerResult got = run_ep_rank(transport, cfg, ref.w, ranks[0]);
  expect_same(got.y, want.y, "y");
  expect_same(got.dx, want.dx, "dx");
  expect_same(got.g_router, ref.h.grad(kPrefix + ".router"), "router grad");
  expect_same(got.g_s1, ref.h.grad(kPrefix + ".shared.fc1"), "shared.fc1 grad");
  expect_same(got.g_s2, ref.h.grad(kPrefix + ".shared.fc2"), "shared.fc2 grad");
  if (recipe == Recipe::bf16) {
    expect_same(got.g_fc1, ref.h.grad(kPrefix + ".experts.fc1"), "experts.fc1 grad");
    expect_same(got.g_fc2, ref.h.grad(kPrefix + ".experts.fc2"), "experts.fc2 grad");
  } else {
    test::expect_rel_l2(got.g_fc1, ref.h.grad(kPrefix + ".experts.fc1"), 0.15, "experts.fc1 grad");
    test::expect_rel_l2(got.g_fc2, ref.h.grad(kPrefix + ".experts.fc2"), 0.15, "experts.fc2 grad");
  }
  expect_bytes({got.idx}, {got}, recipe);  // all to itself: nothing sent
  EXPECT_EQ(got.bytes.total().sent, 0);
}

INSTANTIATE_TEST_SUITE_P(Formats, MoeExpertParallelNcclGpu,
                         testing::Values(EpRowFormat::bf16, EpRowFormat::fp8, EpRowFormat::mxfp4),
                         [](const testing::TestParamInfo<EpRowFormat>& i) { return ep_row_format_name(i.param); });

// The device conversion of received FP8 rows to BF16 equals the reference bit for bit: every code byte (NaN codes
// included), scales of any value, a partial 128-block, padded scale rows.
TEST(MoeExpertParallelGpuPayload, Fp8RowsBackToBf16MatchTheReference) {
  FP4MOE_REQUIRE_DEVICE();
  const int64_t rows = 37, d = 160;
  std::mt19937 rng(9);
  std::vector<uint8_t> codes(static_cast<size_t>(rows * d));
  std::vector<float> scales(static_cast<size_t>(fp8_row_scale_count(rows, d)));
  for (uint8_t& c : codes) c = static_cast<uint8_t>(rng());
  for (float& v : scales)
    v = std::ldexp(std::uniform_real_distribution<float>(0.5f, 2.0f)(rng), static_cast<int>(rng() % 40) - 20);
  std::vector<bf16> want(codes.size());
  ep_fp8_rows_to_bf16_ref(EpRows{EpRowFormat::fp8, rows, d, codes.data(), scales.data()}, want.data());
  DeviceBuffer<uint8_t> c_d(codes.size());
  DeviceBuffer<float> s_d(scales.size());
  DeviceBuffer<bf16> out(codes.size());
  c_d.upload(codes);
  s_d.upload(scales);
  out.poison();
  ep_fp8_rows_to_bf16(EpRows{EpRowFormat::fp8, rows, d, c_d.ptr, s_d.ptr}, out.ptr, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<bf16> got = out.download();
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(bf16_bits(got[i]), bf16_bits(want[i])) << "element " << i;
}

// What the layer does not build is refused at construction, naming the option.
TEST(MoeExpertParallelGpuConfig, RefusesWhatIsNotBuilt) {
  FP4MOE_REQUIRE_DEVICE();
  InProcessGroup group(3);
  InProcessTransport t(group, 0);
  LayerHarness h;
  TrainerConfig c = tiny_moe(Recipe::bf16);
  try {
    ExpertParallelMoeLayer layer(h.store, kPrefix, c, kMaxTokens, h.mem, t);
    FAIL() << "8 experts over 3 ranks accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("split evenly over the 3"), std::string::npos) << e.what();
  }
  InProcessGroup group2(2);
  InProcessTransport t2(group2, 0);
  c.recompute.modules = {"moe"};
  try {
    ExpertParallelMoeLayer layer(h.store, kPrefix, c, kMaxTokens, h.mem, t2);
    FAIL() << "recompute moe accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("recompute"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(h.store.params().empty()) << "a refused layer registered parameters";
}

}  // namespace
}  // namespace fp4moe
