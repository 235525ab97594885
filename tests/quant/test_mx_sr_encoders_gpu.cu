// The two stochastic-rounding chunk encoders of the quantizers (kernels/quant/mx_quant_device.cuh), compiled for the
// device as the kernels run them: encode_chunk_stochastic_bf16x2 (magnitudes scaled two at a time in BF16x2, then
// e2m1_sr_fixed_x65536's device branch: a sum rounded up and one DPX maximum) must give the bits of
// encode_chunk_stochastic (an FP32 product per element, e2m1_sr_fixed) for every block exponent the row quantizer
// hands it (e >= kSrBf16x2MinExponent) and every BF16 magnitude a finite block with that exponent can hold
// (|v| 2^-e < 8), each with both signs (-0 included), under every one of the 256 draws. The host branch of
// e2m1_sr_fixed_x65536 has its own exhaustive test (tests/quant/test_mx_fast_codecs.cpp); this one covers the
// device code.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "tests/common/gpu_test_util.h"
#include "kernels/common/check.h"
#include "kernels/formats/formats.h"
#include "kernels/quant/mx_quant_device.cuh"

namespace fp4moe {
namespace {

using test::DeviceBuffer;

constexpr int kMinE = detail::kSrBf16x2MinExponent;
constexpr int kMaxE = 126;
constexpr uint32_t kMagnitudes = 0x7F80;  // every finite BF16 magnitude (bits 0 .. 0x7F7F)

// Thread t of block e - kMinE: chunks of 8 consecutive magnitudes starting at 8 t (stride blockDim.x * 8), each
// twice: element i negative when bit i of the chunk index is set, then with every sign flipped; magnitudes with
// |v| 2^-e >= 8 (not in a finite block of exponent e) become +0 in the first pass and -0 in the second. Every
// element is encoded under each of the 256 draws (every draw byte of the chunk equal to d). out[0]: mismatching
// encodings; out[1]: encodings checked; out[2..5]: one mismatch (e, first magnitude, sign pass * 256 + draw, the
// two results' XOR), written by the thread that sets out[6].
__global__ void compare_sr_encoders(unsigned long long* out) {
  const int e = kMinE + static_cast<int>(blockIdx.x);
  // |v| 2^-e < 8 <=> v < 2^(e + 3): BF16 bits below those of 2^(e + 3) (exponent field e + 130, when <= 254).
  const uint32_t limit = e + 130 <= 254 ? static_cast<uint32_t>(e + 130) << 7 : kMagnitudes;
  const __nv_bfloat162 inv2 = detail::sr_bf16x2_scale(e);
  const float inv_scale = detail::inv_block_scale(e);
  unsigned long long checked = 0, mismatches = 0;
  for (uint32_t first = 8 * threadIdx.x; first < kMagnitudes; first += 8 * blockDim.x) {
    for (uint32_t flip = 0; flip < 2; ++flip) {
      uint32_t w[4];
      for (int p = 0; p < 4; ++p) {
        uint32_t half[2];
        for (int h = 0; h < 2; ++h) {
          const uint32_t i = 2 * p + h, m = first + i;
          const uint32_t sign = ((((first / 8) >> i) & 1u) ^ flip) << 15;
          half[h] = (m < limit ? m : 0u) | sign;
        }
        w[p] = half[0] | (half[1] << 16);
      }
      const uint4 v = make_uint4(w[0], w[1], w[2], w[3]);
      for (uint32_t d = 0; d < 256; ++d) {
        const uint32_t word = d * 0x01010101u;
        const detail::ChunkDraws draws{{word, word}};
        const uint32_t want = detail::encode_chunk_stochastic(v, inv_scale, draws);
        const uint32_t got = detail::encode_chunk_stochastic_bf16x2(v, inv2, draws);
        ++checked;
        if (got != want && mismatches++ == 0 && atomicCAS(&out[6], 0ull, 1ull) == 0ull) {  // the first to claim it
          out[2] = static_cast<unsigned long long>(e - kMinE);
          out[3] = first;
          out[4] = flip * 256 + d;
          out[5] = got ^ want;
        }
      }
    }
  }
  atomicAdd(&out[1], checked);
  if (mismatches != 0) atomicAdd(&out[0], mismatches);
}

TEST(MxSrEncodersGpu, Bf16x2ScalingMatchesFp32ScalingAtEveryExponentAndMagnitude) {
  FP4MOE_REQUIRE_DEVICE();
  DeviceBuffer<unsigned long long> out(7);
  out.poison(0);
  compare_sr_encoders<<<kMaxE - kMinE + 1, 256>>>(out.ptr);
  CUDA_CHECK_LAUNCH();
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<unsigned long long> r = out.download();
  // Every exponent's chunks (all kMagnitudes / 8 of them, those past the limit as zeros), two sign passes, 256 draws.
  EXPECT_EQ(r[1], static_cast<unsigned long long>(kMaxE - kMinE + 1) * (kMagnitudes / 8) * 2 * 256);
  EXPECT_EQ(r[0], 0ull) << "first mismatch: e = " << static_cast<long long>(r[2]) + kMinE << ", magnitudes from 0x"
                        << std::hex << r[3] << ", sign pass " << std::dec << r[4] / 256 << ", draw " << r[4] % 256
                        << ", codes XOR 0x" << std::hex << r[5];
}

// A test that cannot fail is a defect: the comparison must see the BF16x2 encoder given the next block exponent
// (e = 1 against the FP32 encoder's e = 0).
__global__ void encoders_differ_when_scales_differ(unsigned long long* out) {
  // Elements 0..7 (element 2i in the low half of word i, 2i + 1 in the high): 1.5, 1, 3.5, 2.5, -1.5, -1, 0.375, 0.25.
  const uint4 v = make_uint4(0x3F803FC0u, 0x40204060u, 0xBF80BFC0u, 0x3E803EC0u);
  const detail::ChunkDraws draws{{0x80808080u, 0x80808080u}};
  const uint32_t want = detail::encode_chunk_stochastic(v, detail::inv_block_scale(0), draws);
  const uint32_t got = detail::encode_chunk_stochastic_bf16x2(v, detail::sr_bf16x2_scale(1), draws);
  out[0] = got != want ? 1ull : 0ull;
}

TEST(MxSrEncodersGpu, TheComparisonSeesADifferentScale) {
  FP4MOE_REQUIRE_DEVICE();
  DeviceBuffer<unsigned long long> out(1);
  out.poison(0xA5);
  encoders_differ_when_scales_differ<<<1, 1>>>(out.ptr);
  CUDA_CHECK_LAUNCH();
  CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(out.download()[0], 1ull);
}

}  // namespace
}  // namespace fp4moe
