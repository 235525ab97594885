// `fp4moe quantize`: quantizes one 2-D dataset of an HDF5 file to MXFP4 or one of the FP8 layouts, on the CPU
// (references) or the GPU (kernels), writes codes, scales, the BF16 input and the dequantized tensor to a new
// HDF5 file, and prints the error: relative L2, max abs, the fraction of clipped elements, NaN/Inf blocks.
//
//   fp4moe quantize --input X.h5 --dataset NAME --format mxfp4|fp8-row|fp8-col|fp8-block
//     [--scale-mode floor|ceil (mxfp4) | pow2|fp32 (fp8)] [--rounding rne|stochastic --seed N]
//     [--transform none|h16|h32|rht --rht-seed N (mxfp4)]
//     [--groups 162,0,... (fp8-col; default one group)] [--device cpu|cuda] --output Q.h5
//
// Output file: /codes uint8, /scales (uint8 UE8M0 for mxfp4, float32 for fp8) in the layouts of
// kernels/quant/layouts.h, /input_bf16 uint16 [M, K] (attribute dtype="bfloat16"), /dequantized float32 [M, K],
// /group_offsets int32 [G+1] (fp8-col); root attributes: the run's provenance (results/run_info.h), the options
// and the error figures. With a transform (kernels/quant/mx_transform.h, applied along K before quantization) the
// codes, scales and /dequantized are those of the transformed tensor, and /dequantized_inverse float32 [M, K] is
// /dequantized transformed back; the error figures compare /dequantized_inverse with the input, and the clipped
// elements are those of the transformed tensor. Errors are measured against the BF16 input the quantizer saw;
// finite float32/float64 input values beyond BF16's range become +-Inf there (counted: input_overflow_elements,
// and a line of the report), and nonzero values below its smallest subnormal become +-0 (input_underflow_elements,
// likewise). The seeds (--seed, --rht-seed) are recorded as the attributes seed and rht_seed.
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <memory>

#include "cli/commands.h"
#include "cli/quantize_input.h"
#include "cli/quantize_run.h"
#include "kernels/common/check.h"
#include "kernels/common/types.h"
#include "kernels/quant/layouts.h"
#include "results/env_info.h"
#include "results/h5_file.h"
#include "results/output_path.h"
#include "results/run_info.h"

