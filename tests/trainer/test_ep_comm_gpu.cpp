// GPU tests of the expert-parallel dispatch and combine (trainer/comm/ep_exchange.h): N simulated ranks (N = 1, 2,
// 4, 8) on one device through InProcessTransport, one host thread and stream per rank, with uneven loads, empty
// experts and a rank without tokens; and NCCL at world size 1 against the in-process transport at N = 1. Expected
// rows come from the CPU model of the all-to-all (tests/common/ep_comm_test_util.h: the single-rank permutation of
// all ranks' tokens); payloads are compared bit for bit (they are moved, never recomputed).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/formats/formats.h"
#include "kernels/nn/permute.h"
#include "kernels/nn/router.h"
#include "tests/common/ep_comm_test_util.h"
#include "tests/common/ep_ranks_test_util.h"
#include "tests/common/gpu_test_util.h"
#include "tests/common/param_printers.h"
#include "tests/common/trainer_test_util.h"
#include "trainer/comm/ep_exchange.h"
#include "trainer/comm/in_process_transport.h"
#include "trainer/comm/nccl_transport.h"

namespace fp4moe::test {
namespace {

constexpr int64_t kE = 16, kK = 3, kD = 160;  // fp8: a full and a partial 128-block; mxfp4: 5 blocks of 32

// One rank's inputs: routing, token rows in the dispatch format, gradient rows (FP8, permute order), BF16 tokens and
// top-k weights for the weighted round trip.
struct RankInput {
  int64_t M = 0;
  std::vector<int32_t> topk;
  HostRows tokens, grads, x;
  std::vector<float> w;
  RankInput(int64_t m, std::vector<int32_t> t, EpRowFormat f, uint64_t seed)
      : M(m), topk(std::move(t)), tokens(f, m, kD, seed), grads(EpRowFormat::fp8, m * kK, kD, seed + 1),
        x(EpRowFormat::bf16, m, kD, seed + 2), w(static_cast<size_t>(m * kK)) {
    std::mt19937 rng(static_cast<uint32_t>(seed));
    std::normal_distribution<float> n(0.f, 1.f);
    auto* xb = reinterpret_cast<uint16_t*>(x.codes.data());
    for (int64_t i = 0; i < m * kD; ++i) xb[i] = f32_to_bf16_bits(n(rng));  // finite BF16 values
    for (float& v : w) v = std::uniform_real_distribution<float>(0.f, 1.f)(rng);
  }
};

// What one rank's pipeline produced.
struct RankOutput {
  std::vector<int32_t> row_of;
  std::vector<HostRows> expert_rows, expert_grads;  // one each (vectors: HostRows has no default constructor)
  std::vector<uint8_t> ys, dys;                     // combine / combine_gradient outputs [M k, d] BF16
  std::vector<uint16_t> y;                          // weighted round trip [M, d] BF16
  EpLayerBytes bytes;
  std::vector<double> ms;  // EpExchange::exchange_ms
  int64_t recv_total = 0;
};

struct DeviceRows {
  DeviceBuffer<uint8_t> codes, scales;
  EpRows rows;
  DeviceRows(EpRowFormat f, int64_t n, int64_t d)
      : codes(static_cast<size_t>(ep_rows_code_bytes(f, n, d))), scales(static_cast<size_t>(ep_rows_scale_bytes(f, n, d))),
        rows{f, n, d, codes.ptr, scales.ptr} {
    codes.poison();
    scales.poison();
  }
  explicit DeviceRows(const HostRows& h) : DeviceRows(h.format, h.rows, h.d) {
    if (!h.codes.empty()) codes.upload(h.codes);
    if (!h.scales.empty()) scales.upload(h.scales);
  }
  HostRows download() const {
    HostRows h(rows.format, rows.rows, rows.d, 0);
    h.codes = codes.download();
    h.scales = scales.download();
    return h;
  }
};

// Overwrites the first byte of each grouped BF16 row with its slot (so that a combine that swaps slots shows).
void tag_slots(DeviceRows& grouped, const std::vector<EpRowOrigin>& origins) {
  FP4MOE_CHECK(static_cast<int64_t>(origins.size()) == grouped.rows.rows,
               "tag_slots: {} grouped rows received, the all-to-all model expects {}", grouped.rows.rows, origins.size());
  HostRows h = grouped.download();
  for (size_t i = 0; i < origins.size(); ++i) h.codes[i * 2 * kD] = static_cast<uint8_t>(origins[i].slot);
  if (!h.codes.empty()) grouped.codes.upload(h.codes);
}

RankOutput run_rank(EpTransport& t, RankInput& in, const std::vector<EpRowOrigin>& origins) {
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreate(&stream));
  RankOutput out;
  {
    const int64_t n = in.M * kK;
    DeviceBuffer<int32_t> topk(in.topk.size());
    if (n) topk.upload(in.topk);
    EpExchange ex(t, kE, kD);
    ex.set_timing(true);
    const EpCounts& c = ex.route(topk.ptr, in.M, kK, stream);
    const int64_t R = c.recv_total();
    out.recv_total = R;
    DeviceRows tokens(in.tokens), grads(in.grads), x(in.x);
    DeviceRows expert_rows(in.tokens.format, R, kD), expert_grads(EpRowFormat::fp8, R, kD);
    ex.dispatch(tokens.rows, expert_rows.rows, stream);
    ex.dispatch_gradient(grads.rows, expert_grads.rows, stream);
    // BF16 round trip: identity experts, then combine and the top-k weighted sum (unpermute_forward).
    DeviceRows grouped(EpRowFormat::bf16, R, kD);
    ex.dispatch(x.rows, grouped.rows, stream);
    DeviceBuffer<bf16> ys(static_cast<size_t>(n * kD)), y(static_cast<size_t>(in.M * kD));
    DeviceBuffer<float> w(in.w.size());
    if (n) w.upload(in.w);
    ex.combine(static_cast<const bf16*>(grouped.rows.codes), ys.ptr, stream);
    unpermute_forward(ys.ptr, w.ptr, ex.row_of(), in.M, kK, kD, y.ptr, stream);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    // Combine order: slot-tagged grouped rows through combine and combine_gradient.
    tag_slots(grouped, origins);
    DeviceBuffer<bf16> ys_tagged(static_cast<size_t>(n * kD)), dys(static_cast<size_t>(n * kD));
    ex.combine(static_cast<const bf16*>(grouped.rows.codes), ys_tagged.ptr, stream);
    ex.combine_gradient(static_cast<const bf16*>(grouped.rows.codes), dys.ptr, stream);
    t.wait(stream);
    out.row_of.resize(static_cast<size_t>(n));
    if (n)
      CUDA_CHECK(cudaMemcpy(out.row_of.data(), ex.row_of(), static_cast<size_t>(4 * n), cudaMemcpyDeviceToHost));
    out.expert_rows.push_back(expert_rows.download());
    out.expert_grads.push_back(expert_grads.download());
    auto bytes_of = [](const DeviceBuffer<bf16>& b) {
      std::vector<uint8_t> v(b.n * 2);
      if (b.n) CUDA_CHECK(cudaMemcpy(v.data(), b.ptr, v.size(), cudaMemcpyDeviceToHost));
      return v;
    };
    out.ys = bytes_of(ys_tagged);
    out.dys = bytes_of(dys);
    const std::vector<uint8_t> yb = bytes_of(y);
    out.y.resize(yb.size() / 2);
    std::memcpy(out.y.data(), yb.data(), yb.size());
    out.bytes = ex.bytes();
    out.ms = ex.exchange_ms();
  }
  CUDA_CHECK(cudaStreamDestroy(stream));
  return out;
}

// Runs run_rank on N simulated ranks (ep_ranks_test_util.h); a rank's failure aborts the group and fails the test.
std::vector<RankOutput> run_in_process(std::vector<RankInput>& in, const std::vector<std::vector<EpRowOrigin>>& o) {
  return run_simulated_ranks<RankOutput>(static_cast<int>(in.size()), [&](EpTransport& t) {
    return run_rank(t, in[static_cast<size_t>(t.rank())], o[static_cast<size_t>(t.rank())]);
  }, std::chrono::seconds(60));
}

struct EpScenario {
  std::vector<int64_t> M;
  std::vector<std::vector<int32_t>> topk;
  std::vector<RankInput> in;
  std::vector<std::vector<EpRowOrigin>> expected;
  EpScenario(int N, EpRowFormat f, uint64_t seed) {
    for (int s = 0; s < N; ++s) M.push_back(s == 1 ? 0 : 6 + 5 * s);  // uneven, rank 1 without tokens
    topk = random_ep_routing(M, kK, kE, {3, 4, 13}, seed);            // experts 3, 4, 13 receive nothing
    for (int s = 0; s < N; ++s) in.emplace_back(M[static_cast<size_t>(s)], topk[static_cast<size_t>(s)], f, seed * 10 + s);
    expected = ep_expected_rows(topk, M, kK, kE);
  }
};

void check_rank_outputs(EpScenario& su, std::vector<RankOutput>& out) {
  const int N = static_cast<int>(su.M.size());
  const int64_t El = kE / N;
  for (int r = 0; r < N; ++r) {
    SCOPED_TRACE(testing::Message() << "rank " << r << " of " << N);
    RankOutput& o = out[static_cast<size_t>(r)];
    const auto& want = su.expected[static_cast<size_t>(r)];
    ASSERT_EQ(o.recv_total, static_cast<int64_t>(want.size()));
    ASSERT_EQ(o.expert_rows.size(), 1u);
    for (size_t i = 0; i < want.size(); ++i) {
      RankInput& src = su.in[static_cast<size_t>(want[i].source)];
      ASSERT_EQ(o.expert_rows[0].wire_row(static_cast<int64_t>(i)), src.tokens.wire_row(want[i].token)) << "row " << i;
      const int64_t g = out[static_cast<size_t>(want[i].source)].row_of[static_cast<size_t>(want[i].token * kK + want[i].slot)];
      ASSERT_EQ(o.expert_grads[0].wire_row(static_cast<int64_t>(i)), src.grads.wire_row(g)) << "gradient row " << i;
    }
    // Combine: row row_of[t k + j] of the source holds token t's row tagged with slot j.
    RankInput& in = su.in[static_cast<size_t>(r)];
    for (int64_t t = 0; t < in.M; ++t)
      for (int64_t j = 0; j < kK; ++j) {
        std::vector<uint8_t> row = in.x.wire_row(t);
        row[0] = static_cast<uint8_t>(j);
        const size_t at = static_cast<size_t>(o.row_of[static_cast<size_t>(t * kK + j)]) * 2 * kD;
        ASSERT_EQ(0, std::memcmp(o.ys.data() + at, row.data(), row.size())) << "combine token " << t << " slot " << j;
        ASSERT_EQ(0, std::memcmp(o.dys.data() + at, row.data(), row.size())) << "combine_gradient " << t << " " << j;
      }
    // Bytes: rows for other ranks' experts cross the wire, rows for this rank's own experts are a local copy.
    int64_t to_self = 0;
    for (int32_t e : in.topk) to_self += e / El == r;
    const int64_t rb = ep_wire_row_bytes(in.tokens.format, kD);
    EXPECT_EQ(o.bytes[EpExchangeKind::counts].sent, 4 * El * (N - 1));
    EXPECT_EQ(o.bytes[EpExchangeKind::dispatch_gradient].sent, (in.M * kK - to_self) * ep_wire_row_bytes(EpRowFormat::fp8, kD));
    EXPECT_EQ(o.bytes[EpExchangeKind::combine].received, (in.M * kK - to_self) * 2 * kD * 2);  // two combines
    EXPECT_EQ(o.bytes[EpExchangeKind::dispatch].sent, (in.M * kK - to_self) * (rb + 2 * kD));  // tokens, then BF16 x
    ASSERT_EQ(o.ms.size(), static_cast<size_t>(kEpExchangeKinds));
    for (double ms : o.ms) EXPECT_TRUE(ms >= 0.0 && ms < 60e3) << ms;  // every kind was timed (events recorded)
  }
}

class EpCommGpu : public testing::TestWithParam<EpRowFormat> {};

TEST_P(EpCommGpu, SimulatedRanksMatchTheAllToAllModel) {
  FP4MOE_REQUIRE_DEVICE();
  for (int N : {1, 2, 4, 8}) {
    SCOPED_TRACE(testing::Message() << "N = " << N);
    EpScenario su(N, GetParam(), 40 + static_cast<uint64_t>(N));
    std::vector<RankOutput> out = run_in_process(su.in, su.expected);
    ASSERT_FALSE(HasFailure());
    check_rank_outputs(su, out);

    // The weighted round trip equals the single-rank result (the concatenated tokens on one GPU), bit for bit.
    std::vector<int32_t> topk;
    std::vector<uint8_t> x;
    std::vector<float> w;
    for (RankInput& in : su.in) {
      topk.insert(topk.end(), in.topk.begin(), in.topk.end());
      x.insert(x.end(), in.x.codes.begin(), in.x.codes.end());
      w.insert(w.end(), in.w.begin(), in.w.end());
    }
    const int64_t T = static_cast<int64_t>(w.size()) / kK;
    DeviceBuffer<int32_t> dtopk(topk.size()), counts(kE), offsets(kE + 1), row_of(topk.size()), assignment_of(topk.size());
    DeviceBuffer<uint8_t> dx(x.size());
    DeviceBuffer<float> dw(w.size());
    DeviceBuffer<bf16> xs(static_cast<size_t>(T * kK * kD)), y(static_cast<size_t>(T * kD));
    dtopk.upload(topk);
    dx.upload(x);
    dw.upload(w);
    expert_counts_and_offsets(dtopk.ptr, T, kK, kE, counts.ptr, offsets.ptr, nullptr);
    permute_map(dtopk.ptr, offsets.ptr, T, kK, kE, row_of.ptr, assignment_of.ptr, nullptr);
    permute_forward(reinterpret_cast<const bf16*>(dx.ptr), assignment_of.ptr, T, kK, kD, xs.ptr, nullptr);
    unpermute_forward(xs.ptr, dw.ptr, row_of.ptr, T, kK, kD, y.ptr, nullptr);
    std::vector<uint16_t> single(static_cast<size_t>(T * kD));
    CUDA_CHECK(cudaMemcpy(single.data(), y.ptr, single.size() * 2, cudaMemcpyDeviceToHost));
    size_t at = 0;
    for (size_t r = 0; r < out.size(); ++r) {
      const std::vector<uint16_t> want(single.begin() + static_cast<std::ptrdiff_t>(at),
                                       single.begin() + static_cast<std::ptrdiff_t>(at + out[r].y.size()));
      EXPECT_EQ(out[r].y, want) << "rank " << r;
      at += out[r].y.size();
    }
  }
}

// NCCL at world size 1 (a fresh unique id, ncclCommInitRank through NcclComm) gives what the in-process transport
// gives at N = 1, and every byte stays local.
TEST_P(EpCommGpu, NcclAtWorldSizeOneEqualsInProcess) {
  FP4MOE_REQUIRE_DEVICE();
  EpScenario su(1, GetParam(), 77);
  std::vector<RankOutput> ref = run_in_process(su.in, su.expected);
  ASSERT_FALSE(HasFailure());
  setenv("NCCL_NVLS_ENABLE", "0", 0);  // no NVLink multicast (the launcher's setting), unless the caller set it
  NcclComm comm = NcclComm::single_rank();
  NcclTransport transport(comm);
  RankOutput got = run_rank(transport, su.in[0], su.expected[0]);
  std::vector<RankOutput> outs;
  outs.push_back(std::move(got));
  check_rank_outputs(su, outs);
  EXPECT_EQ(outs[0].expert_rows[0].codes, ref[0].expert_rows[0].codes);
  EXPECT_EQ(outs[0].expert_rows[0].scales, ref[0].expert_rows[0].scales);
  EXPECT_EQ(outs[0].expert_grads[0].codes, ref[0].expert_grads[0].codes);
  EXPECT_EQ(outs[0].ys, ref[0].ys);
  EXPECT_EQ(outs[0].y, ref[0].y);
  EXPECT_EQ(outs[0].bytes.total().sent, 0);
  EXPECT_EQ(outs[0].bytes.total().to_self, ref[0].bytes.total().to_self);
  EXPECT_GT(outs[0].bytes.total().to_self, 0);
}

INSTANTIATE_TEST_SUITE_P(Formats, EpCommGpu,
                         testing::Values(EpRowFormat::bf16, EpRowFormat::fp8, EpRowFormat::mxfp4),
                         [](const testing::TestParamInfo<EpRowFormat>& i) { return ep_row_format_name(i.param); });

// A rank whose sizes disagree with its peer's fails every rank with a message naming the pair, never a hang.
TEST(EpCommGpuTransport, InProcessMismatchFailsAllRanks) {
  FP4MOE_REQUIRE_DEVICE();
  DeviceBuffer<uint8_t> a(64), b(64);
  const std::vector<std::string> errors = run_simulated_ranks<std::string>(2, [&](EpTransport& t) {
    // rank 0 sends 16 bytes to rank 1, which expects 8
    const std::vector<EpPeerBuffers> peers =
        t.rank() == 0 ? std::vector<EpPeerBuffers>{{a.ptr, 0, b.ptr, 0}, {a.ptr, 16, b.ptr, 0}}
                      : std::vector<EpPeerBuffers>{{a.ptr, 0, b.ptr, 8}, {a.ptr, 0, b.ptr, 0}};
    return error_message([&] { t.exchange(peers, nullptr); });
  }, std::chrono::seconds(20));
  for (const std::string& e : errors)
    EXPECT_NE(e.find("rank 0 sends 16 bytes to rank 1, which expects 8"), std::string::npos) << e;
}

// The group's log counts the bytes its copies moved in each exchange round, between distinct ranks and to each rank
// itself: one entry per exchange (none for an all-reduce), in order, cleared when taken.
TEST(EpCommGpuTransport, InProcessGroupLogsTheBytesOfEachExchange) {
  FP4MOE_REQUIRE_DEVICE();
  constexpr int N = 3;
  InProcessGroup group(N, std::chrono::seconds(20));
  DeviceBuffer<uint8_t> wire(N * 1024);
  DeviceBuffer<float> sums(N * 4);
  auto bytes = [](int s, int r) { return int64_t{(s + 1) * (r + 2)}; };  // rank s sends rank r this many
  run_in_process_ranks<int>(group, [&](EpTransport& t) {
    const int s = t.rank();
    std::vector<EpPeerBuffers> peers(N), none(N);
    for (int r = 0; r < N; ++r)
      peers[static_cast<size_t>(r)] = {wire.ptr + s * 1024 + r * 64, bytes(s, r), wire.ptr + s * 1024 + 512 + r * 64,
                                       bytes(r, s)};
    t.exchange(peers, nullptr);
    t.all_reduce_sum(sums.ptr + 4 * s, 4, nullptr);
    t.exchange(none, nullptr);
    t.wait(nullptr);
    return 0;
  });
  const std::vector<EpExchangeBytes> rounds = group.take_exchange_rounds();
  ASSERT_EQ(rounds.size(), 2u) << "two exchanges, the all-reduce not logged";
  int64_t between = 0, to_self = 0;
  for (int s = 0; s < N; ++s)
    for (int r = 0; r < N; ++r) (s == r ? to_self : between) += bytes(s, r);
  EXPECT_EQ(rounds[0].sent, between);
  EXPECT_EQ(rounds[0].received, between);
  EXPECT_EQ(rounds[0].to_self, to_self);
  EXPECT_EQ(rounds[1].sent + rounds[1].received + rounds[1].to_self, 0);
  EXPECT_TRUE(group.take_exchange_rounds().empty()) << "taking the log clears it";
}

// A rank that never posts: the others time out with a message naming it.
TEST(EpCommGpuTransport, InProcessMissingRankTimesOut) {
  FP4MOE_REQUIRE_DEVICE();
  InProcessGroup group(2, std::chrono::milliseconds(200));
  InProcessTransport t(group, 0);
  std::vector<EpPeerBuffers> peers(2);
  try {
    t.exchange(peers, nullptr);
    ADD_FAILURE() << "expected a timeout";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("waiting for rank(s) 1"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fp4moe::test
