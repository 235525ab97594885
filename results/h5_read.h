// Reading datasets and attributes of an existing HDF5 file (inputs of `fp4moe quantize`, checks in tests).
// Every failure throws fp4moe::Error naming the file, the object and HDF5's reason.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "results/h5_util.h"

namespace fp4moe {

// What a dataset holds: type is "float16/32/64", "int8..int64", "uint8..uint64", "string" or another HDF5
// class name ("compound", "enum", ...); shape has one entry per dimension (empty for a scalar).
struct H5DatasetInfo {
  std::string type;
  std::vector<int64_t> shape;
};

class H5Reader {
 public:
  // Opens `path` read-only. Rejects a missing file and a file that is not HDF5 (each with its own message).
  explicit H5Reader(const std::string& path);

  const std::string& path() const { return path_; }
  // Every dataset of the file, by path without the leading '/' ("x", "group/y"), in HDF5's name order.
  std::vector<std::string> datasets() const;
  bool has_dataset(const std::string& name) const;
  // Rejects a name that is not a dataset of the file.
  H5DatasetInfo info(const std::string& name) const;
  // All elements in row-major order, converted by HDF5 to the requested type (exact for float32/float64 into
  // float64 and for integers up to 2^53). Rejects non-numeric datasets.
  std::vector<double> read_f64(const std::string& name) const;
  std::vector<uint16_t> read_u16(const std::string& name) const;
  // A scalar string attribute of a dataset or group (name "" or "/" for the root); nullopt when absent or not
  // a string.
  std::optional<std::string> string_attribute(const std::string& object, const std::string& attr) const;

 private:
  template <typename T>
  std::vector<T> read(const std::string& name, hid_t mem_type) const;
  std::string path_;
  h5::Handle file_;
};

}  // namespace fp4moe
