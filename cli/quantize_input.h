// The input of `fp4moe quantize`: a 2-D dataset of an HDF5 file, as the BF16 matrix the quantizers take.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fp4moe::cli {

struct Bf16Matrix {
  std::vector<uint16_t> bits;  // [M, K] row-major BF16 bit patterns
  int64_t M = 0, K = 0;
  std::string source_type;     // "float32", "float64" or "bfloat16"
  int64_t overflowed = 0;      // finite float32/float64 values beyond BF16's range, rounded to +-Inf
  int64_t underflowed = 0;     // nonzero float32/float64 values below BF16's smallest subnormal, rounded to +-0
};

// Reads `dataset` of `file`: float32 or float64 (rounded to BF16, nearest even), or uint16 holding BF16 bits
// (then the dataset must carry the string attribute dtype="bfloat16"). Throws CliError (one line) for a missing
// file, a file that is not HDF5, a missing dataset (listing those present), a rank other than 2, an empty
// matrix, another element type, or elements that cannot be read (a damaged file, a missing external data file).
Bf16Matrix load_bf16_matrix(const std::string& file, const std::string& dataset);

// float64 -> BF16 bits with a single rounding to nearest even (no double rounding through float32): the value
// is first rounded to float32 toward zero with the sticky "odd" bit set when inexact, which float32 -> BF16
// RNE then rounds correctly (16 spare bits). NaN stays NaN, overflow gives +-Inf.
uint16_t f64_to_bf16_bits(double v);

}  // namespace fp4moe::cli
