// CPU tests of the expert-parallel exchange's pieces (trainer/comm/): wire row sizes, pack / unpack references,
// the routing tables, and a host model of the whole dispatch and combine built from those references, checked
// against the single-rank permutation (tests/common/ep_comm_test_util.h). The device versions run in
// test_ep_comm_gpu.cpp.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "kernels/common/check.h"
#include "kernels/quant/layouts.h"
#include "tests/common/ep_comm_test_util.h"
#include "tests/common/trainer_test_util.h"
#include "kernels/nn/router.h"
#include "trainer/comm/ep_exchange.h"
#include "trainer/comm/ep_routing.h"
#include "trainer/comm/rank_sum.h"
#include "trainer/comm/transport.h"
#include "trainer/memory/estimate.h"
#include "trainer/model/ep_traffic.h"
#include "trainer/model/recipe.h"

namespace fp4moe::test {
namespace {

const EpRowFormat kFormats[] = {EpRowFormat::bf16, EpRowFormat::fp8, EpRowFormat::mxfp4};

TEST(EpCommRef, WireRowBytesFollowTheFormats) {
  for (int64_t d : {32, 160, 7168}) {
    EXPECT_EQ(ep_wire_row_bytes(EpRowFormat::bf16, d), 2 * d);
    EXPECT_EQ(ep_wire_row_bytes(EpRowFormat::fp8, d), d + 4 * ((d + 127) / 128));
    EXPECT_EQ(ep_wire_row_bytes(EpRowFormat::mxfp4, d), d / 2 + d / 32);
    for (const Recipe& r : {Recipe::bf16, Recipe::fp8, Recipe::mxfp4}) {
      EXPECT_EQ(ep_wire_row_bytes(ep_dispatch_format(r), d), expert_parallel_row_bytes(r, d).dispatch);
      EXPECT_EQ(ep_wire_row_bytes(ep_backward_dispatch_format(r), d), expert_parallel_row_bytes(r, d).backward_dispatch);
      EXPECT_EQ(ep_wire_row_bytes(EpRowFormat::bf16, d), expert_parallel_row_bytes(r, d).combine);
    }
  }
  EXPECT_EQ(ep_backward_dispatch_format(Recipe::mxfp4), EpRowFormat::fp8);
  EXPECT_THROW(ep_wire_row_bytes(EpRowFormat::mxfp4, 48), Error);
  EXPECT_THROW(ep_wire_row_bytes(EpRowFormat::bf16, 0), Error);
  Recipe odd = Recipe::fp8;
  odd.wgrad = GemmPrecision::bf16;
  EXPECT_THROW(ep_dispatch_format(odd), Error);
}

// A row's bits survive pack then unpack into another order; fp8 padding scales of the destination become 1.0.
TEST(EpCommRef, PackUnpackRoundTripsBitForBit) {
  for (EpRowFormat f : kFormats) {
    SCOPED_TRACE(ep_row_format_name(f));
    const int64_t n = 7, d = 160;
    HostRows src(f, n, d, 11), dst(f, n, d, 12);
    const std::vector<int32_t> perm = {3, 0, 6, 1, 5, 2, 4};
    std::vector<uint8_t> wire(static_cast<size_t>(n * ep_wire_row_bytes(f, d)));
    ep_pack_rows_ref(src.view(), perm.data(), 1, n, wire.data());
    ep_unpack_rows_ref(wire.data(), n, perm.data(), dst.view());
    for (int64_t r = 0; r < n; ++r) EXPECT_EQ(dst.wire_row(r), src.wire_row(r)) << "row " << r;
    if (f == EpRowFormat::fp8) {
      const auto* s = reinterpret_cast<const float*>(dst.scales.data());
      for (int64_t b = 0; b < 2; ++b) EXPECT_EQ(s[fp8_row_scale_index(7, b, n)], 1.0f);
    }
    // The wire row is the codes, then the scales in block order.
    const std::vector<uint8_t> w = src.wire_row(2);
    const int64_t cb = ep_detail::row_code_bytes(f, d);
    EXPECT_EQ(0, std::memcmp(w.data(), src.codes.data() + 2 * cb, static_cast<size_t>(cb)));
    if (f == EpRowFormat::fp8) {
      EXPECT_EQ(0, std::memcmp(w.data() + cb + 4, src.scales.data() + 4 * fp8_row_scale_index(2, 1, n), 4));
    }
    if (f == EpRowFormat::mxfp4) {
      EXPECT_EQ(w[static_cast<size_t>(cb + 3)], src.scales[2 * 5 + 3]);
    }
  }
}

TEST(EpCommRef, PackAndUnpackRejectBadArguments) {
  HostRows src(EpRowFormat::fp8, 4, 128, 1);
  std::vector<uint8_t> wire(4 * 132);
  const int32_t outside[] = {0, 4};
  EXPECT_THROW(ep_pack_rows_ref(src.view(), outside, 1, 2, wire.data()), Error);
  EXPECT_THROW(ep_pack_rows_ref(src.view(), nullptr, 1, 5, wire.data()), Error);  // more rows than the tensor
  EXPECT_THROW(ep_pack_rows_ref(src.view(), nullptr, 0, 2, wire.data()), Error);  // divisor 0
  EXPECT_THROW(ep_pack_rows_ref(src.view(), nullptr, 1, 2, nullptr), Error);
  EXPECT_THROW(ep_unpack_rows_ref(wire.data(), 5, nullptr, src.view()), Error);  // 5 rows into 4
  EpRows no_scales = src.view();
  no_scales.scales = nullptr;
  EXPECT_THROW(ep_unpack_rows_ref(wire.data(), 1, nullptr, no_scales), Error);
}

TEST(EpCommRef, CountsRejectInconsistentTables) {
  EpCounts c;
  c.ep = 2;
  c.E = 4;
  c.E_l = 2;
  c.offsets = {0, 1, 1, 3, 5};
  c.recv_counts = {1, 0, 2, 3};
  EXPECT_NO_THROW(c.validate());
  EXPECT_EQ(c.send_rows(1), 4);
  EXPECT_EQ(c.recv_row_begin(1), 1);
  EXPECT_EQ(c.recv_total(), 6);
  EXPECT_EQ(c.local_offsets(), (std::vector<int32_t>{0, 3, 6}));
  c.offsets[2] = 0;
  EXPECT_THROW(c.validate(), Error);
  c.offsets[2] = 1;
  c.recv_counts[1] = -1;
  EXPECT_THROW(c.validate(), Error);
  c.rank = 2;
  EXPECT_THROW(c.validate(), Error);
  std::vector<int32_t> g(6);
  EXPECT_THROW(ep_grouped_rows_ref(c.recv_counts.data(), 2, 2, g.data()), Error);
}

TEST(EpCommRef, ExchangeBytesSplitWireAndSelf) {
  int a = 0, b = 0;
  std::vector<EpPeerBuffers> peers = {{&a, 8, &b, 12}, {&a, 4, &b, 4}, {&a, 0, nullptr, 16}};
  EXPECT_THROW(ep_exchange_bytes(peers, 1, 3), Error);  // null recv for 16 bytes
  peers[2].recv = &b;
  const EpExchangeBytes x = ep_exchange_bytes(peers, 1, 3);
  EXPECT_EQ(x.sent, 8);
  EXPECT_EQ(x.received, 28);
  EXPECT_EQ(x.to_self, 4);
  EXPECT_THROW(ep_exchange_bytes(peers, 1, 2), Error);  // 3 entries for 2 ranks
  peers[1].recv_bytes = 8;
  EXPECT_THROW(ep_exchange_bytes(peers, 1, 3), Error);  // self: sends 4, receives 8
}

// A transport of two ranks that never moves anything: EpExchange's constructor checks run before any device call.
struct TwoRankTransport : EpTransport {
  int rank() const override { return 0; }
  int world_size() const override { return 2; }
  EpExchangeBytes exchange(const std::vector<EpPeerBuffers>&, cudaStream_t) override {
    throw Error("TwoRankTransport moves nothing");
  }
  void all_reduce_sum(float*, int64_t, cudaStream_t) override { throw Error("TwoRankTransport sums nothing"); }
  void wait(cudaStream_t) override {}
};

TEST(EpCommRef, ExchangeRejectsExpertsThatDoNotSplitOverTheRanks) {
  TwoRankTransport t;
  auto message = [&t](int64_t E, int64_t d) -> std::string {
    try {
      EpExchange x(t, E, d);
    } catch (const Error& e) {
      return e.what();
    }
    return "accepted";
  };
  const std::string bound = fmt::format("must lie in [1, {}] and split evenly over 2 ranks", kRouterMaxExperts);
  EXPECT_NE(message(15, 64).find("15 experts " + bound), std::string::npos) << message(15, 64);
  EXPECT_NE(message(0, 64).find("0 experts " + bound), std::string::npos);
  const int64_t many = 2 * kRouterMaxExperts;  // even, but more than the router counts
  EXPECT_NE(message(many, 64).find(std::to_string(many) + " experts " + bound), std::string::npos)
      << message(many, 64);
  EXPECT_NE(message(16, 0).find("hidden size d must be >= 1"), std::string::npos);
}

// The host model of one dispatch and combine over ep ranks, from the CPU references, as EpExchange runs it.
struct HostEp {
  int ep;
  int64_t E, El, k, d;
  std::vector<int64_t> M;
  std::vector<std::vector<int32_t>> topk, counts, offsets, row_of, assignment_of, grouped_of;
  std::vector<EpCounts> c;

