// A small typed table (named columns of float64, int64 or UTF-8 strings) that results/h5_file.h stores as one
// HDF5 group holding one 1-D dataset per column (DESIGN.md "Results").
//
//   Table t;
//   t.add_column("case", ColumnType::str).add_column("time_us", ColumnType::f64).add_column("step", ColumnType::i64);
//   t.add_row({"copy", 12.5, 3});
//
// Columns must all be declared before the first row. A row holds one value per column, in column order; an
// int64 value is accepted in a float64 column (converted exactly when |v| <= 2^53, rejected otherwise), nothing
// else converts. Every rejection throws fp4moe::Error naming the column and what was expected.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace fp4moe {

enum class ColumnType { f64, i64, str };

const char* column_type_name(ColumnType t);

// One cell or attribute value. A string literal becomes std::string, an integer literal int64_t.
using Value = std::variant<double, int64_t, std::string>;

// Ordered name -> value pairs (HDF5 attributes of a group or dataset).
using Attributes = std::vector<std::pair<std::string, Value>>;

struct Column {
  std::string name;
  ColumnType type;
  std::vector<double> f64;       // used when type == f64
  std::vector<int64_t> i64;      // used when type == i64
  std::vector<std::string> str;  // used when type == str
};

class Table {
 public:
  // Rejects: an empty name, a name holding '/' or '.', a duplicate name, a column added after rows.
  Table& add_column(const std::string& name, ColumnType type);
  // Rejects: a row whose length differs from the number of columns, a value of the wrong type.
  void add_row(const std::vector<Value>& row);
  // Attributes written on the table's group (e.g. a run's configuration).
  Table& set_attribute(const std::string& name, Value v);

  int64_t rows() const { return rows_; }
  const std::vector<Column>& columns() const { return columns_; }
  const Attributes& attributes() const { return attributes_; }
  // Rejects an unknown name (the message lists the columns).
  const Column& column(const std::string& name) const;

 private:
  std::vector<Column> columns_;
  Attributes attributes_;
  int64_t rows_ = 0;
};

// Sets or replaces `name` in `attrs`, keeping first-insertion order.
void set_attribute(Attributes& attrs, const std::string& name, Value v);

}  // namespace fp4moe
