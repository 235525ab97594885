// Quantization behind `fp4moe quantize`: one BF16 matrix [M, K] into one of the project's formats, on the CPU
// (the *_ref functions) or the GPU (the kernels), then dequantized on the host and compared with its input.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/formats/formats.h"
#include "kernels/quant/bf16_to_mxfp4_row.h"

namespace fp4moe::cli {

enum class QuantFormat { mxfp4, fp8_row, fp8_col, fp8_block };

struct QuantizeSpec {
  QuantFormat format = QuantFormat::mxfp4;
  MxQuantConfig mx;                            // mxfp4: scale mode, rounding, seed, transform
  Fp8ScaleMode fp8_mode = Fp8ScaleMode::pow2;  // fp8-*
  std::vector<int32_t> offsets;                // fp8-col: group offsets [G+1] (0 ... M)
  bool cuda = false;                           // kernels on the GPU instead of the CPU references
};

// Codes and scales in the layouts of kernels/quant/layouts.h. fp8-col arrays are cut to the bytes the groups
// use (K * sum L_g codes, K * sum ceil(M_g/128) scales), flat.
struct QuantizeResult {
  std::vector<uint8_t> codes;
  std::vector<int64_t> codes_shape;
  std::vector<uint8_t> scales_ue8m0;  // mxfp4
  std::vector<float> scales_f32;      // fp8-*
  std::vector<int64_t> scales_shape;
  std::vector<float> dequantized;     // [M, K] float32: codes decoded with their scales
  std::vector<float> dequantized_inverse;  // mxfp4 with a transform: [M, K] dequantized transformed back; else empty
  std::string layout;                 // one line naming the layout of codes and scales
  int64_t blocks = 0;                 // scale blocks in the tensor
  int64_t nonfinite_blocks = 0;       // blocks that held NaN/Inf (their elements decode to NaN)
  int64_t saturated = 0;  // finite elements with |v| beyond the format's largest value at their scale (v: the
                          // transformed input with a transform)
};

// x: [M, K] BF16 bits. Shapes must already satisfy the format (K % 32 for mxfp4, K % 16 for fp8, M % 16 too for
// fp8-block) and offsets must be valid: the callers check and report those as user errors.
QuantizeResult quantize_matrix(const std::vector<uint16_t>& x, int64_t M, int64_t K, const QuantizeSpec& spec);

}  // namespace fp4moe::cli
