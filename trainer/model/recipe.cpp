#include "trainer/model/recipe.h"

#include <fmt/format.h>

#include "kernels/common/check.h"

namespace fp4moe {

const char* gemm_precision_name(GemmPrecision p) {
  switch (p) {
    case GemmPrecision::bf16: return "bf16";
    case GemmPrecision::fp8: return "fp8";
    case GemmPrecision::mxfp4: return "mxfp4";
  }
  return "?";
}

const char* mx_rounding_name(Rounding r) {
  switch (r) {
    case Rounding::rne: return "rne";
    case Rounding::stochastic: return "sr";
  }
  return "?";
}

const char* mx_transform_name(MxTransform t) {
  switch (t) {
    case MxTransform::none: return "none";
    case MxTransform::h16: return "h16";
    case MxTransform::h32: return "h32";
    case MxTransform::rht: return "rht";
  }
  return "?";
}

bool is_preset_recipe(const Recipe& r) { return r == Recipe::bf16 || r == Recipe::fp8 || r == Recipe::mxfp4; }

std::string recipe_name(const Recipe& r) {
  if (r == Recipe::bf16) return "bf16";
  if (r == Recipe::fp8) return "fp8";
  if (r == Recipe::mxfp4) return "mxfp4";
  return fmt::format("fprop={} dgrad={} wgrad={} input={} rounding={} transform={}", gemm_precision_name(r.fprop),
                     gemm_precision_name(r.dgrad), gemm_precision_name(r.wgrad), r.mxfp4_input ? "mxfp4" : "bf16",
                     mx_rounding_name(r.mx.rounding), mx_transform_name(r.mx.transform));
}

Recipe parse_recipe(const std::string& text, const std::string& what) {
  if (text == "bf16") return Recipe::bf16;
  if (text == "fp8") return Recipe::fp8;
  if (text == "mxfp4") return Recipe::mxfp4;
  FP4MOE_CHECK(false, "{} = '{}': unknown recipe, expected bf16, fp8 or mxfp4", what, text);
  return Recipe::bf16;
}

void require_preset_recipe(const Recipe& r, const std::string& layer) {
  FP4MOE_CHECK(is_preset_recipe(r),
               "{}: the recipe ({}) is not built; only the presets bf16, fp8 and mxfp4 run today", layer,
               recipe_name(r));
}

}  // namespace fp4moe
