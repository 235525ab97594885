// The host plan of the grouped GEMMs on concurrent streams (kernels/gemm/grouped_runs.h) against a brute-force
// model of which rows every GEMM writes: a row is at risk when a GEMM of another run than its own group's writes
// it (runs run in any order against each other, in order within themselves); exactly those rows, each under its
// own group, must be recomputed.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "kernels/gemm/group_row_scales.h"
#include "kernels/gemm/grouped_runs.h"

namespace fp4moe {
namespace {

std::vector<int32_t> offsets_of(const std::vector<int32_t>& sizes) {
  std::vector<int32_t> o(sizes.size() + 1, 0);
  for (size_t g = 0; g < sizes.size(); ++g) o[g + 1] = o[g] + sizes[g];
  return o;
}

// Checks group_runs and rows_to_recompute for one split and stream count; returns the rows recomputed.
int64_t check_plan(const std::vector<int32_t>& sizes, int streams) {
  const std::vector<int32_t> off = offsets_of(sizes);
  const int64_t G = static_cast<int64_t>(sizes.size()), M = off[G];
  const std::vector<int64_t> first = group_runs(off.data(), G, streams);
  // Runs: ordered, covering every group once.
  EXPECT_EQ(first.size(), static_cast<size_t>(streams) + 1);
  EXPECT_EQ(first.front(), 0);
  EXPECT_EQ(first.back(), G);
  for (size_t s = 0; s + 1 < first.size(); ++s) EXPECT_LE(first[s], first[s + 1]);
  std::vector<int64_t> run_of(static_cast<size_t>(G)), owner(static_cast<size_t>(M));
  for (int64_t s = 0; s < streams; ++s)
    for (int64_t g = first[s]; g < first[s + 1]; ++g) run_of[g] = s;
  for (int64_t g = 0; g < G; ++g)
    for (int64_t r = off[g]; r < off[g + 1]; ++r) owner[r] = g;
  // Brute force: every row a GEMM of another run writes, and no foreign write from the same run after its owner.
  std::set<std::pair<int64_t, int64_t>> at_risk;  // (row, owner)
  for (int64_t g = 0; g < G; ++g) {
    const int64_t rows = off[g + 1] - off[g];
    if (rows == 0) continue;
    const int64_t n_main = group_main_rows(off[g], rows, M);
    EXPECT_LE(off[g] + n_main, M) << "a GEMM past the tensor";
    for (int64_t r = off[g] + rows; r < off[g] + n_main; ++r) {
      EXPECT_GT(owner[r], g) << "a spill must reach only later groups";
      if (run_of[owner[r]] != run_of[g]) at_risk.insert({r, owner[r]});
    }
  }
  const std::vector<GroupRows> plan = rows_to_recompute(off.data(), G, first);
  std::set<std::pair<int64_t, int64_t>> planned;
  for (const GroupRows& p : plan) {
    EXPECT_GT(p.count, 0);
    for (int64_t r = p.first; r < p.first + p.count; ++r) {
      EXPECT_TRUE(r >= 0 && r < M && owner[r] == p.group) << "row " << r << " recomputed under group " << p.group;
      EXPECT_TRUE(planned.insert({r, p.group}).second) << "row " << r << " recomputed twice";
    }
  }
  EXPECT_EQ(planned, at_risk);
  EXPECT_LE(static_cast<int64_t>(planned.size()), 3 * (streams - 1));
  return static_cast<int64_t>(planned.size());
}

TEST(GroupedRuns, CraftedSplitsRecomputeExactlyTheRowsAtRisk) {
  // Run 0's groups of 301 and 2 rows (padded to 304 and 4) write two rows of run 1's first group.
  EXPECT_EQ(check_plan({301, 0, 2, 297, 5, 1}, 2), 2);
  // Tiny groups: spills that cross whole runs.
  check_plan({1, 1, 1, 1}, 4);
  check_plan({598, 1, 4}, 2);
  check_plan({5, 0, 0, 0, 3}, 8);
  check_plan({1001}, 4);  // one group, more streams than groups
  check_plan({0, 0, 7}, 3);
  EXPECT_EQ(check_plan({162, 0, 2577, 446, 0, 83}, 1), 0) << "one stream recomputes nothing";
}

TEST(GroupedRuns, RandomSplitsRecomputeExactlyTheRowsAtRisk) {
  std::mt19937 rng(7);
  int64_t recomputed = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int G = 1 + static_cast<int>(rng() % 40);
    std::vector<int32_t> sizes(static_cast<size_t>(G));
    for (auto& s : sizes) {
      const int kind = static_cast<int>(rng() % 4);
      s = kind == 0 ? 0 : kind == 1 ? static_cast<int32_t>(1 + rng() % 3) : static_cast<int32_t>(rng() % 700);
    }
    const int streams = 1 + static_cast<int>(rng() % 8);
    SCOPED_TRACE(testing::Message() << "trial " << trial << ", " << G << " groups, " << streams << " streams");
    recomputed += check_plan(sizes, streams);
    if (HasFailure()) break;
  }
  EXPECT_GT(recomputed, 0) << "the random splits never made a run boundary spill";
}

}  // namespace
}  // namespace fp4moe