  HostEp(const std::vector<int64_t>& tokens, int64_t experts, int64_t top_k, int64_t hidden,
         const std::vector<int>& empty, uint64_t seed)
      : ep(static_cast<int>(tokens.size())), E(experts), El(experts / static_cast<int64_t>(tokens.size())),
        k(top_k), d(hidden), M(tokens) {
    topk = random_ep_routing(M, k, E, empty, seed);
    for (int s = 0; s < ep; ++s) {
      const int64_t R = M[static_cast<size_t>(s)] * k;
      counts.emplace_back(E);
      offsets.emplace_back(E + 1);
      row_of.emplace_back(R);
      assignment_of.emplace_back(R);
      permute_map_ref(topk[static_cast<size_t>(s)].data(), M[static_cast<size_t>(s)], k, E, counts.back().data(),
                      offsets.back().data(), row_of.back().data(), assignment_of.back().data());
    }
    for (int r = 0; r < ep; ++r) {  // the counts exchange
      EpCounts x;
      x.ep = ep;
      x.rank = r;
      x.E = E;
      x.E_l = El;
      x.offsets = offsets[static_cast<size_t>(r)];
      for (int s = 0; s < ep; ++s)
        for (int64_t e = 0; e < El; ++e) x.recv_counts.push_back(counts[static_cast<size_t>(s)][r * El + e]);
      x.validate();
      grouped_of.emplace_back(x.recv_total());
      ep_grouped_rows_ref(x.recv_counts.data(), ep, El, grouped_of.back().data());
      c.push_back(std::move(x));
    }
  }