namespace fp4moe::cli {

namespace {

struct QuantizeOptions {
  std::string input, dataset, format, scale_mode, rounding = "rne", groups, device = "cpu", output;
  std::string seed = "0";  // --seed as given: parse_seed reads it
  std::string transform = "none";
  std::string rht_seed;  // --rht-seed as given
  bool rht_seed_given = false;
};

struct ErrorFigures {
  double rel_l2 = 0, max_abs = 0;
  int64_t compared = 0;  // finite input elements outside NaN/Inf blocks
};

// Offsets [G+1] from "--groups 162,0,2577": each entry a row count >= 0, summing to M.
std::vector<int32_t> parse_groups(const std::string& text, int64_t M) {
  if (text.empty()) return {0, static_cast<int32_t>(M)};
  std::vector<int64_t> off = {0};
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(start, end - start);
    bool digits = !item.empty() && item.size() <= 10 && item.find_first_not_of("0123456789") == std::string::npos;
    if (!digits)
      throw CliError(fmt::format("--groups '{}': '{}' is not a row count (expected e.g. 162,0,2577)", text, item));
    off.push_back(off.back() + std::stoll(item));
    start = end + 1;
  }
  if (off.back() != M)
    throw CliError(fmt::format("--groups '{}' sums to {} rows, expected the {} rows of the input (M)", text,
                               off.back(), M));
  return std::vector<int32_t>(off.begin(), off.end());  // every entry <= M < 2^31
}

// A seed option (`name`: --seed, --rht-seed): a decimal integer in [0, 2^63 - 1] (no sign; the range the output
// file's signed 64-bit attributes record exactly, as train.seed); throws CliError naming the range otherwise.
uint64_t parse_seed(const std::string& name, const std::string& text) {
  int64_t v = 0;
  const char* end = text.data() + text.size();
  const auto [stop, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || text[0] == '-' || ec != std::errc() || stop != end)
    throw CliError(fmt::format("{} must be an integer in [0, {}], got '{}'", name, std::numeric_limits<int64_t>::max(),
                               text));
  return static_cast<uint64_t>(v);
}

// Groups the GPU column quantizer accepts (bf16_to_fp8.h: 1 <= G <= 1024); the CPU reference takes any G >= 1.
constexpr size_t kMaxCudaColGroups = 1024;

void check_options(const QuantizeOptions& o, bool mx) {
  if (o.scale_mode.empty()) return;
  if (mx && o.scale_mode != "floor" && o.scale_mode != "ceil")
    throw CliError(fmt::format("--scale-mode {} does not apply to mxfp4 (expected floor or ceil)", o.scale_mode));
  if (!mx && o.scale_mode != "pow2" && o.scale_mode != "fp32")
    throw CliError(fmt::format("--scale-mode {} does not apply to {} (expected pow2 or fp32)", o.scale_mode, o.format));
}

ErrorFigures error_figures(const std::vector<uint16_t>& x, const std::vector<float>& y) {
  ErrorFigures e;
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    double a = bf16_bits_to_f32(x[i]), b = y[i];
    if (!std::isfinite(a) || std::isnan(b)) continue;  // NaN/Inf blocks are reported separately
    double d = b - a;
    num += d * d;
    den += a * a;
    e.max_abs = std::max(e.max_abs, std::fabs(d));
    ++e.compared;
  }
  e.rel_l2 = den > 0 ? std::sqrt(num / den) : (num > 0 ? INFINITY : 0.0);
  return e;
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::string t;
  for (int64_t d : s) {
    if (!t.empty()) t += ", ";
    t += std::to_string(d);
  }
  return "[" + t + "]";
}

