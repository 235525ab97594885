// CPU reference of the token embedding (embedding.h) and the shape checks shared with the GPU launchers.
#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/formats/formats.h"
#include "kernels/nn/embedding.h"
#include "kernels/nn/nn_checks.h"

namespace fp4moe {

namespace nn_detail {

void check_embedding_shape(const char* what, int64_t M, int64_t V, int64_t d) {
  check_at_least(what, "M", M, 0);
  check_at_least(what, "V", V, 1);
  check_at_least(what, "d", d, 1);
  FP4MOE_CHECK(M < (int64_t{1} << 31), "{}: M={} tokens must be below 2^31 (int32 positions)", what, M);
  FP4MOE_CHECK(V < (int64_t{1} << 31), "{}: V={} must be below 2^31 (int32 token ids)", what, V);
  FP4MOE_CHECK(d <= (int64_t{1} << 23), "{}: d={} exceeds the 2^23 columns the launch grid covers", what, d);
  check_elements(what, M, d);
  check_elements(what, V, d);
}

}  // namespace nn_detail

int64_t embedding_forward_ref(const int32_t* tokens, int64_t M, const bf16* table, int64_t V, int64_t d, bf16* out) {
  nn_detail::check_embedding_shape("embedding_forward_ref", M, V, d);
  int64_t invalid = 0;
  for (int64_t m = 0; m < M; ++m) {
    const int64_t v = tokens[m];
    if (v < 0 || v >= V) {
      ++invalid;
      for (int64_t c = 0; c < d; ++c) out[m * d + c] = bf16_from_bits(0);
    } else {
      std::memcpy(static_cast<void*>(out + m * d), static_cast<const void*>(table + v * d),
                  static_cast<size_t>(d) * sizeof(bf16));
    }
  }
  return invalid;
}

void embedding_backward_ref(const int32_t* tokens, int64_t M, const bf16* dout, int64_t V, int64_t d, float* grad) {
  nn_detail::check_embedding_shape("embedding_backward_ref", M, V, d);
  // Positions of each token id in increasing order (what the GPU's stable sort yields).
  std::vector<std::vector<int64_t>> positions(static_cast<size_t>(V));
  for (int64_t m = 0; m < M; ++m)
    if (tokens[m] >= 0 && tokens[m] < V) positions[tokens[m]].push_back(m);
  std::vector<float> acc(static_cast<size_t>(d));
  for (int64_t v = 0; v < V; ++v) {
    if (positions[v].empty()) continue;
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t m : positions[v])
      for (int64_t c = 0; c < d; ++c) acc[c] += bf16_bits_to_f32(bf16_bits(dout[m * d + c]));
    for (int64_t c = 0; c < d; ++c) grad[v * d + c] += acc[c];
  }
}

}  // namespace fp4moe
