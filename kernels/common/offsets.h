// Ragged expert groups: int32 offsets [G+1] with offsets[0] = 0, non-decreasing, offsets[G] = M.
#pragma once

#include <cstdint>

namespace fp4moe {

// Host-side validation before a launch. host_offsets: host int32 [G+1]; M: rows of the grouped tensor (tokens).
// Throws fp4moe::Error naming the first bad entry and what was expected, for: G < 1, null offsets,
// offsets[0] != 0, offsets[g+1] < offsets[g] (empty groups are allowed), offsets[G] != M.
// `what` names the caller in the message (e.g. "mxfp4_row_to_fp8_col").
void validate_group_offsets(const int32_t* host_offsets, int64_t G, int64_t M, const char* what);

}  // namespace fp4moe
