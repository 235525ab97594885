// Token embedding kernels (embedding.h).
//   forward:  grid-stride over M x d / kVec chunks (kVec = 8: one 16-byte copy; 1 otherwise).
//   backward: (1) keys[m] = token id (V for an invalid one, sorted last and skipped), positions[m] = m;
//             (2) cub::DeviceRadixSort::SortPairs over the low bits that hold 0..V (stable: equal ids keep their
//                 position order); (3) one block per sorted index i and 256 columns: when i starts a run of equal
//                 ids, the block sums the run's dout rows in order (FP32) and adds the sum to grad once; other
//                 blocks exit at once. Every grad element is written by exactly one thread.
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>

#include "kernels/common/check.h"
#include "kernels/nn/embedding.h"
#include "kernels/nn/nn_checks.h"

namespace fp4moe {
namespace {

constexpr int kThreads = 256;

int grid_for(int64_t units) {
  return static_cast<int>(std::clamp<int64_t>(ceil_div(units, kThreads), 1, int64_t{132} * 16));
}

template <int kVec>
__global__ void __launch_bounds__(kThreads)
embedding_forward_kernel(const int32_t* __restrict__ tokens, int64_t M, const bf16* __restrict__ table, int64_t V,
                         int64_t d, bf16* __restrict__ out, int32_t* error_flag) {
  const int64_t row_chunks = d / kVec, units = M * row_chunks;
  for (int64_t u = int64_t{blockIdx.x} * kThreads + threadIdx.x; u < units; u += int64_t{gridDim.x} * kThreads) {
    const int64_t m = u / row_chunks, c = (u % row_chunks) * kVec;
    const int64_t v = tokens[m];
    const bool valid = v >= 0 && v < V;
    if (!valid && c == 0 && error_flag) *error_flag = 1;  // every writer stores the same value
    if constexpr (kVec == 8) {
      const uint4 x = valid ? *reinterpret_cast<const uint4*>(table + v * d + c) : make_uint4(0, 0, 0, 0);
      *reinterpret_cast<uint4*>(out + m * d + c) = x;
    } else {
      out[m * d + c] = valid ? table[v * d + c] : __ushort_as_bfloat16(0);
    }
  }
}

__global__ void __launch_bounds__(kThreads)
embedding_keys_kernel(const int32_t* __restrict__ tokens, int64_t M, int64_t V, uint32_t* __restrict__ keys,
                      int32_t* __restrict__ positions) {
  for (int64_t m = int64_t{blockIdx.x} * kThreads + threadIdx.x; m < M; m += int64_t{gridDim.x} * kThreads) {
    const int64_t v = tokens[m];
    keys[m] = static_cast<uint32_t>(v >= 0 && v < V ? v : V);
    positions[m] = static_cast<int32_t>(m);
  }
}

// grid (M, ceil(d / kThreads)): block x = sorted index i, block y = a group of kThreads columns.
__global__ void __launch_bounds__(kThreads)
embedding_accumulate_kernel(const uint32_t* __restrict__ keys, const int32_t* __restrict__ positions, int64_t M,
                            const bf16* __restrict__ dout, int64_t V, int64_t d, float* __restrict__ grad) {
  const int64_t i = blockIdx.x;
  const uint32_t key = keys[i];
  if (key >= V || (i > 0 && keys[i - 1] == key)) return;  // invalid id, or not the start of its run
  const int64_t c = int64_t{blockIdx.y} * kThreads + threadIdx.x;
  if (c >= d) return;
  float acc = 0.0f;
  for (int64_t j = i; j < M && keys[j] == key; ++j) acc += __bfloat162float(dout[int64_t{positions[j]} * d + c]);
  grad[int64_t{key} * d + c] += acc;
}

// Bits of the sort keys 0..V.
int key_bits(int64_t V) {
  int bits = 1;
  while ((int64_t{1} << bits) <= V) ++bits;
  return bits;
}

struct BackwardWorkspace {
  int64_t array_bytes = 0;  // one [M] 32-bit array, rounded up to 256 bytes
  size_t sort_bytes = 0;    // cub's temporary storage
  int64_t total() const { return 4 * array_bytes + static_cast<int64_t>(sort_bytes); }
};

int64_t sort_array_bytes(int64_t M) { return M == 0 ? 0 : round_up(M * 4, 256); }

BackwardWorkspace backward_workspace(int64_t M, int64_t V) {
  BackwardWorkspace ws;
  if (M == 0) return ws;
  ws.array_bytes = sort_array_bytes(M);
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, ws.sort_bytes, static_cast<const uint32_t*>(nullptr),
                                             static_cast<uint32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                             static_cast<int32_t*>(nullptr), static_cast<int>(M), 0, key_bits(V)));
  return ws;
}

}  // namespace

