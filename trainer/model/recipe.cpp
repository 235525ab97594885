#include "trainer/model/recipe.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

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

bool has_mxfp4_gemm(const Recipe& r) {
  return r.fprop == GemmPrecision::mxfp4 || r.dgrad == GemmPrecision::mxfp4 || r.wgrad == GemmPrecision::mxfp4;
}

bool quantizes_bf16_input(const Recipe& r) { return r.fprop != GemmPrecision::bf16 && !r.mxfp4_input; }

bool needs_mx_blocks_along_k(const Recipe& r) { return r.mxfp4_input || r.fprop == GemmPrecision::mxfp4; }
bool needs_mx_blocks_along_n(const Recipe& r) { return r.dgrad == GemmPrecision::mxfp4; }

namespace {

// The value of `key` in `table` (names[i] -> values[i]), or a one-line error listing the names.
template <typename T, size_t N>
T lookup(const std::string& what, const std::string& key, const std::string& value, const char* const (&names)[N],
         const T (&values)[N]) {
  std::string list;
  for (size_t i = 0; i < N; ++i) {
    if (value == names[i]) return values[i];
    list += (i == 0 ? "" : (i + 1 == N ? " or " : ", ")) + std::string(names[i]);
  }
  FP4MOE_CHECK(false, "{}: {}={} is not known, expected {}", what, key, value, list);
  return values[0];
}

void set_field(Recipe& r, const std::string& what, const std::string& key, const std::string& value) {
  static const char* const gemm_names[] = {"bf16", "fp8", "mxfp4"};
  static const GemmPrecision gemm_values[] = {GemmPrecision::bf16, GemmPrecision::fp8, GemmPrecision::mxfp4};
  static const char* const input_names[] = {"bf16", "mxfp4"};
  static const bool input_values[] = {false, true};
  static const char* const rounding_names[] = {"rne", "sr"};
  static const Rounding rounding_values[] = {Rounding::rne, Rounding::stochastic};
  static const char* const transform_names[] = {"none", "h16", "h32", "rht"};
  static const MxTransform transform_values[] = {MxTransform::none, MxTransform::h16, MxTransform::h32,
                                                 MxTransform::rht};
  if (key == "fprop") r.fprop = lookup(what, key, value, gemm_names, gemm_values);
  else if (key == "dgrad") r.dgrad = lookup(what, key, value, gemm_names, gemm_values);
  else if (key == "wgrad") r.wgrad = lookup(what, key, value, gemm_names, gemm_values);
  else if (key == "input") r.mxfp4_input = lookup(what, key, value, input_names, input_values);
  else if (key == "rounding") r.mx.rounding = lookup(what, key, value, rounding_names, rounding_values);
  else if (key == "transform") r.mx.transform = lookup(what, key, value, transform_names, transform_values);
  else
    FP4MOE_CHECK(false, "{}: unknown key '{}', expected fprop, dgrad, wgrad, input, rounding or transform", what,
                 key);
}

}  // namespace

Recipe parse_recipe(const std::string& text, const std::string& what) {
  const std::string where = fmt::format("{} = '{}'", what, text);
  std::vector<std::string> words;
  for (size_t i = 0; i < text.size();) {
    const size_t end = std::min(text.find(' ', i), text.size());
    if (end > i) words.push_back(text.substr(i, end - i));
    i = end + 1;
  }
  FP4MOE_CHECK(!words.empty(), "{}: empty recipe, expected bf16, fp8 or mxfp4 (then key=value overrides)", where);
  Recipe r = Recipe::bf16;
  size_t first = 0;
  if (words[0].find('=') == std::string::npos) {
    if (words[0] == "bf16") r = Recipe::bf16;
    else if (words[0] == "fp8") r = Recipe::fp8;
    else if (words[0] == "mxfp4") r = Recipe::mxfp4;
    else FP4MOE_CHECK(false, "{}: unknown recipe '{}', expected bf16, fp8 or mxfp4", where, words[0]);
    first = 1;
  }
  std::vector<std::string> seen;
  for (size_t i = first; i < words.size(); ++i) {
    const size_t eq = words[i].find('=');
    FP4MOE_CHECK(eq != std::string::npos && eq > 0 && eq + 1 < words[i].size(),
                 "{}: '{}' is not key=value (the preset comes first, then overrides such as fprop=mxfp4)", where,
                 words[i]);
    const std::string key = words[i].substr(0, eq);
    FP4MOE_CHECK(std::find(seen.begin(), seen.end(), key) == seen.end(), "{}: {} is given twice", where, key);
    seen.push_back(key);
    set_field(r, where, key, words[i].substr(eq + 1));
  }
  check_recipe_built(r, where);
  return r;
}

void check_recipe_built(const Recipe& r, const std::string& layer) {
  if (is_preset_recipe(r)) return;
  const std::string name = recipe_name(r);
  const bool any_bf16 =
      r.fprop == GemmPrecision::bf16 || r.dgrad == GemmPrecision::bf16 || r.wgrad == GemmPrecision::bf16;
  const bool mx_options = r.mx.rounding != Rounding::rne || r.mx.transform != MxTransform::none;
  FP4MOE_CHECK(!any_bf16 || (!has_mxfp4_gemm(r) && r.fprop == r.dgrad && r.dgrad == r.wgrad && !r.mxfp4_input),
               "{}: the recipe ({}) is not built: bf16 GEMM classes mixed with fp8/mxfp4 ones or with MXFP4 input "
               "storage (all three bf16, or each fp8 or mxfp4)",
               layer, name);
  FP4MOE_CHECK(!r.mxfp4_input || (!has_mxfp4_gemm(r) && !mx_options),
               "{}: the recipe ({}) is not built: MXFP4 input storage runs with fp8 GEMM classes, RNE and no "
               "transform only (the mxfp4 preset)",
               layer, name);
  FP4MOE_CHECK(has_mxfp4_gemm(r) || !mx_options,
               "{}: the recipe ({}) sets rounding or transform, which apply to MXFP4 GEMM operands, but no GEMM class "
               "is mxfp4",
               layer, name);
}

uint64_t layer_quant_seed(uint64_t step_seed, const std::string& layer) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (const char c : layer) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001B3ull;
  return splitmix64_at(step_seed, h);
}

}  // namespace fp4moe