int run_quantize(const QuantizeOptions& o) {
  const bool mx = o.format == "mxfp4";
  check_options(o, mx);
  const uint64_t seed = parse_seed("--seed", o.seed);
  if (!mx && o.transform != "none")
    throw CliError(fmt::format("--transform {} applies to mxfp4 only, not {}", o.transform, o.format));
  if (o.rht_seed_given && o.transform != "rht")
    throw CliError(fmt::format("--rht-seed applies to --transform rht only, got --transform {}", o.transform));
  const uint64_t rht_seed = o.rht_seed_given ? parse_seed("--rht-seed", o.rht_seed) : 0;
  if (!mx && o.rounding != "rne")
    throw CliError(fmt::format("--rounding {} applies to mxfp4 only ({} rounds to nearest even)", o.rounding, o.format));
  if (o.format != "fp8-col" && !o.groups.empty())
    throw CliError(fmt::format("--groups applies to fp8-col only, not {}", o.format));
  const bool cuda = o.device == "cuda";
  const size_t group_count = o.groups.empty() ? 1 : std::count(o.groups.begin(), o.groups.end(), ',') + 1;
  if (cuda && group_count > kMaxCudaColGroups)
    throw CliError(fmt::format("--groups lists {} groups: the cuda column kernel takes at most {} (--device cpu "
                               "takes any number)",
                               group_count, kMaxCudaColGroups));
  // Before the input is read, so that a bad path fails at once rather than after the quantization.
  try {
    check_output_path("--output", o.output, {{"--input", o.input}});
  } catch (const Error& e) {
    throw CliError(user_message(e.what()));
  }
  if (cuda) {
    std::string why = why_no_cuda_device();
    if (!why.empty()) throw CliError(fmt::format("--device cuda: {}", why));
  }

  Bf16Matrix x = load_bf16_matrix(o.input, o.dataset);
  const int64_t M = x.M, K = x.K;
  if (mx && K % kMxBlock != 0)
    throw CliError(fmt::format("mxfp4 needs K (the last dimension) to be a multiple of 32: dataset '{}' has shape "
                               "[M, K] = [{}, {}]",
                               o.dataset, M, K));
  if (!mx && K % 16 != 0)
    throw CliError(fmt::format("{} needs K (the last dimension) to be a multiple of 16: dataset '{}' has shape "
                               "[M, K] = [{}, {}]",
                               o.format, o.dataset, M, K));
  if (o.format == "fp8-block" && M % 16 != 0)
    throw CliError(fmt::format("fp8-block needs N (the first dimension) to be a multiple of 16: dataset '{}' has "
                               "shape [N, K] = [{}, {}]",
                               o.dataset, M, K));
  if (M > INT32_MAX) throw CliError(fmt::format("dataset '{}' has {} rows, at most 2^31-1 are supported", o.dataset, M));

  QuantizeSpec spec;
  spec.cuda = cuda;
  std::string scale_mode = o.scale_mode.empty() ? (mx ? "floor" : "pow2") : o.scale_mode;
  if (mx) {
    spec.format = QuantFormat::mxfp4;
    spec.mx.scale_mode = scale_mode == "ceil" ? MxScaleMode::ceil : MxScaleMode::floor;
    spec.mx.rounding = o.rounding == "stochastic" ? Rounding::stochastic : Rounding::rne;
    spec.mx.seed = seed;
    spec.mx.transform = o.transform == "h16"   ? HadamardTransform::h16
                        : o.transform == "h32" ? HadamardTransform::h32
                        : o.transform == "rht" ? HadamardTransform::rht
                                               : HadamardTransform::none;
    spec.mx.rht_seed = rht_seed;
  } else {
    spec.format = o.format == "fp8-row" ? QuantFormat::fp8_row
                  : o.format == "fp8-col" ? QuantFormat::fp8_col
                                          : QuantFormat::fp8_block;
    spec.fp8_mode = scale_mode == "fp32" ? Fp8ScaleMode::fp32 : Fp8ScaleMode::pow2;
    if (spec.format == QuantFormat::fp8_col) spec.offsets = parse_groups(o.groups, M);
  }

  QuantizeResult q = quantize_matrix(x.bits, M, K, spec);
  const bool transformed = !q.dequantized_inverse.empty();
  ErrorFigures e = error_figures(x.bits, transformed ? q.dequantized_inverse : q.dequantized);
  const double total = static_cast<double>(M * K);

  ResultFile out;
  fill_root_attributes(out, invocation());
  out.set_attribute("input", o.input);
  out.set_attribute("dataset", o.dataset);
  out.set_attribute("input_dtype", x.source_type);
  out.set_attribute("M", M);
  out.set_attribute("K", K);
  out.set_attribute("format", o.format);
  out.set_attribute("scale_mode", scale_mode);
  out.set_attribute("rounding", o.rounding);
  out.set_attribute("seed", static_cast<int64_t>(seed));
  if (mx) {
    out.set_attribute("transform", o.transform);
    out.set_attribute("rht_seed", static_cast<int64_t>(rht_seed));
  }
  out.set_attribute("device", o.device);
  out.set_attribute("layout", q.layout);
  out.set_attribute("rel_l2_error", e.rel_l2);
  out.set_attribute("max_abs_error", e.max_abs);
  out.set_attribute("saturated_elements", q.saturated);
  out.set_attribute("saturated_fraction", static_cast<double>(q.saturated) / total);
  out.set_attribute("blocks", q.blocks);
  out.set_attribute("nonfinite_blocks", q.nonfinite_blocks);
  out.set_attribute("input_overflow_elements", x.overflowed);
  out.set_attribute("input_underflow_elements", x.underflowed);
  out.add_array("/codes", q.codes_shape, q.codes);
  if (mx) out.add_array("/scales", q.scales_shape, q.scales_ue8m0);
  else out.add_array("/scales", q.scales_shape, q.scales_f32);
  out.add_array("/input_bf16", {M, K}, x.bits, {{"dtype", "bfloat16"}});
  out.add_array("/dequantized", {M, K}, q.dequantized);
  if (transformed) out.add_array("/dequantized_inverse", {M, K}, q.dequantized_inverse);
  if (!spec.offsets.empty() && spec.format == QuantFormat::fp8_col)
    out.add_array("/group_offsets", {static_cast<int64_t>(spec.offsets.size())}, spec.offsets);
  out.write(o.output);

  fmt::print("{}:{} [{}, {}] {} -> {} (scale {}, rounding {}{}) on {}\n", o.input, o.dataset, M, K, x.source_type,
             o.format, scale_mode, o.rounding, transformed ? ", transform " + o.transform : std::string(), o.device);
  if (transformed) fmt::print("  errors of the dequantized tensor transformed back (/dequantized_inverse)\n");
  fmt::print("  relative L2 error   {:.6e}\n", e.rel_l2);
  fmt::print("  max abs error       {:.6e}\n", e.max_abs);
  fmt::print("  saturated/clipped   {:.6e} ({} of {} elements)\n", static_cast<double>(q.saturated) / total,
             q.saturated, M * K);
  fmt::print("  NaN/Inf blocks      {} of {}\n", q.nonfinite_blocks, q.blocks);
  if (x.overflowed > 0)
    fmt::print("  beyond BF16 range   {} finite input values rounded to +-Inf (their blocks count as NaN/Inf)\n",
               x.overflowed);
  if (x.underflowed > 0)
    fmt::print("  below BF16 range    {} nonzero input values rounded to +-0\n", x.underflowed);
  fmt::print("wrote {}: /codes uint8 {}, /scales {} {}, /dequantized{} float32 [{}, {}]\n", o.output,
             shape_text(q.codes_shape), mx ? "uint8" : "float32", shape_text(q.scales_shape),
             transformed ? " and /dequantized_inverse" : "", M, K);
  return kExitOk;
}

}  // namespace

