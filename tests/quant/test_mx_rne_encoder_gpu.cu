// The BF16x2 RNE pair encoder of the quantizers (kernels/quant/mx_fast_codecs.h e2m1_pair_rne_bf16x2), compiled for
// the device as the kernels run it: its device branch takes magnitudes by a BF16x2 absolute value, the binade's
// magic number by a BF16x2 product and the codes by two pinned integer multiply-adds, where the host branch masks
// and adds. It must give the codes of f32_to_e2m1_rne (formats.h,
// OCP MX v1.0 E2M1 with round-to-nearest-even and saturation) for every finite BF16 value (both signs, subnormals
// and -0 included) at every block exponent e in [-127, 126] that keeps |v| 2^-e below 8, in both halves of the
// word, as the host branch does (tests/quant/test_quant_row_gpu.cpp, MxFastCodecs.*: the same pairs).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/common/check.h"
#include "kernels/formats/formats.h"
#include "kernels/quant/mx_fast_codecs.h"
#include "tests/common/gpu_test_util.h"

namespace fp4moe {
namespace {

using test::DeviceBuffer;

constexpr int kMinE = -127;
constexpr int kMaxE = 126;
constexpr uint32_t kMagnitudes = 0x7F80;  // every finite BF16 magnitude (bits 0 .. 0x7F7F)

// The word of case (e, h): the low half is magnitude h, negative when h is odd; the high half another magnitude
// <= h, negative when bit 1 of h is set (both below the limit of e whenever h is).
__host__ __device__ uint32_t pair_word(uint32_t h) {
  const uint32_t lo = h | ((h & 1u) << 15), hi = (h * 7u) % (h + 1u) | ((h & 2u) << 14);
  return lo | (hi << 16);
}

// Block e - kMinE, magnitudes h strided over its threads: out[(e - kMinE) * kMagnitudes + h] = the device encoder's
// codes of pair_word(h) at 2^-e.
__global__ void encode_pairs(uint32_t* out) {
  const int e = kMinE + static_cast<int>(blockIdx.x);
  const __nv_bfloat162 inv2 = detail::bf162_from_bits((static_cast<uint32_t>(127 - e) << 7) * 0x00010001u);
  for (uint32_t h = threadIdx.x; h < kMagnitudes; h += blockDim.x)
    out[static_cast<size_t>(blockIdx.x) * kMagnitudes + h] = detail::e2m1_pair_rne_bf16x2(pair_word(h), inv2);
}

TEST(MxRneEncoderGpu, DevicePairEncoderMatchesRoundToNearestEvenAtEveryExponentAndValue) {
  FP4MOE_REQUIRE_DEVICE();
  constexpr int kExponents = kMaxE - kMinE + 1;
  DeviceBuffer<uint32_t> out(static_cast<size_t>(kExponents) * kMagnitudes);
  out.poison(0xA5);
  encode_pairs<<<kExponents, 256>>>(out.ptr);
  CUDA_CHECK_LAUNCH();
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<uint32_t> got = out.download();
  int64_t checked = 0, mismatches = 0;
  for (int e = kMinE; e <= kMaxE; ++e) {
    const float scale = exp2_exact(-e);
    const __nv_bfloat162 inv2 = __float2bfloat162_rn(scale);
    for (uint32_t h = 0; h < kMagnitudes; ++h) {
      if (!(bf16_bits_to_f32(static_cast<uint16_t>(h)) * scale < 8.0f)) break;  // magnitudes ascend with h
      const uint32_t w = pair_word(h);
      const uint32_t g = got[static_cast<size_t>(e - kMinE) * kMagnitudes + h];
      const uint32_t want_lo = f32_to_e2m1_rne(bf16_bits_to_f32(static_cast<uint16_t>(w & 0xFFFFu)) * scale);
      const uint32_t want_hi = f32_to_e2m1_rne(bf16_bits_to_f32(static_cast<uint16_t>(w >> 16)) * scale);
      const uint32_t host = detail::e2m1_pair_rne_bf16x2(w, inv2);
      checked += 2;
      if ((g != (want_lo | (want_hi << 16)) || g != host) && mismatches++ < 5)
        ADD_FAILURE() << "e " << e << " word 0x" << std::hex << w << ": device 0x" << g << ", host 0x" << host
                      << ", formats.h 0x" << (want_lo | (want_hi << 16));
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << checked;
  EXPECT_GT(checked, 4000000);
}

}  // namespace
}  // namespace fp4moe
