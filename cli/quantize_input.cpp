#include "cli/quantize_input.h"

#include <fmt/format.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>

#include "cli/commands.h"
#include "kernels/common/check.h"
#include "kernels/formats/formats.h"
#include "results/h5_read.h"

namespace fp4moe::cli {

uint16_t f64_to_bf16_bits(double v) {
  if (std::isnan(v)) return f32_to_bf16_bits(std::nanf(""));
  if (std::fabs(v) > static_cast<double>(FLT_MAX))  // beyond the largest float: past BF16's rounding midpoint too
    return v > 0 ? 0x7F80 : 0xFF80;
  float f = static_cast<float>(v);  // round to nearest
  if (static_cast<double>(f) != v) {
    // Round to odd: truncate toward zero, then set the last bit to record that bits were lost.
    if (std::fabs(static_cast<double>(f)) > std::fabs(v)) f = std::nextafter(f, 0.0f);
    f = f32_from_bits(f32_bits(f) | 1u);
  }
  return f32_to_bf16_bits(f);
}

static std::string shape_text(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) t += ", ";
    t += std::to_string(s[i]);
  }
  return t + "]";
}

// An fp4moe::Error message without its " (file.cpp:123)" suffix: the user is told what was wrong with the input,
// not where in the sources it was noticed.
static std::string without_source_location(const std::string& msg) {
  const size_t open = msg.rfind(" (");
  if (open == std::string::npos || msg.empty() || msg.back() != ')') return msg;
  const std::string inner = msg.substr(open + 2, msg.size() - open - 3);
  const size_t colon = inner.rfind(':');
  if (colon == std::string::npos || colon + 1 == inner.size() ||
      inner.find_first_not_of("0123456789", colon + 1) != std::string::npos)
    return msg;
  return msg.substr(0, open);
}

// read() of a dataset's elements; a failure (a damaged file, a missing external data file) becomes a one-line
// CliError naming the file and the dataset.
template <typename Read>
static auto read_or_explain(const std::string& file, const std::string& dataset, Read read) {
  try {
    return read();
  } catch (const Error& e) {
    throw CliError(fmt::format("cannot read dataset '{}' of '{}': {}", dataset, file,
                               without_source_location(e.what())));
  }
}

Bf16Matrix load_bf16_matrix(const std::string& file, const std::string& dataset) {
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) throw CliError(fmt::format("input file '{}' does not exist", file));
  std::unique_ptr<H5Reader> reader;
  try {
    reader = std::make_unique<H5Reader>(file);
  } catch (const Error& e) {
    throw CliError(fmt::format("cannot read input file '{}': {}", file, without_source_location(e.what())));
  }
  if (!reader->has_dataset(dataset)) {
    std::string present;
    for (const auto& d : reader->datasets()) {
      if (!present.empty()) present += ", ";
      present += d;
    }
    throw CliError(fmt::format("no dataset '{}' in '{}' (datasets present: {})", dataset, file,
                               present.empty() ? "none" : present));
  }
  H5DatasetInfo info = reader->info(dataset);
  if (info.shape.size() != 2)
    throw CliError(fmt::format("dataset '{}' in '{}' has rank {} (shape {}), expected a 2-D [M, K] matrix", dataset,
                               file, info.shape.size(), shape_text(info.shape)));
  Bf16Matrix out;
  out.M = info.shape[0];
  out.K = info.shape[1];
  if (out.M == 0 || out.K == 0)
    throw CliError(fmt::format("dataset '{}' in '{}' is empty (shape {})", dataset, file, shape_text(info.shape)));
  if (info.type == "float32" || info.type == "float64") {
    std::vector<double> v = read_or_explain(file, dataset, [&] { return reader->read_f64(dataset); });
    out.bits.resize(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      out.bits[i] = f64_to_bf16_bits(v[i]);
      const uint16_t magnitude = out.bits[i] & 0x7FFFu;
      out.overflowed += std::isfinite(v[i]) && magnitude == 0x7F80u;
      out.underflowed += v[i] != 0.0 && magnitude == 0;
    }
    out.source_type = info.type;
  } else if (info.type == "uint16") {
    auto tag = reader->string_attribute(dataset, "dtype");
    if (tag != "bfloat16")
      throw CliError(fmt::format("dataset '{}' in '{}' is uint16 without the attribute dtype=\"bfloat16\" (got {}); "
                                 "uint16 input must hold BF16 bit patterns and say so",
                                 dataset, file, tag ? "dtype=\"" + *tag + "\"" : "no string attribute dtype"));
    out.bits = read_or_explain(file, dataset, [&] { return reader->read_u16(dataset); });
    out.source_type = "bfloat16";
  } else {
    throw CliError(fmt::format("dataset '{}' in '{}' holds {}, expected float32, float64 or uint16 BF16 bits "
                               "(attribute dtype=\"bfloat16\")",
                               dataset, file, info.type));
  }
  return out;
}

}  // namespace fp4moe::cli
