// Host-side placement of each group in an FP8 column tensor over ragged groups (layouts.h): where its codes and
// scales start. Used by the CPU references, the dequantization and the tests; the GPU kernels compute the same
// placement on the device (ragged_token_blocks.cuh).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/quant/layouts.h"

namespace fp4moe {

struct Fp8ColGroup {
  int64_t row0;           // first row of the group in the [M, K] input (offsets[g])
  int64_t rows;           // M_g
  int64_t ld;             // L_g = round_up(M_g, 16): row length of the group's [K, L_g] codes
  int64_t token_blocks;   // ceil(M_g / 128): rows of the group's [ceil(M_g/128), K] scales
  int64_t codes_offset;   // K * P_g, P_g = sum_{h<g} L_h
  int64_t scales_offset;  // K * Q_g, Q_g = sum_{h<g} ceil(M_h / 128)
};

// offsets: host int32 [G+1], already validated (validate_group_offsets). K: features.
inline std::vector<Fp8ColGroup> fp8_col_groups(const int32_t* offsets, int64_t G, int64_t K) {
  std::vector<Fp8ColGroup> groups(static_cast<size_t>(G));
  int64_t p = 0, q = 0;
  for (int64_t g = 0; g < G; ++g) {
    int64_t rows = int64_t{offsets[g + 1]} - offsets[g];
    int64_t blocks = (rows + kFp8Block - 1) / kFp8Block;
    groups[g] = {offsets[g], rows, fp8_col_group_ld(rows), blocks, K * p, K * q};
    p += fp8_col_group_ld(rows);
    q += blocks;
  }
  return groups;
}

}  // namespace fp4moe
