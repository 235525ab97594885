#include "kernels/gemm/grouped_runs.h"

#include <algorithm>

#include "kernels/gemm/group_row_scales.h"

namespace fp4moe {

std::vector<int64_t> group_runs(const int32_t* host_offsets, int64_t G, int streams) {
  const int64_t S = streams, M = host_offsets[G];
  std::vector<int64_t> first(static_cast<size_t>(S + 1), G);
  first[0] = 0;
  for (int64_t s = 1, g = 0; s < S; ++s) {
    while (g < G && host_offsets[g] < s * M / S) ++g;
    first[static_cast<size_t>(s)] = g;
  }
  return first;
}

std::vector<GroupRows> rows_to_recompute(const int32_t* host_offsets, int64_t G, const std::vector<int64_t>& first) {
  std::vector<GroupRows> rows;
  const int64_t M = host_offsets[G], S = static_cast<int64_t>(first.size()) - 1;
  int64_t planned_to = 0;  // rows below this are already planned (two runs may spill into the same row)
  for (int64_t s = 0; s + 1 < S; ++s) {
    int64_t written_to = 0;  // end of the rows run s's GEMMs write
    for (int64_t g = first[s]; g < first[s + 1]; ++g) {
      const int64_t off = host_offsets[g], rows_g = host_offsets[g + 1] - off;
      if (rows_g > 0) written_to = std::max(written_to, off + group_main_rows(off, rows_g, M));
    }
    const int64_t from = std::max<int64_t>(host_offsets[first[s + 1]], planned_to);
    for (int64_t g = first[s + 1]; g < G && host_offsets[g] < written_to; ++g) {
      const int64_t lo = std::max<int64_t>(from, host_offsets[g]);
      const int64_t hi = std::min<int64_t>(written_to, host_offsets[g + 1]);
      if (hi > lo) rows.push_back(GroupRows{g, lo, hi - lo});
    }
    planned_to = std::max(planned_to, written_to);
  }
  return rows;
}

}  // namespace fp4moe
