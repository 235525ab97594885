// The counter-based random bits of the MXFP4 quantizer (stochastic rounding, random Hadamard signs): the bits of
// an element depend only on (seed, its index), never on how a launch is split into threads, blocks or row ranges.
#pragma once

#include <cstdint>

#include "kernels/formats/formats.h"

namespace fp4moe {

// Output number n (from 0) of the splitmix64 stream seeded `seed` (Steele, Lea, Flood 2014): mix64 (formats.h) of
// seed + (n + 1) * 0x9E3779B97F4A7C15 (mod 2^64).
FP4MOE_HD uint64_t splitmix64_at(uint64_t seed, uint64_t n) { return mix64(seed + (n + 1) * 0x9E3779B97F4A7C15ull); }

// The hash of stochastic rounding's draws: splitmix64's counter (a Weyl sequence, seed + (n + 1) *
// 0x9E3779B97F4A7C15 mod 2^64) mixed by two multiplications by splitmix64's odd constants, each between folds
// z ^ (z >> 32). Every step is a bijection of 64-bit words, so distinct counters never collide; a fold by 32 is one
// XOR of the two 32-bit halves, and each multiplication three 32-bit multiply-adds: 9 instructions on a GPU after
// the counter, against 18 for splitmix64's mixer (three 64-bit shifts by 30, 27, 31 at four instructions each).
// tests/quant/test_mx_fast_codecs.cpp checks its draws for uniformity and for independence between neighbouring
// elements, hashes, rows and seeds.
FP4MOE_HD uint64_t mx_sr_mix(uint64_t z) {
  z ^= z >> 32;
  z *= 0xBF58476D1CE4E5B9ull;
  z ^= z >> 32;
  z *= 0x94D049BB133111EBull;
  return z ^ (z >> 32);
}
// The counter of hash n: consecutive hashes (and hashes a fixed stride apart) are one 64-bit addition apart.
constexpr uint64_t kMxSrWeyl = 0x9E3779B97F4A7C15ull;
FP4MOE_HD uint64_t mx_sr_counter(uint64_t seed, uint64_t n) { return seed + (n + 1) * kMxSrWeyl; }
FP4MOE_HD uint64_t mx_sr_hash64(uint64_t seed, uint64_t n) { return mx_sr_mix(mx_sr_counter(seed, n)); }

// The 8 random bits of stochastic rounding for the element with flat index `index` (m * K + k of the full tensor):
// byte (index mod 8) of mx_sr_hash64(seed, index / 8), so that one 64-bit hash serves eight consecutive elements
// (Blackwell's stochastic-rounding conversion to E2M1, cvt.rs...e2m1x4.f32, likewise takes one 32-bit random
// operand for four values).
// The rule on 8-bit draws: with u = bits * 2^-8 (f32_to_e2m1_stochastic) an element rounds up with probability
// ceil(256 p) / 256 for an exact fraction p of the step, so it is biased by less than 2^-8 of a step, and by none
// where 256 p is an integer. Every value the MXFP4 quantizers round is a BF16 (8 significant bits) scaled exactly by
// 2^-e: its p is then a multiple of 2^-8 wherever |v| 2^-e >= 0.25 (ulp over step: 2^-9 / 0.5 in [0.25, 0.5), down
// to 2^-6 above 1), so stochastic rounding is exactly unbiased for 0.25 <= |v| 2^-e <= 6 (above 6, in the floor
// scale mode, values clamp to 6); below 0.25 (elements under 2^(e-2): between 1/32 and 1/16 of the block's amax in
// the floor mode, 1/24 to 1/12 in the ceil mode) it rounds to 0.5 with probability ceil(512 |v| 2^-e) / 256 instead of 2 |v| 2^-e: a bias under
// 2^(e-9) in value (tests/quant/test_mx_fast_codecs.cpp counts the draws that round up for every BF16 below 6).
FP4MOE_HD uint32_t mx_sr_bits8(uint64_t seed, uint64_t index) {
  return static_cast<uint32_t>(mx_sr_hash64(seed, index / 8) >> (8 * (index % 8))) & 0xFFu;
}

// The uniform in [0, 1) of those bits: bits * 2^-8 (exact).
FP4MOE_HD float mx_sr_uniform(uint64_t seed, uint64_t index) {
  return static_cast<float>(mx_sr_bits8(seed, index)) * (1.0f / 256.0f);
}

}  // namespace fp4moe
