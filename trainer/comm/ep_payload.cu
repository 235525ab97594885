// Pack / unpack kernels of the expert-parallel exchanges (ep_payload.h): one block per wire row, threads over the
// row's bytes (codes as 4-byte words where the row and the tensor allow it, scales byte by byte).
#include "kernels/common/check.h"
#include "kernels/formats/formats.h"
#include "trainer/comm/ep_payload.h"

namespace fp4moe {
namespace {

constexpr int kThreads = 256;

// Moves one row between tensor row r of (format, rows, d, codes, scales) and wire_row; kToWire picks the direction.
template <bool kToWire>
__device__ void move_row(EpRowFormat f, int64_t rows, int64_t d, uint8_t* codes, uint8_t* scales, int64_t r,
                         uint8_t* wire_row) {
  const int64_t cb = ep_detail::row_code_bytes(f, d), ss = ep_detail::scale_size(f);
  uint8_t* row = codes + r * cb;
  const bool words = cb % 4 == 0 && reinterpret_cast<uintptr_t>(row) % 4 == 0 &&
                     reinterpret_cast<uintptr_t>(wire_row) % 4 == 0;
  if (words) {
    for (int64_t j = threadIdx.x; j < cb / 4; j += blockDim.x) {
      if (kToWire) reinterpret_cast<uint32_t*>(wire_row)[j] = reinterpret_cast<const uint32_t*>(row)[j];
      else reinterpret_cast<uint32_t*>(row)[j] = reinterpret_cast<const uint32_t*>(wire_row)[j];
    }
  } else {
    for (int64_t j = threadIdx.x; j < cb; j += blockDim.x) {
      if (kToWire) wire_row[j] = row[j];
      else row[j] = wire_row[j];
    }
  }
  const int64_t sb = ep_detail::scales_per_row(f, d) * ss;
  for (int64_t j = threadIdx.x; j < sb; j += blockDim.x) {
    uint8_t* s = scales + ep_detail::scale_offset(f, r, j / ss, rows, d) + j % ss;
    if (kToWire) wire_row[cb + j] = *s;
    else *s = wire_row[cb + j];
  }
}

__global__ void pack_kernel(EpRows src, const int32_t* gather, int64_t divisor, int64_t row_bytes, uint8_t* wire) {
  const int64_t i = blockIdx.x;
  const int64_t r = gather ? gather[i] / divisor : i;
  move_row<true>(src.format, src.rows, src.d, static_cast<uint8_t*>(src.codes), static_cast<uint8_t*>(src.scales), r,
                 wire + i * row_bytes);
}

__global__ void unpack_kernel(const uint8_t* wire, const int32_t* scatter, EpRows dst, int64_t row_bytes) {
  const int64_t i = blockIdx.x;
  const int64_t r = scatter ? scatter[i] : i;
  move_row<false>(dst.format, dst.rows, dst.d, static_cast<uint8_t*>(dst.codes), static_cast<uint8_t*>(dst.scales), r,
                  const_cast<uint8_t*>(wire) + i * row_bytes);
}

// fp8: 1.0 into the padding scales, rows rows .. round_up(rows, 4) of every block.
__global__ void fp8_padding_scales_kernel(float* scales, int64_t rows, int64_t blocks) {
  const int64_t pad = fp8_row_scale_ld(rows) - rows;
  for (int64_t j = threadIdx.x; j < pad * blocks; j += blockDim.x)
    scales[fp8_row_scale_index(rows + j % pad, j / pad, rows)] = 1.0f;
}

// One block per row, threads over the row's elements.
__global__ void fp8_rows_to_bf16_kernel(const uint8_t* codes, const float* scales, int64_t rows, int64_t d, bf16* dst) {
  const int64_t r = blockIdx.x;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    const float v = e4m3_to_f32(codes[r * d + j]) * scales[fp8_row_scale_index(r, j / kFp8Block, rows)];
    // The reference's rounding; a NaN (an E4M3 NaN code or scale) as the one quiet NaN 0x7FC0, whatever payload
    // the multiplication left.
    dst[r * d + j] = __ushort_as_bfloat16(v != v ? uint16_t{0x7FC0} : f32_to_bf16_bits(v));
  }
}

}  // namespace

void ep_fp8_rows_to_bf16(const EpRows& src, bf16* dst, cudaStream_t stream) {
  ep_detail::check_fp8_to_bf16(src, dst);
  if (src.rows == 0) return;
  fp8_rows_to_bf16_kernel<<<static_cast<unsigned>(src.rows), kThreads, 0, stream>>>(
      static_cast<const uint8_t*>(src.codes), static_cast<const float*>(src.scales), src.rows, src.d, dst);
  CUDA_CHECK_LAUNCH();
}

void ep_pack_rows(const EpRows& src, const int32_t* gather, int64_t divisor, int64_t n, uint8_t* wire,
                  cudaStream_t stream) {
  ep_detail::check_pack(src, gather, divisor, n, wire);
  if (n == 0) return;
  pack_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(src, gather, divisor,
                                                                  ep_wire_row_bytes(src.format, src.d), wire);
  CUDA_CHECK_LAUNCH();
}

void ep_unpack_rows(const uint8_t* wire, int64_t n, const int32_t* scatter, const EpRows& dst, cudaStream_t stream) {
  ep_detail::check_unpack(wire, n, dst);
  if (n > 0) {
    unpack_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(wire, scatter, dst,
                                                                      ep_wire_row_bytes(dst.format, dst.d));
    CUDA_CHECK_LAUNCH();
  }
  if (dst.format == EpRowFormat::fp8 && dst.rows > 0 && dst.rows % 4 != 0) {
    fp8_padding_scales_kernel<<<1, kThreads, 0, stream>>>(static_cast<float*>(dst.scales), dst.rows,
                                                          ep_detail::scales_per_row(dst.format, dst.d));
    CUDA_CHECK_LAUNCH();
  }
}

}  // namespace fp4moe