  // Dispatch of token rows (gather by assignment_of / k) into each rank's grouped expert rows.
  std::vector<HostRows> dispatch(std::vector<HostRows>& tokens) {
    const EpRowFormat f = tokens[0].format;
    const int64_t rb = ep_wire_row_bytes(f, d);
    std::vector<std::vector<uint8_t>> send;
    for (int s = 0; s < ep; ++s) {
      send.emplace_back(static_cast<size_t>(M[static_cast<size_t>(s)] * k * rb));
      ep_pack_rows_ref(tokens[static_cast<size_t>(s)].view(), assignment_of[static_cast<size_t>(s)].data(), k,
                       M[static_cast<size_t>(s)] * k, send.back().data());
    }
    std::vector<HostRows> out;
    for (int r = 0; r < ep; ++r) {
      std::vector<uint8_t> recv;
      for (int s = 0; s < ep; ++s) {
        const EpCounts& cs = c[static_cast<size_t>(s)];
        const auto* b = send[static_cast<size_t>(s)].data() + cs.send_row_begin(r) * rb;
        recv.insert(recv.end(), b, b + cs.send_rows(r) * rb);
      }
      const int64_t R = c[static_cast<size_t>(r)].recv_total();
      EXPECT_EQ(static_cast<int64_t>(recv.size()), R * rb);
      out.emplace_back(f, R, d, 1000 + static_cast<uint64_t>(r));
      ep_unpack_rows_ref(recv.data(), R, grouped_of[static_cast<size_t>(r)].data(), out.back().view());
    }
    return out;
  }

