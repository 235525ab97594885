// The precision recipe of a linear layer (DESIGN.md "Recipes"): the operand precision of each GEMM class (Fprop,
// Dgrad, Wgrad), whether the layer's input is stored as MXFP4 (kept for backward and sent by an expert-parallel
// dispatch in that form: paper 1's FP4 storage), and the options of the MXFP4 quantizer.
//
// The three named presets, one per `recipe.*` value of the configuration:
//
// | preset | Fprop | Dgrad | Wgrad | input stored as | MXFP4 quantizer                                      |
// | bf16   | bf16  | bf16  | bf16  | BF16            | (unused)                                             |
// | fp8    | fp8   | fp8   | fp8   | BF16            | (unused)                                             |
// | mxfp4  | fp8   | fp8   | fp8   | MXFP4           | RNE, no transform (bf16_to_mxfp4_row, OCP floor scale) |
//
// fp8 is DeepSeek-V3's fine-grained FP8 (1x128 activation rows, 128x128 weight blocks); mxfp4 is paper 1: MXFP4
// storage and communication of the input, FP8 compute in forward and backward.
//
// Paper 2's ladder sets each GEMM class apart (parse_recipe's "preset key=value ..." form): a class in mxfp4
// quantizes both its operands to MXFP4 along the GEMM's reduction dimension and multiplies them on FP8 tensor
// cores (kernels/gemm/mxfp4_gemm.h); `rounding` (rne | sr) is that of the gradient operands (dY in Dgrad and
// Wgrad; X and W always round to nearest even), `transform` (none | h16 | h32 | rht) is applied to both operands
// of every mxfp4 class along its reduction dimension. What is built (check_recipe_built):
//
// | combination                                    | Linear (G = 1)            | Group Linear (routed, G > 1) |
// | the three presets                              | yes                       | yes                          |
// | each class fp8 or mxfp4, input bf16            | yes (M % 4 == 0 for an     | yes (any M_g)                |
// |   (any rounding and transform)                 |  mxfp4 Fprop or Dgrad)    |                              |
// | bf16 mixed with fp8/mxfp4 classes              | no                        | no                           |
// | input mxfp4 with an mxfp4 class, SR or a       | no                        | no                           |
// |   transform                                    |                           |                              |
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
// Whether some GEMM class of `r` runs in MXFP4.
bool has_mxfp4_gemm(const Recipe& r);
// Whether the layer quantizes a BF16 input itself (the fp8 preset and paper 2's ladder): its GEMMs are fp8/mxfp4
// and the input is not stored as MXFP4; it holds its own column copy of X for Wgrad.
bool quantizes_bf16_input(const Recipe& r);
// Whether `r` quantizes along the layer's K (in_features) in MX blocks of 32: the MXFP4 input or an MXFP4 Fprop.
bool needs_mx_blocks_along_k(const Recipe& r);
// Whether `r` quantizes along the layer's N (out_features) in MX blocks of 32: an MXFP4 Dgrad.
bool needs_mx_blocks_along_n(const Recipe& r);
// The preset's name ("bf16", "fp8" or "mxfp4"; the text of the configuration and of the model-config hash), or
// for any other combination its fields: "fprop=fp8 dgrad=bf16 wgrad=fp8 input=mxfp4 rounding=sr transform=h16".
std::string recipe_name(const Recipe& r);
// The recipe written as `text`: a preset name ("bf16", "fp8", "mxfp4"), optionally followed by space-separated
// overrides key=value with key fprop, dgrad, wgrad (bf16 | fp8 | mxfp4), input (bf16 | mxfp4), rounding (rne | sr),
// transform (none | h16 | h32 | rht), each key at most once: "fp8 fprop=mxfp4 dgrad=mxfp4 transform=h16"; or the
// fields alone, as recipe_name writes them (every field then defaults to the bf16 preset's). Throws fp4moe::Error
// (one line; `what` names the option) for an unknown preset, key or value, a repeated key, and a combination that
// is not built (check_recipe_built).
Recipe parse_recipe(const std::string& text, const std::string& what);
// Throws fp4moe::Error, naming `layer`, the combination and what is missing, unless `r` is built (the table at
// the top; the same for Linear and Group Linear). Every layer that runs a recipe calls it in its constructor.
void check_recipe_built(const Recipe& r, const std::string& layer);

// The seed of one layer's MXFP4 quantizers in a step (GroupLinear::set_quant_seed): splitmix64_at(step_seed,
// FNV-1a of `layer`, the weight's name), so that layers draw different random signs and roundings.
uint64_t layer_quant_seed(uint64_t step_seed, const std::string& layer);

}  // namespace fp4moe
