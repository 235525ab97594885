#include "results/h5_read.h"

#include <fmt/format.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "kernels/common/check.h"

namespace fp4moe {

using h5::Handle;

H5Reader::H5Reader(const std::string& path) : path_(path) {
  struct stat st {};
  FP4MOE_CHECK(::stat(path.c_str(), &st) == 0, "cannot open '{}': {}", path, std::strerror(errno));
  FP4MOE_CHECK(S_ISREG(st.st_mode), "cannot open '{}': not a regular file", path);
  h5::ErrorSilencer silence;
  htri_t is_h5 = H5Fis_hdf5(path.c_str());
  if (is_h5 < 0) h5::fail_h5(__FILE__, __LINE__, fmt::format("cannot read '{}'", path));
  FP4MOE_CHECK(is_h5 > 0, "'{}' is not an HDF5 file", path);
  file_ = Handle(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file_.valid()) h5::fail_h5(__FILE__, __LINE__, fmt::format("cannot open HDF5 file '{}'", path));
}

// H5Ovisit's callback and signature changed in HDF5 1.12 (H5O_info2_t, H5Ovisit3).
#if H5_VERSION_GE(1, 12, 0)
using ObjectInfo = H5O_info2_t;
#define FP4MOE_H5OVISIT H5Ovisit3
#else
using ObjectInfo = H5O_info_t;
#define FP4MOE_H5OVISIT H5Ovisit2
#endif

static herr_t collect_dataset(hid_t, const char* name, const ObjectInfo* info, void* out) {
  if (info->type == H5O_TYPE_DATASET && std::strcmp(name, ".") != 0)
    static_cast<std::vector<std::string>*>(out)->emplace_back(name);
  return 0;
}

std::vector<std::string> H5Reader::datasets() const {
  h5::ErrorSilencer silence;
  std::vector<std::string> names;
  H5_CHECK(FP4MOE_H5OVISIT(file_.get(), H5_INDEX_NAME, H5_ITER_INC, collect_dataset, &names, H5O_INFO_BASIC),
           "listing the datasets of '{}'", path_);
  return names;
}

bool H5Reader::has_dataset(const std::string& name) const {
  std::string want = (!name.empty() && name[0] == '/') ? name.substr(1) : name;
  for (const auto& n : datasets())
    if (n == want) return true;
  return false;
}

static std::string type_name(hid_t type) {
  H5T_class_t cls = H5Tget_class(type);
  size_t bits = H5Tget_size(type) * 8;
  switch (cls) {
    case H5T_FLOAT: return fmt::format("float{}", bits);
    case H5T_INTEGER: return fmt::format("{}int{}", H5Tget_sign(type) == H5T_SGN_NONE ? "u" : "", bits);
    case H5T_STRING: return "string";
    case H5T_COMPOUND: return "compound";
    case H5T_ENUM: return "enum";
    case H5T_ARRAY: return "array";
    case H5T_VLEN: return "vlen";
    case H5T_OPAQUE: return "opaque";
    case H5T_REFERENCE: return "reference";
    case H5T_BITFIELD: return "bitfield";
    case H5T_TIME: return "time";
    default: return "unknown";
  }
}

static Handle open_dataset(hid_t file, const std::string& file_path, const std::string& name) {
  Handle ds(H5Dopen2(file, name.c_str(), H5P_DEFAULT), H5Dclose);
  if (!ds.valid()) h5::fail_h5(__FILE__, __LINE__, fmt::format("no dataset '{}' in '{}'", name, file_path));
  return ds;
}

H5DatasetInfo H5Reader::info(const std::string& name) const {
  h5::ErrorSilencer silence;
  Handle ds = open_dataset(file_.get(), path_, name);
  Handle type(H5_CHECK(H5Dget_type(ds.get()), "reading the type of '{}'", name), H5Tclose);
  Handle space(H5_CHECK(H5Dget_space(ds.get()), "reading the shape of '{}'", name), H5Sclose);
  int rank = H5_CHECK(H5Sget_simple_extent_ndims(space.get()), "reading the rank of '{}'", name);
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  if (rank > 0) H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  H5DatasetInfo out{type_name(type.get()), {}};
  for (hsize_t d : dims) out.shape.push_back(static_cast<int64_t>(d));
  return out;
}

template <typename T>
std::vector<T> H5Reader::read(const std::string& name, hid_t mem_type) const {
  h5::ErrorSilencer silence;
  Handle ds = open_dataset(file_.get(), path_, name);
  Handle type(H5_CHECK(H5Dget_type(ds.get()), "reading the type of '{}'", name), H5Tclose);
  H5T_class_t cls = H5Tget_class(type.get());
  FP4MOE_CHECK(cls == H5T_FLOAT || cls == H5T_INTEGER, "dataset '{}' in '{}' holds {}, expected numbers", name,
               path_, type_name(type.get()));
  Handle space(H5_CHECK(H5Dget_space(ds.get()), "reading the shape of '{}'", name), H5Sclose);
  hssize_t n = H5_CHECK(H5Sget_simple_extent_npoints(space.get()), "counting the elements of '{}'", name);
  std::vector<T> out(static_cast<size_t>(n));
  if (n > 0)
    H5_CHECK(H5Dread(ds.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()), "reading dataset '{}' of '{}'",
             name, path_);
  return out;
}

std::vector<double> H5Reader::read_f64(const std::string& name) const { return read<double>(name, H5T_NATIVE_DOUBLE); }

std::vector<uint16_t> H5Reader::read_u16(const std::string& name) const {
  return read<uint16_t>(name, H5T_NATIVE_UINT16);
}

std::optional<std::string> H5Reader::string_attribute(const std::string& object, const std::string& attr) const {
  h5::ErrorSilencer silence;
  const std::string obj = object.empty() ? "/" : object;
  htri_t exists = H5Aexists_by_name(file_.get(), obj.c_str(), attr.c_str(), H5P_DEFAULT);
  if (exists <= 0) {
    H5Eclear2(H5E_DEFAULT);
    return std::nullopt;
  }
  Handle a(H5_CHECK(H5Aopen_by_name(file_.get(), obj.c_str(), attr.c_str(), H5P_DEFAULT, H5P_DEFAULT),
                    "opening attribute '{}' of '{}'", attr, obj),
           H5Aclose);
  Handle ftype(H5_CHECK(H5Aget_type(a.get()), "reading the type of attribute '{}'", attr), H5Tclose);
  if (H5Tget_class(ftype.get()) != H5T_STRING) return std::nullopt;
  Handle space(H5_CHECK(H5Aget_space(a.get()), "reading the shape of attribute '{}'", attr), H5Sclose);
  if (H5Sget_simple_extent_npoints(space.get()) != 1) return std::nullopt;
  if (H5Tis_variable_str(ftype.get()) > 0) {
    Handle mtype = h5::vlen_utf8_type();
    char* p = nullptr;
    H5_CHECK(H5Aread(a.get(), mtype.get(), &p), "reading attribute '{}' of '{}'", attr, obj);
    std::string s = p ? p : "";
    H5free_memory(p);
    return s;
  }
  // Fixed-length string (numpy bytes attributes): read the bytes, drop the padding.
  size_t len = H5Tget_size(ftype.get());
  std::string s(len, '\0');
  H5_CHECK(H5Aread(a.get(), ftype.get(), s.data()), "reading attribute '{}' of '{}'", attr, obj);
  s.resize(std::strlen(s.c_str()));
  return s;
}

}  // namespace fp4moe