  // Combine of BF16 grouped rows back to each source, in permute order.
  std::vector<HostRows> combine(std::vector<HostRows>& grouped) {
    const int64_t rb = 2 * d;
    std::vector<std::vector<uint8_t>> send;
    for (int r = 0; r < ep; ++r) {
      const int64_t R = c[static_cast<size_t>(r)].recv_total();
      send.emplace_back(static_cast<size_t>(R * rb));
      ep_pack_rows_ref(grouped[static_cast<size_t>(r)].view(), grouped_of[static_cast<size_t>(r)].data(), 1, R,
                       send.back().data());
    }
    std::vector<HostRows> out;
    for (int s = 0; s < ep; ++s) {
      out.emplace_back(EpRowFormat::bf16, M[static_cast<size_t>(s)] * k, d, 2000 + static_cast<uint64_t>(s));
      for (int r = 0; r < ep; ++r) {
        const EpCounts& cr = c[static_cast<size_t>(r)];
        std::memcpy(out.back().codes.data() + c[static_cast<size_t>(s)].send_row_begin(r) * rb,
                    send[static_cast<size_t>(r)].data() + cr.recv_row_begin(s) * rb,
                    static_cast<size_t>(cr.recv_rows(s) * rb));
      }
    }
    return out;
  }
};

// Uneven loads, empty experts and a rank without tokens; k = 3 of E = 16 experts.
HostEp make_host_ep(int ep, uint64_t seed) {
  std::vector<int64_t> M;
  for (int s = 0; s < ep; ++s) M.push_back(s == 1 ? 0 : 5 + 3 * s);
  return HostEp(M, 16, 3, 64, {2, 9, 10}, seed);
}

TEST(EpCommRef, DispatchDeliversTheSingleRankRowsGroupedByExpert) {
  for (int ep : {1, 2, 4, 8})
    for (EpRowFormat f : kFormats) {
      SCOPED_TRACE(testing::Message() << "ep " << ep << " " << ep_row_format_name(f));
      HostEp h = make_host_ep(ep, 7 + static_cast<uint64_t>(ep));
      std::vector<HostRows> tokens;
      for (int s = 0; s < ep; ++s) tokens.emplace_back(f, h.M[static_cast<size_t>(s)], h.d, 100 + s);
      std::vector<HostRows> got = h.dispatch(tokens);
      const auto expected = ep_expected_rows(h.topk, h.M, h.k, h.E);
      for (int r = 0; r < ep; ++r) {
        const auto& want = expected[static_cast<size_t>(r)];
        ASSERT_EQ(got[static_cast<size_t>(r)].rows, static_cast<int64_t>(want.size())) << "rank " << r;
        for (size_t i = 0; i < want.size(); ++i)
          ASSERT_EQ(got[static_cast<size_t>(r)].wire_row(static_cast<int64_t>(i)),
                    tokens[static_cast<size_t>(want[i].source)].wire_row(want[i].token))
              << "rank " << r << " row " << i;
        // local offsets: the grouped rows per local expert, as the single-rank counts say
        std::vector<int32_t> per_expert(static_cast<size_t>(h.El + 1), 0);
        for (int s = 0; s < ep; ++s)
          for (int64_t t = 0; t < h.M[static_cast<size_t>(s)] * h.k; ++t) {
            const int32_t e = h.topk[static_cast<size_t>(s)][static_cast<size_t>(t)];
            if (e / h.El == r) ++per_expert[static_cast<size_t>(e % h.El + 1)];
          }
        std::partial_sum(per_expert.begin(), per_expert.end(), per_expert.begin());
        EXPECT_EQ(h.c[static_cast<size_t>(r)].local_offsets(), per_expert) << "rank " << r;
      }
    }
}

TEST(EpCommRef, CombineReturnsEachSlotToItsSourceInPermuteOrder) {
  for (int ep : {1, 2, 4, 8}) {
    SCOPED_TRACE(testing::Message() << "ep " << ep);
    HostEp h = make_host_ep(ep, 31 + static_cast<uint64_t>(ep));
    // Expert outputs that name their row: BF16 rows of the token's own bytes with the slot in the first element.
    std::vector<HostRows> tokens;
    for (int s = 0; s < ep; ++s) tokens.emplace_back(EpRowFormat::bf16, h.M[static_cast<size_t>(s)], h.d, 300 + s);
    std::vector<HostRows> grouped = h.dispatch(tokens);
    const auto expected = ep_expected_rows(h.topk, h.M, h.k, h.E);
    for (int r = 0; r < ep; ++r)
      for (size_t i = 0; i < expected[static_cast<size_t>(r)].size(); ++i)
        grouped[static_cast<size_t>(r)].codes[i * static_cast<size_t>(2 * h.d)] =
            static_cast<uint8_t>(expected[static_cast<size_t>(r)][i].slot);
    std::vector<HostRows> back = h.combine(grouped);
    for (int s = 0; s < ep; ++s)
      for (int64_t t = 0; t < h.M[static_cast<size_t>(s)]; ++t)
        for (int64_t j = 0; j < h.k; ++j) {
          std::vector<uint8_t> want = tokens[static_cast<size_t>(s)].wire_row(t);
          want[0] = static_cast<uint8_t>(j);
          EXPECT_EQ(back[static_cast<size_t>(s)].wire_row(h.row_of[static_cast<size_t>(s)][static_cast<size_t>(t * h.k + j)]),
                    want)
              << "source " << s << " token " << t << " slot " << j;
        }
  }
}

// Bytes ep_pack_rows_ref writes for n rows of src: two packs into buffers poisoned differently agree on every byte
// they wrote and keep their poison after; returns the length of the written prefix (failing on a gap in it).
int64_t bytes_packed(const EpRows& src, const int32_t* gather, int64_t divisor, int64_t n) {
  const size_t cap = static_cast<size_t>(n * ep_wire_row_bytes(src.format, src.d)) + 64;
  std::vector<uint8_t> a(cap, 0x00), b(cap, 0xFF);
  ep_pack_rows_ref(src, gather, divisor, n, a.data());
  ep_pack_rows_ref(src, gather, divisor, n, b.data());
  size_t written = cap;
  while (written > 0 && a[written - 1] == 0x00 && b[written - 1] == 0xFF) --written;
  for (size_t i = 0; i < written; ++i) EXPECT_EQ(a[i], b[i]) << "byte " << i << " of the wire left unwritten";
  return static_cast<int64_t>(written);
}

// The byte accounting of a layer step's payload: what the packs write over the ranks, per exchange, is what
// ep_step_bytes_by_formats says (the formats' arithmetic that bench_ep_comm and the comm_volume scenario put beside
// the bytes measured on the GPU): the dispatch every rank's routed rows in the recipe's format, gathered from its
// tokens; the combine every rank's received rows in BF16; the backward the same rows in the backward formats; the
// counts E_l int32 from every rank to every rank.
TEST(EpCommRef, PackedBytesOfALayerStepFollowTheFormatsArithmetic) {
  for (int ep : {1, 2, 4, 8})
    for (int64_t d : {int64_t{160}, int64_t{7168}})
      for (const Recipe& recipe : {Recipe::bf16, Recipe::fp8, Recipe::mxfp4}) {
        SCOPED_TRACE(testing::Message() << "ep " << ep << " d " << d << " " << recipe_name(recipe));
        std::vector<int64_t> M;
        for (int s = 0; s < ep; ++s) M.push_back(s == 1 ? 0 : 5 + 3 * s);
        HostEp h(M, 16, 3, d, {2, 9, 10}, 50 + static_cast<uint64_t>(ep));
        std::array<int64_t, kEpExchangeKinds> packed{};
        auto add = [&](EpExchangeKind k, int64_t bytes) { packed[static_cast<size_t>(k)] += bytes; };
        int64_t routed = 0;
        for (int s = 0; s < ep; ++s) {
          const size_t i = static_cast<size_t>(s);
          const int64_t n = h.M[i] * h.k, R = h.c[i].recv_total();
          routed += n;
          HostRows tokens(ep_dispatch_format(recipe), h.M[i], d, 10 + i);
          HostRows grads(ep_backward_dispatch_format(recipe), n, d, 20 + i);
          HostRows out(EpRowFormat::bf16, R, d, 30 + i), dx(EpRowFormat::bf16, R, d, 40 + i);
          add(EpExchangeKind::counts, static_cast<int64_t>(h.c[i].recv_counts.size()) * 4);
          add(EpExchangeKind::dispatch, bytes_packed(tokens.view(), h.assignment_of[i].data(), h.k, n));
          add(EpExchangeKind::combine, bytes_packed(out.view(), h.grouped_of[i].data(), 1, R));
          add(EpExchangeKind::dispatch_gradient, bytes_packed(grads.view(), nullptr, 1, n));
          add(EpExchangeKind::combine_gradient, bytes_packed(dx.view(), h.grouped_of[i].data(), 1, R));
        }
        EXPECT_EQ(packed, ep_step_bytes_by_formats(recipe, d, ep, 16, routed));
      }
  EXPECT_NE(test::error_message([] { ep_step_bytes_by_formats(Recipe::bf16, 64, 3, 16, 10); })
                .find("16 routed experts do not split evenly over 3 ranks"), std::string::npos);
  EXPECT_NE(test::error_message([] { ep_step_bytes_by_formats(Recipe::bf16, 64, 2, 16, -1); })
                .find("routed rows must be >= 0"), std::string::npos);
}

// The in-process all-reduce's reference: the sum in rank order, one FP32 rounding per addition, the same bits in
// every buffer; the order is visible (1 + 2^-24 + 2^-24 rounds to 1 twice, where 2^-24 + 2^-24 + 1 gives 1 + 2^-23).
TEST(EpCommRef, RankSumAddsInRankOrderIntoEveryBuffer) {
  const float u = std::ldexp(1.0f, -24);
  std::vector<float> a{1.0f, u, 3.0f}, b{u, u, -1.0f}, c{u, 1.0f, 0.5f};
  float* buffers[] = {a.data(), b.data(), c.data()};
  rank_sum_ref(buffers, 3, 3);
  const std::vector<float> want{1.0f, 1.0f + 2 * u, 2.5f};
  EXPECT_EQ(a, want);
  EXPECT_EQ(b, want);
  EXPECT_EQ(c, want);
  EXPECT_NE(test::error_message([&] { rank_sum_ref(buffers, 0, 3); }).find("0 ranks, expected 1 to 64"),
            std::string::npos);
  float* with_null[] = {a.data(), nullptr};
  EXPECT_NE(test::error_message([&] { rank_sum_ref(with_null, 2, 3); }).find("rank 1's buffer of 3 elements is null"),
            std::string::npos);
  rank_sum_ref(with_null, 2, 0);  // nothing to sum: no buffer read
}

}  // namespace
}  // namespace fp4moe::test
