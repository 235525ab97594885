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

}  // namespace

CUtensorMap make_tensor_map_2d(const char* what, const void* base, TmaElem elem, uint64_t inner, uint64_t outer,
                               uint64_t row_bytes, uint32_t box_inner, uint32_t box_outer, TmaSwizzle swizzle) {
  const uint64_t elem_bytes = elem == TmaElem::u8 ? 1 : 4;
  FP4MOE_CHECK(base != nullptr && reinterpret_cast<uintptr_t>(base) % 16 == 0,
               "{}: tensor base must be a non-null 16-byte aligned device pointer, got {}", what, base);
  FP4MOE_CHECK(inner >= 1 && outer >= 1 && inner <= (uint64_t{1} << 32) && outer <= (uint64_t{1} << 32),
               "{}: tensor dimensions must be in [1, 2^32], got {} x {}", what, outer, inner);
  FP4MOE_CHECK(row_bytes % 16 == 0 && row_bytes >= inner * elem_bytes,
               "{}: row stride must be a multiple of 16 bytes and hold a row of {} bytes, got {}", what,
               inner * elem_bytes, row_bytes);
  FP4MOE_CHECK(box_inner >= 1 && box_inner <= 256 && box_outer >= 1 && box_outer <= 256,
               "{}: box sides must be in [1, 256], got {} x {}", what, box_outer, box_inner);
  const uint64_t box_bytes = box_inner * elem_bytes;
  FP4MOE_CHECK(box_bytes % 16 == 0 && (swizzle == TmaSwizzle::none || box_bytes <= 128),
               "{}: the box's inner side must be a multiple of 16 bytes (at most 128 with the 128-byte swizzle), "
               "got {} bytes", what, box_bytes);
  CUtensorMap map;
  const cuuint64_t dims[2] = {inner, outer};
  const cuuint64_t strides[1] = {row_bytes};
  const cuuint32_t box[2] = {box_inner, box_outer};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r = encode_tiled()(
      &map, elem == TmaElem::u8 ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2,
      const_cast<void*>(base), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      swizzle == TmaSwizzle::swizzle_128b ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  FP4MOE_CHECK(r == CUDA_SUCCESS, "{}: cuTensorMapEncodeTiled refused the {} x {} tensor (box {} x {}): CUresult {}",
               what, outer, inner, box_outer, box_inner, static_cast<int>(r));
  return map;
}

}  // namespace fp4moe
