// BF16 -> MXFP4 row quantization (bf16_to_mxfp4_row.h). The [M, K] tensor is walked as one flat sequence of
// 8-element chunks (16 bytes of BF16): K % 32 == 0, so every MX block is four consecutive chunks of one row, and
// its codes (16 bytes) and scale (1 byte) sit at the flat block index in [M, K/2] and [M, K/32].
// Four consecutive lanes hold one MX block: each loads its chunk with one 16-byte load, the block amax is an
// integer maximum of BF16 magnitude bits over two warp shuffles, and each lane writes its 4 bytes of codes
// (a warp writes 128 contiguous bytes). Each thread keeps kChunksPerThread loads in flight; the grid strides.
// Round to nearest even compares two elements at a time with the block's scaled decision points (packed BF16
// compares, no per-element product); stochastic rounding and blocks with extreme exponents go element by element.
#include <type_traits>

#include "kernels/quant/bf16_to_mxfp4_device.cuh"
#include "kernels/quant/bf16_to_mxfp4_row.h"
#include "kernels/quant/layouts.h"
#include "kernels/quant/mx_row_checks.h"
#include "kernels/quant/mx_row_launch.cuh"

namespace fp4moe {
namespace {

using namespace detail;  // the chunk encoders of bf16_to_mxfp4_device.cuh

constexpr int kThreads = 256;
constexpr int kChunksPerThread = 4;  // independent 16-byte loads in flight per thread
static_assert(kThreads % 32 == 0, "whole warps: the amax shuffles need every lane");

template <Rounding kRounding>
__global__ void __launch_bounds__(kThreads)
bf16_to_mxfp4_row_kernel(const uint4* __restrict__ x, int64_t num_chunks, MxScaleMode mode, uint64_t seed,
                         uint64_t index_base, uint32_t* __restrict__ codes, uint8_t* __restrict__ scales,
                         unsigned long long* __restrict__ nonfinite_blocks) {
  const int lane = threadIdx.x & 31;
  const int64_t sweep = int64_t{gridDim.x} * kThreads * kChunksPerThread;
  // `base` is the same for the whole thread block, so every lane runs every iteration (shuffles stay legal).
  for (int64_t base = int64_t{blockIdx.x} * kThreads * kChunksPerThread; base < num_chunks; base += sweep) {
    uint4 v[kChunksPerThread];
#pragma unroll
    for (int j = 0; j < kChunksPerThread; ++j) {
      const int64_t c = base + j * kThreads + threadIdx.x;
      v[j] = c < num_chunks ? __ldcs(x + c) : make_uint4(0, 0, 0, 0);  // streamed once: evict first
    }
#pragma unroll
    for (int j = 0; j < kChunksPerThread; ++j) {
      const int64_t c = base + j * kThreads + threadIdx.x;  // num_chunks % 4 == 0: a block is all in or all out
      uint32_t m2 = __vmaxu2(__vmaxu2(v[j].x & 0x7FFF7FFFu, v[j].y & 0x7FFF7FFFu),
                             __vmaxu2(v[j].z & 0x7FFF7FFFu, v[j].w & 0x7FFF7FFFu));
      uint32_t amax_bits = max(m2 & 0xFFFFu, m2 >> 16);
      amax_bits = max(amax_bits, __shfl_xor_sync(0xFFFFFFFFu, amax_bits, 1));
      amax_bits = max(amax_bits, __shfl_xor_sync(0xFFFFFFFFu, amax_bits, 2));
      const bool nonfinite = amax_bits >= kBf16AbsNonFinite;

      uint32_t packed = 0;  // NaN/Inf block and all-zero block: codes 0
      uint8_t scale = nonfinite ? kUE8M0NaN : 0;
      if (!nonfinite && amax_bits != 0) {
        const int e = block_exponent(amax_bits, mode);
        scale = static_cast<uint8_t>(e + kUE8M0Bias);
        if (kRounding == Rounding::rne && e >= kPackedMinExponent && e <= kPackedMaxExponent)
          packed = encode_chunk_rne_packed(v[j], e);
        else
          packed = encode_chunk_scalar<kRounding>(v[j], exp2_exact(-e), seed,
                                                  index_base + static_cast<uint64_t>(c) * kChunk);
      }
      const bool in = c < num_chunks;
      if (in) {
        codes[c] = packed;
        if ((lane & 3) == 0) scales[c / 4] = scale;
      }
      if (nonfinite_blocks != nullptr) {
        const unsigned ballot = __ballot_sync(0xFFFFFFFFu, in && nonfinite && (lane & 3) == 0);
        if (lane == 0 && ballot != 0) atomicAdd(nonfinite_blocks, static_cast<unsigned long long>(__popc(ballot)));
      }
    }
  }
}

}  // namespace

namespace detail {

void check_bf16_to_mxfp4_row_args(const char* what, const bf16* x, int64_t M, int64_t K, const uint8_t* codes,
                                  const uint8_t* scales, const MxQuantConfig& cfg,
                                  const unsigned long long* nonfinite_blocks) {
  check_mx_row_shape(what, M, K);
  FP4MOE_CHECK(cfg.scale_mode == MxScaleMode::floor || cfg.scale_mode == MxScaleMode::ceil,
               "{}: unknown MX scale mode {}", what, static_cast<int>(cfg.scale_mode));
  FP4MOE_CHECK(cfg.rounding == Rounding::rne || cfg.rounding == Rounding::stochastic, "{}: unknown rounding {}",
               what, static_cast<int>(cfg.rounding));
  FP4MOE_CHECK(cfg.row_offset >= 0, "{}: row_offset must be >= 0, got {}", what, cfg.row_offset);
  if (M == 0) return;
  check_mx_pointer(what, "x", x, 16);
  check_mx_pointer(what, "codes", codes, 16);
  check_mx_pointer(what, "scales", scales, 1);
  if (nonfinite_blocks != nullptr) check_mx_pointer(what, "nonfinite_blocks", nonfinite_blocks, 8);
}

// Variant 0: the grid-stride kernel above. Arguments already checked, M > 0.
void launch_bf16_to_mxfp4_row_v0(const bf16* x, int64_t M, int64_t K, uint8_t* codes, uint8_t* scales,
                                 const MxQuantConfig& cfg, unsigned long long* nonfinite_blocks,
                                 cudaStream_t stream) {
  const int64_t num_chunks = M * K / kChunk;
  const int64_t blocks_needed = ceil_div(num_chunks, int64_t{kThreads} * kChunksPerThread);
  const uint64_t index_base = static_cast<uint64_t>(cfg.row_offset) * static_cast<uint64_t>(K);
  const auto* x16 = reinterpret_cast<const uint4*>(x);
  auto* codes32 = reinterpret_cast<uint32_t*>(codes);
  auto launch = [&](auto rounding_tag) {
    constexpr auto kernel = bf16_to_mxfp4_row_kernel<decltype(rounding_tag)::value>;
    const unsigned grid = mx_grid_blocks<kernel, kThreads>(blocks_needed);
    kernel<<<grid, kThreads, 0, stream>>>(x16, num_chunks, cfg.scale_mode, cfg.seed, index_base, codes32, scales,
                                          nonfinite_blocks);
  };
  if (cfg.rounding == Rounding::rne)
    launch(std::integral_constant<Rounding, Rounding::rne>{});
  else
    launch(std::integral_constant<Rounding, Rounding::stochastic>{});
  CUDA_CHECK_LAUNCH();
}

}  // namespace detail

void bf16_to_mxfp4_row(const bf16* x, int64_t M, int64_t K, uint8_t* codes, uint8_t* scales,
                       const MxQuantConfig& cfg, unsigned long long* nonfinite_blocks, cudaStream_t stream) {
  detail::bf16_to_mxfp4_row_variant(0, x, M, K, codes, scales, cfg, nonfinite_blocks, stream);
}

}  // namespace fp4moe
