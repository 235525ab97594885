#include "kernels/gemm/tensor_map.h"

#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include "kernels/common/check.h"

namespace fp4moe {

namespace {

// cuTensorMapEncodeTiled of the installed driver (ABI of CUDA 12.0), looked up once.
PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
    CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found));
#else
    CUDA_CHECK(cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &p, cudaEnableDefault, &found));
#endif
    FP4MOE_CHECK(found == cudaDriverEntryPointSuccess && p != nullptr,
                 "cuTensorMapEncodeTiled not found in the CUDA driver (a driver for CUDA 12.0 or newer is needed)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

uint64_t elem_bytes(TmaElem elem) { return elem == TmaElem::u8 ? 1 : elem == TmaElem::bf16 ? 2 : 4; }

CUtensorMapDataType data_type(TmaElem elem) {
  switch (elem) {
    case TmaElem::u8: return CU_TENSOR_MAP_DATA_TYPE_UINT8;
    case TmaElem::bf16: return CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    case TmaElem::f32: break;
  }
  return CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
}

}  // namespace

CUtensorMap make_tensor_map(const char* what, const void* base, TmaElem elem, int rank, const uint64_t* dims,
                            const uint64_t* strides, const uint32_t* box, TmaSwizzle swizzle) {
  FP4MOE_CHECK(rank >= 1 && rank <= 5, "{}: tensor map rank must be in [1, 5], got {}", what, rank);
  FP4MOE_CHECK(base != nullptr && reinterpret_cast<uintptr_t>(base) % 16 == 0,
               "{}: tensor base must be a non-null 16-byte aligned device pointer, got {}", what, base);
  cuuint64_t g_dims[5], g_strides[4];
  cuuint32_t g_box[5], elem_strides[5];
  for (int i = 0; i < rank; ++i) {
    FP4MOE_CHECK(dims[i] >= 1 && dims[i] <= (uint64_t{1} << 32), "{}: tensor dimension {} must be in [1, 2^32], got {}",
                 what, i, dims[i]);
    FP4MOE_CHECK(box[i] >= 1 && box[i] <= 256, "{}: box side {} must be in [1, 256], got {}", what, i, box[i]);
    g_dims[i] = dims[i];
    g_box[i] = box[i];
    elem_strides[i] = 1;
  }
  for (int i = 0; i + 1 < rank; ++i) {
    FP4MOE_CHECK(strides[i] % 16 == 0 && strides[i] < (uint64_t{1} << 40),
                 "{}: the stride of dimension {} must be a multiple of 16 bytes below 2^40, got {}", what, i + 1,
                 strides[i]);
    g_strides[i] = strides[i];
  }
  const uint64_t box_bytes = box[0] * elem_bytes(elem);
  FP4MOE_CHECK(box_bytes % 16 == 0 && (swizzle == TmaSwizzle::none || box_bytes <= 128),
               "{}: the box's inner side must be a multiple of 16 bytes (at most 128 with the 128-byte swizzle), "
               "got {} bytes", what, box_bytes);
  CUtensorMap map;
  const CUresult r = encode_tiled()(
      &map, data_type(elem), static_cast<cuuint32_t>(rank), const_cast<void*>(base), g_dims, g_strides, g_box,
      elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      swizzle == TmaSwizzle::swizzle_128b ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  FP4MOE_CHECK(r == CUDA_SUCCESS,
               "{}: cuTensorMapEncodeTiled refused the rank-{} tensor (innermost {} x {} elements, box {} x {}): "
               "CUresult {}", what, rank, dims[0], rank > 1 ? dims[1] : 1, box[0], rank > 1 ? box[1] : 1,
               static_cast<int>(r));
  return map;
}

CUtensorMap make_tensor_map_2d(const char* what, const void* base, TmaElem elem, uint64_t inner, uint64_t outer,
                               uint64_t row_bytes, uint32_t box_inner, uint32_t box_outer, TmaSwizzle swizzle) {
  FP4MOE_CHECK(row_bytes >= inner * elem_bytes(elem), "{}: row stride must hold a row of {} bytes, got {}", what,
               inner * elem_bytes(elem), row_bytes);
  const uint64_t dims[2] = {inner, outer};
  const uint32_t box[2] = {box_inner, box_outer};
  return make_tensor_map(what, base, elem, 2, dims, &row_bytes, box, swizzle);
}

}  // namespace fp4moe
