// HDF5 result files (DESIGN.md "Results"), assembled in memory and written atomically.
//
// Layout of a file:
//   /                       root attributes (results/run_info.h fills schema_version, git_sha, date, gpu, driver,
//                           cuda, cublaslt, nccl, host, command)
//   /<group>/.../<table>    one HDF5 group per Table: one 1-D dataset per column (float64, int64 or
//                           variable-length UTF-8 strings, all of the table's length), the group attribute
//                           `columns` (1-D variable-length UTF-8 strings: the column order) and the table's own
//                           attributes
//   /<path>                 N-D arrays (uint8, uint16, int32, int64, float32, float64, row-major) with attributes
//
// Reading a table back with h5py and pandas:
//   g = h5py.File(path, "r")["/bench/convert"]
//   df = pd.DataFrame({c: g[c].asstr()[()] if g[c].dtype.kind == "O" else g[c][()] for c in g.attrs["columns"]})
//
// write(path) writes everything to `<path>.tmp-<pid>`, closes it, flushes it to disk and renames it to `path`
// (an existing file is replaced only then). `path` must be a new path or a regular file; a symbolic link is
// followed and its final target written (results/output_path.h: output_file_target); a directory, device, FIFO or
// socket is refused before anything is written. On any failure the temporary file is removed and fp4moe::Error is
// thrown naming the path and what failed (HDF5's own reason included); `path` is never left half-written.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "results/table.h"

namespace fp4moe {

enum class ArrayType { u8, u16, i32, i64, f32, f64 };

template <typename T>
constexpr ArrayType array_type_of() {
  if constexpr (std::is_same_v<T, uint8_t>) return ArrayType::u8;
  else if constexpr (std::is_same_v<T, uint16_t>) return ArrayType::u16;
  else if constexpr (std::is_same_v<T, int32_t>) return ArrayType::i32;
  else if constexpr (std::is_same_v<T, int64_t>) return ArrayType::i64;
  else if constexpr (std::is_same_v<T, float>) return ArrayType::f32;
  else {
    static_assert(std::is_same_v<T, double>, "arrays hold uint8, uint16, int32, int64, float32 or float64");
    return ArrayType::f64;
  }
}

class ResultFile {
 public:
  // Root attributes (set again to replace).
  void set_attribute(const std::string& name, Value v);
  const Attributes& attributes() const { return root_attributes_; }

  // A table stored as the group `path` (absolute, e.g. "/bench/convert"; parent groups are created).
  // Rejects: a path that is not absolute, holds an empty component or was already added.
  void add_table(const std::string& path, Table table);

  // An N-D array stored as the dataset `path` (absolute, e.g. "/codes"). shape: one entry per dimension, each
  // >= 0, their product equal to data.size(). Rejects a bad path, a duplicate path or a shape/size mismatch.
  template <typename T>
  void add_array(const std::string& path, const std::vector<int64_t>& shape, const std::vector<T>& data,
                 Attributes attrs = {}) {
    std::vector<unsigned char> bytes(data.size() * sizeof(T));
    if (!data.empty()) std::memcpy(bytes.data(), data.data(), bytes.size());
    add_array_bytes(path, array_type_of<T>(), shape, static_cast<int64_t>(data.size()), std::move(bytes),
                    std::move(attrs));
  }

  // Writes the file atomically (see the top of this header). Throws fp4moe::Error on failure.
  void write(const std::string& path) const;

 private:
  struct Array {
    std::string path;
    ArrayType type;
    std::vector<int64_t> shape;
    std::vector<unsigned char> bytes;
    Attributes attributes;
  };
  void add_array_bytes(const std::string& path, ArrayType type, const std::vector<int64_t>& shape, int64_t count,
                       std::vector<unsigned char> bytes, Attributes attrs);
  void check_new_path(const std::string& path) const;
  void write_contents(int64_t file_id) const;  // file_id: an open hid_t

  Attributes root_attributes_;
  std::vector<std::pair<std::string, Table>> tables_;
  std::vector<Array> arrays_;
};

}  // namespace fp4moe