void embedding_forward(const int32_t* tokens, int64_t M, const bf16* table, int64_t V, int64_t d, bf16* out,
                       int32_t* error_flag, cudaStream_t stream) {
  const char* what = "embedding_forward";
  nn_detail::check_embedding_shape(what, M, V, d);
  if (M == 0) return;
  nn_detail::check_not_null(what, "tokens", tokens);
  nn_detail::check_not_null(what, "table", table);
  nn_detail::check_not_null(what, "out", out);
  nn_detail::check_aligned(what, "tokens", tokens, 4);
  nn_detail::check_aligned(what, "table", table, 2);
  nn_detail::check_aligned(what, "out", out, 2);
  if (error_flag) nn_detail::check_aligned(what, "error_flag", error_flag, 4);
  if (d % 8 == 0 && nn_detail::is_aligned(table, 16) && nn_detail::is_aligned(out, 16))
    embedding_forward_kernel<8><<<grid_for(M * d / 8), kThreads, 0, stream>>>(tokens, M, table, V, d, out, error_flag);
  else
    embedding_forward_kernel<1><<<grid_for(M * d), kThreads, 0, stream>>>(tokens, M, table, V, d, out, error_flag);
  CUDA_CHECK_LAUNCH();
}

int64_t embedding_backward_array_bytes(int64_t M) {
  FP4MOE_CHECK(M >= 0, "embedding_backward_array_bytes: M must be >= 0, got {}", M);
  return 4 * sort_array_bytes(M);
}

int64_t embedding_backward_workspace_bytes(int64_t M, int64_t V) {
  nn_detail::check_embedding_shape("embedding_backward_workspace_bytes", M, V, 1);
  return backward_workspace(M, V).total();
}

void embedding_backward(const int32_t* tokens, int64_t M, const bf16* dout, int64_t V, int64_t d, float* grad,
                        void* workspace, int64_t workspace_bytes, cudaStream_t stream) {
  const char* what = "embedding_backward";
  nn_detail::check_embedding_shape(what, M, V, d);
  if (M == 0) return;
  nn_detail::check_not_null(what, "tokens", tokens);
  nn_detail::check_not_null(what, "dout", dout);
  nn_detail::check_not_null(what, "grad", grad);
  nn_detail::check_not_null(what, "workspace", workspace);
  nn_detail::check_aligned(what, "tokens", tokens, 4);
  nn_detail::check_aligned(what, "dout", dout, 2);
  nn_detail::check_aligned(what, "grad", grad, 4);
  nn_detail::check_aligned(what, "workspace", workspace, 256);
  const BackwardWorkspace ws = backward_workspace(M, V);
  FP4MOE_CHECK(workspace_bytes >= ws.total(),
               "{}: workspace of {} bytes is below the {} bytes needed for M={} V={} "
               "(embedding_backward_workspace_bytes)",
               what, workspace_bytes, ws.total(), M, V);
  char* base = static_cast<char*>(workspace);
  auto* keys_in = reinterpret_cast<uint32_t*>(base);
  auto* keys_out = reinterpret_cast<uint32_t*>(base + ws.array_bytes);
  auto* pos_in = reinterpret_cast<int32_t*>(base + 2 * ws.array_bytes);
  auto* pos_out = reinterpret_cast<int32_t*>(base + 3 * ws.array_bytes);
  void* sort_storage = base + 4 * ws.array_bytes;

  embedding_keys_kernel<<<grid_for(M), kThreads, 0, stream>>>(tokens, M, V, keys_in, pos_in);
  CUDA_CHECK_LAUNCH();
  size_t sort_bytes = ws.sort_bytes;
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(sort_storage, sort_bytes, keys_in, keys_out, pos_in, pos_out,
                                             static_cast<int>(M), 0, key_bits(V), stream));
  const dim3 grid(static_cast<unsigned>(M), static_cast<unsigned>(ceil_div(d, kThreads)));
  embedding_accumulate_kernel<<<grid, kThreads, 0, stream>>>(keys_out, pos_out, M, dout, V, d, grad);
  CUDA_CHECK_LAUNCH();
}

}  // namespace fp4moe
