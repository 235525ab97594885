#include "results/output_path.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "kernels/common/check.h"

namespace fp4moe {

namespace fs = std::filesystem;

namespace {

constexpr const char* kExpected = "expected a regular file or a path that does not exist yet";

// "a folder", "a character device" ... for a mode that is not a regular file.
const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

// Why `path` cannot be an output ("" when it can), and the file a write lands in (`target`).
std::string why_not_output(const std::string& path, std::string& target) {
  target = path;
  if (path.empty()) return "is empty, expected the path of the file to write";
  struct stat own {};
  if (::lstat(path.c_str(), &own) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) return "";  // created by the write (the folder check explains a
                                                         // parent that is not a folder)
    return fmt::format("cannot be inspected ({}), {}", std::strerror(errno), kExpected);
  }
  if (S_ISREG(own.st_mode)) return "";
  if (!S_ISLNK(own.st_mode)) return fmt::format("is {}, {}", kind_of(own.st_mode), kExpected);

  std::error_code ec;
  const fs::path link_to = fs::read_symlink(path, ec);
  struct stat final_target {};
  if (::stat(path.c_str(), &final_target) != 0)
    return fmt::format("is a symbolic link to '{}', which does not exist ({}); expected a link to an existing "
                       "regular file, a regular file, or a path that does not exist yet",
                       link_to.string(), std::strerror(errno));
  const fs::path resolved = fs::canonical(path, ec);
  if (!S_ISREG(final_target.st_mode) || ec)
    return fmt::format("is a symbolic link to {} ('{}'), expected a link to a regular file, a regular file, or a "
                       "path that does not exist yet",
                       kind_of(final_target.st_mode), ec ? link_to.string() : resolved.string());
  target = resolved.string();
  return "";
}

// The nearest existing ancestor of `dir` ("." for an empty relative path).
fs::path nearest_existing(fs::path dir) {
  std::error_code ec;
  while (!dir.empty() && !fs::exists(dir, ec) && dir.has_parent_path() && dir.parent_path() != dir)
    dir = dir.parent_path();
  return dir.empty() || !fs::exists(dir, ec) ? fs::path(".") : dir;
}

// Why the folder the file `target` is written in is not usable ("" when it is).
std::string why_not_folder(const std::string& target, OutputFolder folder) {
  const fs::path file(target);
  const fs::path dir = file.has_parent_path() ? file.parent_path() : fs::path(".");
  std::error_code ec;
  if (fs::is_directory(dir, ec)) {
    if (::access(dir.c_str(), W_OK | X_OK) != 0)
      return fmt::format(": folder '{}' is not writable, expected a folder this user can write in", dir.string());
    return "";
  }
  if (fs::exists(dir, ec))
    return fmt::format(": '{}' is not a folder, expected the folder to write the file in", dir.string());
  if (folder == OutputFolder::must_exist)
    return fmt::format(": folder '{}' does not exist, expected an existing folder (create it first)", dir.string());
  const fs::path base = nearest_existing(dir);
  if (!fs::is_directory(base, ec))
    return fmt::format(": cannot create the folder '{}': '{}' is not a folder, expected a path inside a writable "
                       "folder",
                       dir.string(), base.string());
  if (::access(base.c_str(), W_OK | X_OK) != 0)
    return fmt::format(": cannot create the folder '{}': folder '{}' is not writable, expected a path inside a "
                       "writable folder",
                       dir.string(), base.string());
  return "";
}

// True when `a` and `b` are non-empty, do not exist (yet) and name one path once made absolute, with the links of
// their existing parts resolved: two outputs spelled differently.
bool same_new_path(const std::string& a, const std::string& b) {
  std::error_code ec;
  if (a.empty() || b.empty() || fs::exists(a, ec) || fs::exists(b, ec)) return false;
  const fs::path ca = fs::weakly_canonical(a, ec);
  if (ec) return false;
  const fs::path cb = fs::weakly_canonical(b, ec);
  return !ec && ca == cb;
}

}  // namespace

bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {}, sb {};
  if (a.empty() || b.empty() || ::stat(a.c_str(), &sa) != 0 || ::stat(b.c_str(), &sb) != 0) return false;
  return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

std::string output_file_target(const std::string& path) {
  std::string target;
  const std::string why = why_not_output(path, target);
  if (!why.empty()) throw Error(fmt::format("'{}' {}", path, why));
  return target;
}

void check_output_path(const std::string& option, const std::string& path, const std::vector<NamedPath>& others,
                       OutputFolder folder) {
  if (path.empty()) throw Error(fmt::format("{} is empty, expected the path of the file to write", option));
  std::string target;
  std::string why = why_not_output(path, target);
  if (why.empty()) why = why_not_folder(target, folder);
  if (!why.empty()) throw Error(fmt::format("{} '{}'{}{}", option, path, why[0] == ':' ? "" : " ", why));
  for (const NamedPath& other : others)
    if (same_file(path, other.path) || same_new_path(path, other.path))
      throw Error(fmt::format("{} '{}' is the same file as {} '{}', expected a path that names none of the "
                              "command's other files (writing it would destroy that one)",
                              option, path, other.name, other.path));
}

}  // namespace fp4moe
