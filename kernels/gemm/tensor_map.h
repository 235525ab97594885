// Tensor maps (CUtensorMap) of the bulk tensor copy engine (TMA, sm_90+): tiled views of tensors of rank 1 to 5.
//
// A map describes a tensor of `rank` dimensions, dims[0] innermost and contiguous, dimension i > 0 strides[i - 1]
// bytes apart (any order of strides: a map may walk a strided slice of a wider tensor), and the box one copy moves
// into shared memory, box[0] x ... x box[rank - 1] elements, stored densely in that order; elements of a box outside
// the tensor arrive as zeros. It is made on the host by the driver's cuTensorMapEncodeTiled, reached through the
// runtime's driver entry point, so no program links libcuda; the map is then passed to a kernel by value (a
// __grid_constant__ parameter). Source: CUDA Driver API, "Tensor Map Object Management"; PTX ISA, "Tensor Access
// Modes: Tiled". A tiled copy's innermost start coordinate must lie on 16 bytes (the engine raises an illegal
// instruction otherwise): the kernels' coordinates along dims[0] are multiples of 16 bytes.
//
// Rejects (fp4moe::Error naming `what`): a rank outside 1..5, a null or not 16-byte aligned base, a dimension of 0
// or above 2^32, a stride that is not a multiple of 16 bytes or is 2^40 or more, a box side of 0 or above 256 (a box
// may be larger than the tensor: the rest is zeros), an inner box of a byte count not a multiple of 16 (or above 128
// with the 128-byte swizzle), and any refusal of the driver (its CUresult number). make_tensor_map_2d also rejects
// a row stride below one row (inner * element bytes).
#pragma once

#include <cuda.h>

#include <cstdint>

namespace fp4moe {

// E4M3 codes travel as bytes, scales as fp32, attention tiles as bf16.
enum class TmaElem { u8, f32, bf16 };
enum class TmaSwizzle { none, swizzle_128b };  // 128B: the layout WGMMA's 128-byte swizzle mode reads

CUtensorMap make_tensor_map(const char* what, const void* base, TmaElem elem, int rank, const uint64_t* dims,
                            const uint64_t* strides, const uint32_t* box, TmaSwizzle swizzle);

// A 2-D row-major tensor [outer, inner], rows `row_bytes` apart, and a box [box_outer, box_inner].
CUtensorMap make_tensor_map_2d(const char* what, const void* base, TmaElem elem, uint64_t inner, uint64_t outer,
                               uint64_t row_bytes, uint32_t box_inner, uint32_t box_outer, TmaSwizzle swizzle);

}  // namespace fp4moe
