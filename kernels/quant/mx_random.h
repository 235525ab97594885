// The counter-based random bits of the MXFP4 quantizer (stochastic rounding, random Hadamard signs): the bits of
// an element depend only on (seed, its index), never on how a launch is split into threads, blocks or row ranges.
#pragma once

#include <cstdint>

#include "kernels/formats/formats.h"

namespace fp4moe {

// Output number n (from 0) of the splitmix64 stream seeded `seed` (Steele, Lea, Flood 2014): mix64 (formats.h) of
// seed + (n + 1) * 0x9E3779B97F4A7C15 (mod 2^64).
FP4MOE_HD uint64_t splitmix64_at(uint64_t seed, uint64_t n) { return mix64(seed + (n + 1) * 0x9E3779B97F4A7C15ull); }

// The 16 random bits of stochastic rounding for the element with flat index `index` (m * K + k of the full
// tensor): bits 16 (index mod 4) .. 16 (index mod 4) + 15 of splitmix64_at(seed, index / 4), so that one 64-bit
// hash serves four consecutive elements. The element rounds up with probability ceil(p 2^16) / 2^16 for an exact
// fraction p of the step (f32_to_e2m1_stochastic with u = bits * 2^-16): biased by less than 2^-16 of a step.
FP4MOE_HD uint32_t mx_sr_bits16(uint64_t seed, uint64_t index) {
  return static_cast<uint32_t>(splitmix64_at(seed, index / 4) >> (16 * (index % 4))) & 0xFFFFu;
}

// The uniform in [0, 1) of those bits: bits * 2^-16 (exact).
FP4MOE_HD float mx_sr_uniform(uint64_t seed, uint64_t index) {
  return static_cast<float>(mx_sr_bits16(seed, index)) * (1.0f / 65536.0f);
}

}  // namespace fp4moe
