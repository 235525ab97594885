// The tile walk of the persistent grouped GEMM (kernels/gemm/grouped_tiles.h) and the argument checks of its
// launchers (kernels/gemm/grouped_gemm_sm90.h), which run before any CUDA call: both testable without a GPU.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/common/check.h"
#include "kernels/gemm/grouped_gemm_sm90.h"
#include "kernels/gemm/grouped_tiles.h"
#include "tests/common/launch_check_util.h"

namespace fp4moe {
namespace {

using test::expect_rejected;
using test::fake_device_pointer;

constexpr int32_t kBlockM = 128;

struct Walk {
  std::vector<int32_t> o, start;
};

Walk walk_of(const std::vector<int32_t>& raw, int32_t M, int32_t col_blocks) {
  const int32_t G = static_cast<int32_t>(raw.size()) - 1;
  Walk w{std::vector<int32_t>(G + 1), std::vector<int32_t>(G + 1)};
  grouped_tile_starts(raw.data(), G, M, kBlockM, col_blocks, w.o.data(), w.start.data());
  return w;
}

// Every tile of the walk: inside its group's rows and [0, M), on the block grid, row block fastest within a group;
// every (row, column block) of every group covered exactly once.
void expect_exact_cover(const std::vector<int32_t>& raw, int32_t M, int32_t block_n, int32_t col_blocks,
                        const std::string& what) {
  SCOPED_TRACE(what);
  const int32_t G = static_cast<int32_t>(raw.size()) - 1;
  const Walk w = walk_of(raw, M, col_blocks);
  std::vector<int> covered(static_cast<size_t>(M) * col_blocks, 0);
  GroupedTile previous{-1, 0, 0, 0};
  for (int32_t t = 0; t < w.start[G]; ++t) {
    const GroupedTile tile = grouped_tile(t, w.o.data(), w.start.data(), G, kBlockM, block_n, col_blocks);
    ASSERT_GE(tile.group, 0);
    ASSERT_LT(tile.group, G);
    ASSERT_EQ(tile.row_end, w.o[tile.group + 1]) << "tile " << t;
    ASSERT_GE(tile.row0, w.o[tile.group]) << "tile " << t;
    ASSERT_LT(tile.row0, tile.row_end) << "tile " << t << " starts past its group's end";
    ASSERT_EQ((tile.row0 - w.o[tile.group]) % kBlockM, 0) << "tile " << t;
    ASSERT_EQ(tile.col0 % block_n, 0) << "tile " << t;
    ASSERT_LT(tile.col0 / block_n, col_blocks) << "tile " << t;
    ASSERT_LE(tile.row_end, M);
    if (previous.group == tile.group && previous.col0 == tile.col0) {
      EXPECT_EQ(tile.row0, previous.row0 + kBlockM) << "tile " << t << ": row blocks run fastest within a group";
    }
    for (int32_t r = tile.row0; r < std::min(tile.row0 + kBlockM, tile.row_end); ++r)
      ++covered[static_cast<size_t>(r) * col_blocks + tile.col0 / block_n];
    previous = tile;
  }
  for (int32_t g = 0; g < G; ++g)
    for (int32_t r = w.o[g]; r < w.o[g + 1]; ++r)
      for (int32_t c = 0; c < col_blocks; ++c)
        ASSERT_EQ(covered[static_cast<size_t>(r) * col_blocks + c], 1)
            << "row " << r << " of group " << g << ", column block " << c;
  for (int32_t r = 0; r < w.o[0]; ++r) ASSERT_EQ(covered[static_cast<size_t>(r) * col_blocks], 0) << "row " << r;
  for (int32_t r = w.o[G]; r < M; ++r) ASSERT_EQ(covered[static_cast<size_t>(r) * col_blocks], 0) << "row " << r;
}

std::vector<int32_t> offsets_of_sizes(const std::vector<int32_t>& sizes) {
  std::vector<int32_t> o(sizes.size() + 1, 0);
  for (size_t g = 0; g < sizes.size(); ++g) o[g + 1] = o[g] + sizes[g];
  return o;
}

TEST(GroupedTiles, ValidSplitsAreCoveredExactlyOnce) {
  // Empty groups (first, middle, last), one-row groups, sizes around and not multiples of 128.
  expect_exact_cover(offsets_of_sizes({0, 1, 127, 128, 129, 0, 255, 256, 257, 1, 0}), 1182, 128, 4, "crafted");
  expect_exact_cover(offsets_of_sizes({5000}), 5000, 256, 16, "one group");
  expect_exact_cover(offsets_of_sizes({0, 0, 0}), 0, 128, 3, "no rows");
  std::mt19937 rng(7);
  for (int32_t G : {8, 32, 256, 1024}) {
    std::vector<int32_t> sizes(static_cast<size_t>(G));
    for (auto& s : sizes) s = rng() % 4 == 0 ? 0 : static_cast<int32_t>(rng() % (G <= 32 ? 600 : 90));
    const std::vector<int32_t> o = offsets_of_sizes(sizes);
    expect_exact_cover(o, o.back(), 128, 2, fmt::format("random, G={}", G));
    const Walk w = walk_of(o, o.back(), 2);
    EXPECT_EQ(w.o, o) << "a valid split is left as it is";
  }
}

TEST(GroupedTiles, OffsetsEndingBeforeMLeaveTheRestUntouched) {
  std::vector<int32_t> o = offsets_of_sizes({3, 200, 0, 77});
  expect_exact_cover(o, 500, 128, 3, "rows 280..499 in no group");
}

TEST(GroupedTiles, BadOffsetsAreMadeSafe) {
  // Negative, decreasing and past-M offsets: clamped to [0, M] and made non-decreasing; tiles stay inside [0, M).
  const std::vector<int32_t> raw = {-5, 40, 30, 900, 100, 2000, -1};
  const Walk w = walk_of(raw, 600, 2);
  EXPECT_EQ(w.o, (std::vector<int32_t>{0, 40, 40, 600, 600, 600, 600}));
  expect_exact_cover(raw, 600, 128, 2, "bad offsets");
}

TEST(GroupedTiles, TileStartsCountRowBlocksTimesColumnBlocks) {
  const Walk w = walk_of(offsets_of_sizes({129, 0, 128, 1}), 258, 5);
  EXPECT_EQ(w.start, (std::vector<int32_t>{0, 10, 10, 15, 20}));
}

// ---- the launchers' argument checks (no CUDA call before them) ----------------------------------------------------

TEST(GroupedGemmSm90Checks, RejectsBeforeAnyCudaCall) {
  const Fp8RowOperand x{fake_device_pointer<const uint8_t>(0x20000), fake_device_pointer<const float>(0x30000)};
  const Fp8BlockStack w{fake_device_pointer<const uint8_t>(0x40000), fake_device_pointer<const float>(0x50000)};
  const auto* offsets = fake_device_pointer<const int32_t>(0x10000);
  bf16* y = fake_device_pointer<bf16>(0x90000);
  auto fprop = [&](int64_t M, int64_t N, int64_t K, int64_t G, Sm90GemmConfig c = {}) {
    grouped_fprop_fp8_sm90(x, w, M, N, K, offsets, G, y, nullptr, c);
  };
  auto dgrad = [&](int64_t M, int64_t N, int64_t K, int64_t G) {
    grouped_dgrad_fp8_sm90(x, w, M, N, K, offsets, G, y, nullptr);
  };
  expect_rejected([&] { fprop(256, 576, 7168, 8); }, "N and K must be positive multiples of 128");
  expect_rejected([&] { fprop(256, 4096, 2000, 8); }, "got N=4096 K=2000");
  expect_rejected([&] { dgrad(256, 7168, 576, 8); }, "grouped_dgrad_fp8_sm90: N and K must be positive multiples");
  expect_rejected([&] { fprop(256, 4096, 7168, 0); }, "1 <= G <= 1024");
  expect_rejected([&] { fprop(256, 4096, 7168, 1025); }, "1 <= G <= 1024");
  expect_rejected([&] { fprop(-1, 4096, 7168, 8); }, "0 <= M");
  expect_rejected([&] { fprop(256, 4096 + 128, 7168, 8, Sm90GemmConfig{256}); }, "block_n");
  expect_rejected([&] { fprop(256, 4096, 7168, 8, Sm90GemmConfig{64}); }, "block_n");
  expect_rejected([&] { fprop(256, 4096, 7168, 8, Sm90GemmConfig{256, true}); },
                  "overlap_promotion runs the 128-wide tile only");
  expect_rejected([&] { grouped_fprop_fp8_sm90(x, w, 256, 4096, 7168, nullptr, 8, y, nullptr); }, "offsets");
  expect_rejected([&] {
    grouped_fprop_fp8_sm90(Fp8RowOperand{x.codes + 8, x.scales}, w, 256, 4096, 7168, offsets, 8, y, nullptr);
  }, "16-byte aligned");
  expect_rejected([&] { grouped_fprop_fp8_sm90(x, w, 256, 4096, 7168, offsets, 8, nullptr, nullptr); },
                  "16-byte aligned");
  // No rows: nothing to launch, after the checks (null operands are then fine).
  EXPECT_NO_THROW(grouped_fprop_fp8_sm90(Fp8RowOperand{}, Fp8BlockStack{}, 0, 4096, 7168, offsets, 8, nullptr,
                                         nullptr));
  EXPECT_NE(grouped_gemm_sm90_unsupported(4096, 7000, 8).find("multiples of 128"), std::string::npos);
}

}  // namespace
}  // namespace fp4moe
