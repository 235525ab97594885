#include "results/h5_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <system_error>

#include "kernels/common/check.h"
#include "results/h5_util.h"
#include "results/output_path.h"

namespace fp4moe {

using h5::Handle;

namespace {

void check_object_path(const std::string& path, const char* what) {
  FP4MOE_CHECK(path.size() > 1 && path[0] == '/', "{} path '{}' must be absolute, e.g. '/bench/convert'", what,
               path);
  size_t start = 1;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    std::string part = path.substr(start, end - start);
    FP4MOE_CHECK(!part.empty() && part != "." && part != "..",
                 "{} path '{}' holds an empty, '.' or '..' component", what, path);
    start = end + 1;
  }
}

hid_t native_type(ArrayType t) {
  switch (t) {
    case ArrayType::u8: return H5T_NATIVE_UINT8;
    case ArrayType::u16: return H5T_NATIVE_UINT16;
    case ArrayType::i32: return H5T_NATIVE_INT32;
    case ArrayType::i64: return H5T_NATIVE_INT64;
    case ArrayType::f32: return H5T_NATIVE_FLOAT;
    case ArrayType::f64: return H5T_NATIVE_DOUBLE;
  }
  return H5I_INVALID_HID;
}

// Portable little-endian types in the file, whatever the host.
hid_t file_type(ArrayType t) {
  switch (t) {
    case ArrayType::u8: return H5T_STD_U8LE;
    case ArrayType::u16: return H5T_STD_U16LE;
    case ArrayType::i32: return H5T_STD_I32LE;
    case ArrayType::i64: return H5T_STD_I64LE;
    case ArrayType::f32: return H5T_IEEE_F32LE;
    case ArrayType::f64: return H5T_IEEE_F64LE;
  }
  return H5I_INVALID_HID;
}

int64_t element_size(ArrayType t) {
  switch (t) {
    case ArrayType::u8: return 1;
    case ArrayType::u16: return 2;
    case ArrayType::i32: return 4;
    case ArrayType::i64: return 8;
    case ArrayType::f32: return 4;
    case ArrayType::f64: return 8;
  }
  return 0;
}

Handle link_create_plist() {
  Handle p(H5_CHECK(H5Pcreate(H5P_LINK_CREATE), "creating a link property list"), H5Pclose);
  H5_CHECK(H5Pset_create_intermediate_group(p.get(), 1), "enabling creation of parent groups");
  return p;
}

Handle simple_space(const std::vector<hsize_t>& dims) {
  if (dims.empty()) return Handle(H5_CHECK(H5Screate(H5S_SCALAR), "creating a scalar dataspace"), H5Sclose);
  return Handle(H5_CHECK(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                         "creating a dataspace of rank {}", dims.size()),
                H5Sclose);
}

void write_string_array_attribute(hid_t obj, const std::string& name, const std::vector<std::string>& values) {
  Handle type = h5::vlen_utf8_type();
  Handle space = simple_space({static_cast<hsize_t>(values.size())});
  Handle attr(H5_CHECK(H5Acreate2(obj, name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT),
                       "creating attribute '{}'", name),
              H5Aclose);
  std::vector<const char*> ptrs;
  for (const auto& s : values) ptrs.push_back(s.c_str());
  if (!ptrs.empty()) H5_CHECK(H5Awrite(attr.get(), type.get(), ptrs.data()), "writing attribute '{}'", name);
}

void write_attribute(hid_t obj, const std::string& name, const Value& v) {
  Handle space = simple_space({});
  if (const auto* s = std::get_if<std::string>(&v)) {
    Handle type = h5::vlen_utf8_type();
    Handle attr(H5_CHECK(H5Acreate2(obj, name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT),
                         "creating attribute '{}'", name),
                H5Aclose);
    const char* p = s->c_str();
    H5_CHECK(H5Awrite(attr.get(), type.get(), &p), "writing attribute '{}'", name);
    return;
  }
  bool is_int = std::holds_alternative<int64_t>(v);
  Handle attr(H5_CHECK(H5Acreate2(obj, name.c_str(), is_int ? H5T_STD_I64LE : H5T_IEEE_F64LE, space.get(),
                                  H5P_DEFAULT, H5P_DEFAULT),
                       "creating attribute '{}'", name),
              H5Aclose);
  if (is_int) {
    int64_t x = std::get<int64_t>(v);
    H5_CHECK(H5Awrite(attr.get(), H5T_NATIVE_INT64, &x), "writing attribute '{}'", name);
  } else {
    double x = std::get<double>(v);
    H5_CHECK(H5Awrite(attr.get(), H5T_NATIVE_DOUBLE, &x), "writing attribute '{}'", name);
  }
}

void write_attributes(hid_t obj, const Attributes& attrs) {
  for (const auto& [name, v] : attrs) write_attribute(obj, name, v);
}

void write_column(hid_t group, const Column& c, int64_t rows) {
  Handle space = simple_space({static_cast<hsize_t>(rows)});
  Handle str_type;
  hid_t ftype = H5T_IEEE_F64LE, mtype = H5T_NATIVE_DOUBLE;
  const void* data = c.f64.data();
  std::vector<const char*> ptrs;
  if (c.type == ColumnType::i64) {
    ftype = H5T_STD_I64LE;
    mtype = H5T_NATIVE_INT64;
    data = c.i64.data();
  } else if (c.type == ColumnType::str) {
    str_type = h5::vlen_utf8_type();
    ftype = mtype = str_type.get();
    for (const auto& s : c.str) ptrs.push_back(s.c_str());
    data = ptrs.data();
  }
  Handle ds(H5_CHECK(H5Dcreate2(group, c.name.c_str(), ftype, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                     "creating column '{}'", c.name),
            H5Dclose);
  if (rows > 0)
    H5_CHECK(H5Dwrite(ds.get(), mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), "writing column '{}'", c.name);
}

void write_table(hid_t file, const std::string& path, const Table& t) {
  Handle lcpl = link_create_plist();
  Handle group(H5_CHECK(H5Gcreate2(file, path.c_str(), lcpl.get(), H5P_DEFAULT, H5P_DEFAULT),
                        "creating table group '{}'", path),
               H5Gclose);
  std::vector<std::string> names;
  for (const auto& c : t.columns()) {
    write_column(group.get(), c, t.rows());
    names.push_back(c.name);
  }
  write_string_array_attribute(group.get(), "columns", names);
  write_attributes(group.get(), t.attributes());
}

// Makes sure the file's bytes reach the disk before the rename publishes it.
void sync_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  FP4MOE_CHECK(fd >= 0, "cannot reopen '{}' to flush it: {}", path, std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  FP4MOE_CHECK(rc == 0, "cannot flush '{}' to disk: {}", path, std::strerror(err));
}

}  // namespace

void ResultFile::set_attribute(const std::string& name, Value v) {
  fp4moe::set_attribute(root_attributes_, name, std::move(v));
}

void ResultFile::check_new_path(const std::string& path) const {
  for (const auto& [p, t] : tables_) FP4MOE_CHECK(p != path, "result file: '{}' was already added (a table)", path);
  for (const auto& a : arrays_) FP4MOE_CHECK(a.path != path, "result file: '{}' was already added (an array)", path);
}

void ResultFile::add_table(const std::string& path, Table table) {
  check_object_path(path, "table");
  check_new_path(path);
  tables_.emplace_back(path, std::move(table));
}

void ResultFile::add_array_bytes(const std::string& path, ArrayType type, const std::vector<int64_t>& shape,
                                 int64_t count, std::vector<unsigned char> bytes, Attributes attrs) {
  check_object_path(path, "array");
  check_new_path(path);
  int64_t n = 1;
  std::string dims;
  for (int64_t d : shape) {
    FP4MOE_CHECK(d >= 0, "array '{}': negative dimension {}", path, d);
    n *= d;
    if (!dims.empty()) dims += ", ";
    dims += std::to_string(d);
  }
  FP4MOE_CHECK(n == count, "array '{}': shape [{}] holds {} elements, got {}", path, dims, n, count);
  FP4MOE_CHECK(static_cast<int64_t>(bytes.size()) == count * element_size(type), "array '{}': byte size mismatch",
               path);
  arrays_.push_back(Array{path, type, shape, std::move(bytes), std::move(attrs)});
}

void ResultFile::write_contents(int64_t file_id) const {
  hid_t file = file_id;
  Handle root(H5_CHECK(H5Gopen2(file, "/", H5P_DEFAULT), "opening the root group"), H5Gclose);
  write_attributes(root.get(), root_attributes_);
  for (const auto& [path, table] : tables_) write_table(file, path, table);
  for (const auto& a : arrays_) {
    std::vector<hsize_t> dims(a.shape.begin(), a.shape.end());
    Handle space = simple_space(dims);
    Handle lcpl = link_create_plist();
    Handle ds(H5_CHECK(H5Dcreate2(file, a.path.c_str(), file_type(a.type), space.get(), lcpl.get(), H5P_DEFAULT,
                                  H5P_DEFAULT),
                       "creating array '{}'", a.path),
              H5Dclose);
    if (!a.bytes.empty())
      H5_CHECK(H5Dwrite(ds.get(), native_type(a.type), H5S_ALL, H5S_ALL, H5P_DEFAULT, a.bytes.data()),
               "writing array '{}'", a.path);
    write_attributes(ds.get(), a.attributes);
  }
}

void ResultFile::write(const std::string& path) const {
  FP4MOE_CHECK(!path.empty(), "result file: empty output path");
  std::string target;
  try {
    target = output_file_target(path);  // refuses a device, FIFO, socket or directory before anything is written
  } catch (const Error& e) {
    throw Error(fmt::format("writing result file '{}' failed: {}", path, e.what()));
  }
  const std::string tmp = fmt::format("{}.tmp-{}", target, static_cast<long>(::getpid()));
  h5::ErrorSilencer silence;
  try {
    Handle file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
    if (!file.valid()) h5::fail_h5(__FILE__, __LINE__, fmt::format("cannot create temporary file '{}'", tmp));
    write_contents(file.get());
    if (!file.reset()) h5::fail_h5(__FILE__, __LINE__, fmt::format("closing temporary file '{}' failed", tmp));
    sync_file(tmp);
    if (std::rename(tmp.c_str(), target.c_str()) != 0)
      fail(__FILE__, __LINE__, fmt::format("cannot rename '{}' to '{}': {}", tmp, target, std::strerror(errno)));
  } catch (const Error& e) {
    std::remove(tmp.c_str());
    throw Error(fmt::format("writing result file '{}' failed: {}", path, e.what()));
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
}

}  // namespace fp4moe