Command add_quantize_command(CLI::App& app) {
  auto o = std::make_shared<QuantizeOptions>();
  CLI::App* sub = app.add_subcommand("quantize", "quantize a 2-D HDF5 dataset to MXFP4 or FP8 and report the error");
  sub->add_option("--input", o->input, "input HDF5 file")->required();
  sub->add_option("--dataset", o->dataset, "2-D dataset: float32/float64, or uint16 BF16 bits (dtype=\"bfloat16\")")
      ->required();
  sub->add_option("--format", o->format, "target format")
      ->required()
      ->check(CLI::IsMember({"mxfp4", "fp8-row", "fp8-col", "fp8-block"}));
  sub->add_option("--scale-mode", o->scale_mode, "mxfp4: floor (OCP, default) or ceil; fp8: pow2 (default) or fp32")
      ->check(CLI::IsMember({"floor", "ceil", "pow2", "fp32"}));
  sub->add_option("--rounding", o->rounding, "mxfp4 rounding: rne (default) or stochastic")
      ->check(CLI::IsMember({"rne", "stochastic"}));
  sub->add_option("--seed", o->seed, "seed of stochastic rounding, an integer in [0, 2^63 - 1] (default 0)")
      ->type_name("UINT");
  sub->add_option("--transform", o->transform,
                  "mxfp4: transform along K before quantization: none (default), h16, h32 (Walsh-Hadamard over blocks "
                  "of 16 or 32) or rht (random signs, then h16)")
      ->check(CLI::IsMember({"none", "h16", "h32", "rht"}));
  CLI::Option* rht_seed =
      sub->add_option("--rht-seed", o->rht_seed, "seed of rht's random signs, an integer in [0, 2^63 - 1] (default 0)")
          ->type_name("UINT");
  sub->add_option("--groups", o->groups, "fp8-col: rows per group, e.g. 162,0,2577 (default: one group)");
  sub->add_option("--device", o->device, "cpu (references, default) or cuda (kernels)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  sub->add_option("--output", o->output, "output HDF5 file (written atomically)")->required();
  return {sub, [o, rht_seed] {
            o->rht_seed_given = rht_seed->count() > 0;  // given, even as an empty word
            return run_quantize(*o);
          }};
}

}  // namespace fp4moe::cli
