// Internals shared by the HDF5 writer and reader: owned handles, HDF5's error stack turned into one line,
// and the variable-length UTF-8 string type.
#pragma once

#include <hdf5.h>

#include <string>

namespace fp4moe::h5 {

// Owns an HDF5 identifier and closes it with the matching H5?close on scope exit.
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer close) : id_(id), close_(close) {}
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle(Handle&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = H5I_INVALID_HID; }
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = o.id_;
      close_ = o.close_;
      o.id_ = H5I_INVALID_HID;
    }
    return *this;
  }
  ~Handle() { reset(); }
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  // Closes now; returns false when the close itself failed (for a file: data may not have reached the disk).
  bool reset() {
    bool ok = true;
    if (id_ >= 0 && close_) ok = close_(id_) >= 0;
    id_ = H5I_INVALID_HID;
    return ok;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer close_ = nullptr;
};

// Turns off HDF5's automatic printing of its error stack to stderr for the lifetime of the object (errors are
// reported through fp4moe::Error instead), restoring the previous handler afterwards.
class ErrorSilencer {
 public:
  ErrorSilencer();
  ~ErrorSilencer();
  ErrorSilencer(const ErrorSilencer&) = delete;
  ErrorSilencer& operator=(const ErrorSilencer&) = delete;

 private:
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
};

// HDF5's current error stack in one line: the outermost and the innermost descriptions (the innermost usually
// carries the system's reason, e.g. "errno = 13, error message = 'Permission denied'"). Empty when none.
std::string error_stack_text();

// Throws fp4moe::Error "<what>: <HDF5 error stack>" (with file:line of the caller).
[[noreturn]] void fail_h5(const char* file, int line, const std::string& what);

// Variable-length UTF-8 string datatype (caller owns the handle).
Handle vlen_utf8_type();

}  // namespace fp4moe::h5

// H5_CHECK(H5Dwrite(...), "writing column '{}'", name): fails with the HDF5 reason when the result is negative.
#define H5_CHECK(call, ...)                                                             \
  [&]() {                                                                               \
    auto r_ = (call);                                                                   \
    if (r_ < 0) ::fp4moe::h5::fail_h5(__FILE__, __LINE__, fmt::format(__VA_ARGS__));   \
    return r_;                                                                          \
  }()
