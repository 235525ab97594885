// Tensor maps (CUtensorMap) of the bulk tensor copy engine (TMA, sm_90+) for 2-D row-major tensors.
//
// A map describes a tensor [outer, inner] (inner contiguous, rows `row_bytes` apart) and the box one copy moves
// into shared memory, [box_outer, box_inner] elements; elements of a box outside the tensor arrive as zeros. It is
// made on the host by the driver's cuTensorMapEncodeTiled, reached through the runtime's driver entry point, so no
// program links libcuda; the map is then passed to a kernel by value (a __grid_constant__ parameter). Source: CUDA
// Driver API, "Tensor Map Object Management"; PTX ISA, "Tensor Access Modes: Tiled".
//
// Rejects (fp4moe::Error naming `what`): a null or not 16-byte aligned base, a dimension of 0 or above 2^32, a row
// stride that is not a multiple of 16 or is below inner * element bytes, a box side of 0 or above 256 (a box may
// be larger than the tensor: the rest is zeros), an inner box of a byte count not a multiple of 16 (or above 128 with the 128-byte swizzle),
// and any refusal of the driver (its CUresult number).
#pragma once

#include <cuda.h>

#include <cstdint>

namespace fp4moe {

enum class TmaElem { u8, f32 };              // E4M3 codes travel as bytes; scales as fp32
enum class TmaSwizzle { none, swizzle_128b };  // 128B: the layout WGMMA's 128-byte swizzle mode reads

CUtensorMap make_tensor_map_2d(const char* what, const void* base, TmaElem elem, uint64_t inner, uint64_t outer,
                               uint64_t row_bytes, uint32_t box_inner, uint32_t box_outer, TmaSwizzle swizzle);

}  // namespace fp4moe
