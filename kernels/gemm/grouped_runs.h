// Host plan of the grouped GEMMs on concurrent streams (grouped_gemm.h "Streams"): which groups each stream runs,
// and which output rows of an FP8 Fprop/Dgrad must be computed again after the streams join. Pure functions of
// the routing split, so that the CPU tests check them on any split.
#pragma once

#include <cstdint>
#include <vector>

namespace fp4moe {

// Runs of consecutive groups for `streams` concurrent streams: run s holds groups [first[s], first[s+1]),
// first[0] = 0, first[streams] = G. Run s (s >= 1) starts at the first group whose first token is at or past
// s * M / streams (M = host_offsets[G]), so each run starts at a group boundary near an equal share of tokens;
// runs may be empty (a group of many tokens takes the share of the runs it covers). host_offsets: [G+1], a valid
// split (kernels/common/offsets.h). Rejects nothing: callers validate the split and 1 <= streams.
std::vector<int64_t> group_runs(const int32_t* host_offsets, int64_t G, int streams);

// Rows [first, first + count) of `group`'s output.
struct GroupRows {
  int64_t group = 0, first = 0, count = 0;
};

// The rows an FP8 row GEMM over the runs must recompute after the join. cuBLASLt's block-scaled GEMMs need a
// token count that is a multiple of 4, so group g's GEMM writes group_main_rows(offsets[g], M_g, M) rows
// (group_row_scales.h): up to 3 rows past its own, which belong to later groups. Within a run those groups are
// computed later on the same stream and overwrite them; a later run may already have written them. So: every
// row at or past the first token of run s+1 that a GEMM of run s (any of its groups) wrote, grouped by the group
// that owns it, each row once (at most 3 rows per run boundary; they may cross whole runs of fewer than 3 rows,
// and two runs may spill into the same row). Empty for one stream. The same arguments as group_runs; `first` is group_runs' result.
std::vector<GroupRows> rows_to_recompute(const int32_t* host_offsets, int64_t G, const std::vector<int64_t>& first);

}  // namespace fp4moe
