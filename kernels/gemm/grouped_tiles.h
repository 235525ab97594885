// Output tiles of a grouped GEMM over ragged row groups, numbered for a persistent kernel that reads the group offsets
// on the device (grouped_gemm_sm90.h, grouped_gemm_simt.h). Host and device share these functions (the CPU tests walk
// them).
//
// Groups: int32 offsets [G+1] over the M rows of the output, group g = rows [o[g], o[g+1]). The offsets are made
// safe first, whatever they hold: clamped to [0, M] and made non-decreasing (a running maximum), so that no tile
// reaches outside [0, M) even for a bad split; for a valid split (0 = o[0] <= ... <= o[G] <= M) they are unchanged.
// Tiles: group g has ceil(M_g / block_m) row blocks times col_blocks column blocks (none when empty); tile_start[g]
// = the tiles of groups before g, tile_start[G] = all tiles. Inside a group the row block runs fastest, so that
// the CTAs working at the same time share the column block's weights (and the group's rows) in L2.
#pragma once

#include <cstdint>

#include "kernels/formats/formats.h"

namespace fp4moe {

struct GroupedTile {
  int32_t group;    // g
  int32_t row0;     // first output row of the tile (o[g] + row block * block_m)
  int32_t row_end;  // o[g+1]: rows row0.. below it are the group's (a tile may read later rows, never stores them)
  int32_t col0;     // first output column (column block * block_n)
};

// o[i] of a split made safe: clamp(raw, 0, M), at least the previous safe offset.
FP4MOE_HD int32_t safe_group_offset(int32_t raw, int32_t previous_safe, int32_t M) {
  const int32_t c = raw < 0 ? 0 : (raw > M ? M : raw);
  return c < previous_safe ? previous_safe : c;
}

// Tiles of a group of `rows` rows.
FP4MOE_HD int32_t group_tile_count(int32_t rows, int32_t block_m, int32_t col_blocks) {
  return (rows + block_m - 1) / block_m * col_blocks;
}

// The safe offsets o [G+1] and tile_start [G+1] of raw offsets [G+1], one group after the other (the kernel
// computes the same with a warp-wide scan).
FP4MOE_HD void grouped_tile_starts(const int32_t* raw, int32_t G, int32_t M, int32_t block_m, int32_t col_blocks,
                                   int32_t* o, int32_t* tile_start) {
  int32_t previous = 0, tiles = 0;
  for (int32_t i = 0; i <= G; ++i) {
    o[i] = previous = safe_group_offset(raw[i], previous, M);
    if (i > 0) tiles += group_tile_count(o[i] - o[i - 1], block_m, col_blocks);
    tile_start[i] = tiles;
  }
}

// Tile t (0 <= t < tile_start[G]) from safe offsets o [G+1] and tile_start [G+1].
FP4MOE_HD GroupedTile grouped_tile(int32_t t, const int32_t* o, const int32_t* tile_start, int32_t G,
                                   int32_t block_m, int32_t block_n, int32_t col_blocks) {
  // The last g with tile_start[g] <= t: a non-empty group, since tile_start[g + 1] > t.
  int32_t lo = 0, hi = G;
  while (hi - lo > 1) {
    const int32_t mid = (lo + hi) / 2;
    if (tile_start[mid] <= t) lo = mid;
    else hi = mid;
  }
  const int32_t local = t - tile_start[lo];
  const int32_t row_blocks = (tile_start[lo + 1] - tile_start[lo]) / col_blocks;
  return GroupedTile{lo, o[lo] + local % row_blocks * block_m, o[lo + 1], local / row_blocks * block_n};
}

}  // namespace fp4moe
