#include "results/table.h"

#include <fmt/format.h>

#include "kernels/common/check.h"

namespace fp4moe {

const char* column_type_name(ColumnType t) {
  switch (t) {
    case ColumnType::f64: return "float64";
    case ColumnType::i64: return "int64";
    case ColumnType::str: return "string";
  }
  return "?";
}

static const char* value_type_name(const Value& v) {
  if (std::holds_alternative<double>(v)) return "float64";
  if (std::holds_alternative<int64_t>(v)) return "int64";
  return "string";
}

static std::string column_names(const std::vector<Column>& cols) {
  std::string s;
  for (const auto& c : cols) {
    if (!s.empty()) s += ", ";
    s += c.name;
  }
  return s.empty() ? "(none)" : s;
}

Table& Table::add_column(const std::string& name, ColumnType type) {
  FP4MOE_CHECK(!name.empty(), "table column names must not be empty");
  FP4MOE_CHECK(name.find_first_of("/.") == std::string::npos,
               "table column name '{}' must not hold '/' or '.' (it names an HDF5 dataset)", name);
  FP4MOE_CHECK(rows_ == 0, "column '{}' added after {} rows: declare every column before the first row", name,
               rows_);
  for (const auto& c : columns_) FP4MOE_CHECK(c.name != name, "duplicate table column '{}'", name);
  columns_.push_back(Column{name, type, {}, {}, {}});
  return *this;
}

void Table::add_row(const std::vector<Value>& row) {
  FP4MOE_CHECK(row.size() == columns_.size(), "table row has {} values, expected one per column ({}: {})",
               row.size(), columns_.size(), column_names(columns_));
  // Check every value before appending any, so that a rejected row leaves the table unchanged.
  for (size_t i = 0; i < row.size(); ++i) {
    const Column& c = columns_[i];
    const Value& v = row[i];
    bool ok = (c.type == ColumnType::f64 && std::holds_alternative<double>(v)) ||
              (c.type == ColumnType::i64 && std::holds_alternative<int64_t>(v)) ||
              (c.type == ColumnType::str && std::holds_alternative<std::string>(v));
    if (c.type == ColumnType::f64 && std::holds_alternative<int64_t>(v)) {
      int64_t x = std::get<int64_t>(v);
      FP4MOE_CHECK(x >= -(int64_t{1} << 53) && x <= (int64_t{1} << 53),
                   "row {}, column '{}': int64 value {} is not exact in float64 (|v| > 2^53)", rows_, c.name, x);
      ok = true;
    }
    FP4MOE_CHECK(ok, "row {}, column '{}': got a {} value, expected {}", rows_, c.name, value_type_name(v),
                 column_type_name(c.type));
  }
  for (size_t i = 0; i < row.size(); ++i) {
    Column& c = columns_[i];
    const Value& v = row[i];
    switch (c.type) {
      case ColumnType::f64:
        c.f64.push_back(std::holds_alternative<double>(v) ? std::get<double>(v)
                                                          : static_cast<double>(std::get<int64_t>(v)));
        break;
      case ColumnType::i64: c.i64.push_back(std::get<int64_t>(v)); break;
      case ColumnType::str: c.str.push_back(std::get<std::string>(v)); break;
    }
  }
  ++rows_;
}

Table& Table::set_attribute(const std::string& name, Value v) {
  fp4moe::set_attribute(attributes_, name, std::move(v));
  return *this;
}

const Column& Table::column(const std::string& name) const {
  for (const auto& c : columns_)
    if (c.name == name) return c;
  fail(__FILE__, __LINE__, fmt::format("no table column '{}' (columns: {})", name, column_names(columns_)));
}

void set_attribute(Attributes& attrs, const std::string& name, Value v) {
  FP4MOE_CHECK(!name.empty(), "attribute names must not be empty");
  for (auto& [n, old] : attrs)
    if (n == name) {
      old = std::move(v);
      return;
    }
  attrs.emplace_back(name, std::move(v));
}

}  // namespace fp4moe
