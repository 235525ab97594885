// The precision recipe of a linear layer (DESIGN.md "Recipes"): the operand precision of each GEMM class (Fprop,
// Dgrad, Wgrad), whether the layer's input is stored as MXFP4 (kept for backward and sent by an expert-parallel
// dispatch in that form: paper 1's FP4 storage), and the options of the MXFP4 quantizer.
//
// The three recipes the layers run today are named presets, one per `recipe.*` value of the configuration:
//
// | preset | Fprop | Dgrad | Wgrad | input stored as | MXFP4 quantizer                                      |
// | bf16   | bf16  | bf16  | bf16  | BF16            | (unused)                                             |
// | fp8    | fp8   | fp8   | fp8   | BF16            | (unused)                                             |
// | mxfp4  | fp8   | fp8   | fp8   | MXFP4           | RNE, no transform (bf16_to_mxfp4_row, OCP floor scale) |
//
// fp8 is DeepSeek-V3's fine-grained FP8 (1x128 activation rows, 128x128 weight blocks); mxfp4 is paper 1: MXFP4
// storage and communication of the input, FP8 compute in forward and backward. Other combinations (MXFP4 GEMM
// operands, stochastic rounding, Hadamard transforms: paper 2's ladder) can be written down but are not built
// yet: the layers reject them (require_preset_recipe).
#pragma once

#include <string>

#include "kernels/quant/bf16_to_mxfp4_row.h"
#include "kernels/quant/mx_transform.h"

namespace fp4moe {

// Operand precision of one GEMM class.
enum class GemmPrecision { bf16, fp8, mxfp4 };
const char* gemm_precision_name(GemmPrecision p);

// Rounding of the MXFP4 quantizer: kernels/quant/bf16_to_mxfp4_row.h's Rounding, named "rne" and "sr".
const char* mx_rounding_name(Rounding r);

// Transform applied to the operand before MXFP4 quantization: none, a Hadamard transform over blocks of 16 or
// 32 elements, or a randomized Hadamard transform: the quantizer's own (kernels/quant/mx_transform.h).
using MxTransform = HadamardTransform;
const char* mx_transform_name(MxTransform t);

struct MxQuantizerOptions {
  Rounding rounding = Rounding::rne;
  MxTransform transform = MxTransform::none;
};

struct Recipe {
  GemmPrecision fprop = GemmPrecision::bf16;  // Y = X W^T
  GemmPrecision dgrad = GemmPrecision::bf16;  // dX = dY W
  GemmPrecision wgrad = GemmPrecision::bf16;  // dW += dY^T X
  bool mxfp4_input = false;                   // X stored as MXFP4 (the copy backward reads), not BF16
  MxQuantizerOptions mx;                      // how X (and MXFP4 GEMM operands) are quantized to MXFP4

  static const Recipe bf16;
  static const Recipe fp8;
  static const Recipe mxfp4;
};

constexpr bool operator==(const Recipe& a, const Recipe& b) {
  return a.fprop == b.fprop && a.dgrad == b.dgrad && a.wgrad == b.wgrad && a.mxfp4_input == b.mxfp4_input &&
         a.mx.rounding == b.mx.rounding && a.mx.transform == b.mx.transform;
}
constexpr bool operator!=(const Recipe& a, const Recipe& b) { return !(a == b); }

inline constexpr Recipe Recipe::bf16{GemmPrecision::bf16, GemmPrecision::bf16, GemmPrecision::bf16, false, {}};
inline constexpr Recipe Recipe::fp8{GemmPrecision::fp8, GemmPrecision::fp8, GemmPrecision::fp8, false, {}};
inline constexpr Recipe Recipe::mxfp4{GemmPrecision::fp8, GemmPrecision::fp8, GemmPrecision::fp8, true,
                                      {Rounding::rne, MxTransform::none}};

// Whether `r` is one of the presets bf16, fp8, mxfp4.
bool is_preset_recipe(const Recipe& r);
// The preset's name ("bf16", "fp8" or "mxfp4"; the text of the configuration and of the model-config hash), or
// for any other combination its fields: "fprop=fp8 dgrad=bf16 wgrad=fp8 input=mxfp4 rounding=sr transform=h16".
std::string recipe_name(const Recipe& r);
// The preset named `text`. Throws fp4moe::Error for anything but "bf16", "fp8" or "mxfp4"; `what` names the
// option in the message.
Recipe parse_recipe(const std::string& text, const std::string& what);
// Throws fp4moe::Error, naming `layer` and the combination asked for, unless `r` is a preset: only bf16, fp8 and
// mxfp4 are built. Every layer that runs a recipe calls it in its constructor.
void require_preset_recipe(const Recipe& r, const std::string& layer);

}  // namespace fp4moe
