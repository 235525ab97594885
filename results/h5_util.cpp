#include "results/h5_util.h"

#include <fmt/format.h>

#include <vector>

#include "kernels/common/check.h"

namespace fp4moe::h5 {

ErrorSilencer::ErrorSilencer() {
  H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

ErrorSilencer::~ErrorSilencer() { H5Eset_auto2(H5E_DEFAULT, func_, data_); }

static herr_t collect_description(unsigned, const H5E_error2_t* e, void* out) {
  auto* v = static_cast<std::vector<std::string>*>(out);
  if (e && e->desc && *e->desc) v->emplace_back(e->desc);
  return 0;
}

std::string error_stack_text() {
  std::vector<std::string> descs;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_description, &descs);
  if (descs.empty()) return {};
  if (descs.size() == 1 || descs.front() == descs.back()) return descs.front();
  return descs.front() + " (" + descs.back() + ")";
}

void fail_h5(const char* file, int line, const std::string& what) {
  std::string why = error_stack_text();
  H5Eclear2(H5E_DEFAULT);
  fail(file, line, why.empty() ? what : fmt::format("{}: {}", what, why));
}

Handle vlen_utf8_type() {
  hid_t t = H5Tcopy(H5T_C_S1);
  if (t < 0) fail_h5(__FILE__, __LINE__, "creating the HDF5 string type");
  Handle h(t, H5Tclose);
  if (H5Tset_size(t, H5T_VARIABLE) < 0 || H5Tset_cset(t, H5T_CSET_UTF8) < 0)
    fail_h5(__FILE__, __LINE__, "creating the HDF5 variable-length UTF-8 string type");
  return h;
}

}  // namespace fp4moe::h5
