// The grouped-row map of ep_routing.h on the device: one block per (source, local expert) segment; thread 0 sums
// the segment's two starts from the count matrix (O(ep E_l), E <= a few hundred), the block writes its rows.
#include "kernels/common/check.h"
#include "trainer/comm/ep_routing.h"

namespace fp4moe {
namespace {

__global__ void grouped_rows_kernel(const int32_t* counts, int ep, int64_t E_l, int32_t* grouped_of) {
  const int64_t seg = blockIdx.x, s = seg / E_l, e = seg % E_l;
  __shared__ int64_t recv_begin, grouped_begin;
  if (threadIdx.x == 0) {
    int64_t p = 0, g = 0;
    for (int64_t q = 0; q < seg; ++q) p += counts[q];                     // segments before, in receive order
    for (int64_t q = 0; q < ep * E_l; ++q)
      if (q % E_l < e || (q % E_l == e && q / E_l < s)) g += counts[q];   // earlier experts; same expert, earlier source
    recv_begin = p;
    grouped_begin = g;
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < counts[seg]; i += blockDim.x)
    grouped_of[recv_begin + i] = static_cast<int32_t>(grouped_begin + i);
}

}  // namespace

void ep_grouped_rows(const int32_t* recv_counts, int ep, int64_t E_l, int64_t R, int32_t* grouped_of,
                     cudaStream_t stream) {
  FP4MOE_CHECK(ep >= 1 && E_l >= 1, "ep_grouped_rows: ep ({}) and E_l ({}) must be >= 1", ep, E_l);
  FP4MOE_CHECK(R >= 0, "ep_grouped_rows: received rows must be >= 0, got {}", R);
  if (R == 0) return;
  FP4MOE_CHECK(recv_counts && grouped_of, "ep_grouped_rows: null pointer for {} rows", R);
  grouped_rows_kernel<<<static_cast<unsigned>(ep * E_l), 256, 0, stream>>>(recv_counts, ep, E_l, grouped_of);
  CUDA_CHECK_LAUNCH();
}

}  // namespace fp4moe
