// Output paths (results/output_path.h): what an output may be (a new path, a regular file, a symbolic link to one)
// and what it may not (a folder, a device, a FIFO, a socket, a dangling link, one of the command's other files by
// any name: the same path, another spelling, a symbolic link, a hard link); the atomic writer (results/h5_file.h)
// keeps to the same rules, so that no write replaces a device node or writes through a FIFO.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <string>

#include "kernels/common/check.h"
#include "results/h5_file.h"
#include "results/h5_read.h"
#include "results/output_path.h"
#include "tests/common/temp_dir.h"
#include "tests/common/trainer_test_util.h"

namespace fs = std::filesystem;

namespace fp4moe {
namespace {

class OutputPath : public ::testing::Test {
 protected:
  test::TempDir tmp_;  // before dir_: members are made in this order
  fs::path dir_ = tmp_.path();
  std::string file(const std::string& name) const { return (dir_ / name).string(); }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(file(name), std::ios::binary) << text;
    return file(name);
  }
  static std::string contents(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  // A Unix-domain socket bound at `path` (kept open for the test's lifetime).
  std::string socket_at(const std::string& name) {
    const std::string path = file(name);
    sock_ = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (sock_ < 0 || path.size() >= sizeof addr.sun_path) return "";
    std::strcpy(addr.sun_path, path.c_str());
    if (::bind(sock_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return "";
    return path;
  }
  ~OutputPath() override {
    if (sock_ >= 0) ::close(sock_);
  }

  int sock_ = -1;
};

using test::error_message;

void expect_error_with(const std::function<void()>& f, std::initializer_list<std::string> parts) {
  const std::string msg = error_message(f);
  EXPECT_FALSE(msg.empty()) << "not refused; expected a message with '" << *parts.begin() << "'";
  for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
  EXPECT_EQ(msg.find(".cpp:"), std::string::npos) << "no source location: " << msg;
}

TEST_F(OutputPath, SameFileComparesIdentityNotSpelling) {
  const std::string a = write("a.h5", "a"), b = write("b.h5", "b");
  fs::create_symlink(a, file("link.h5"));
  fs::create_hard_link(a, file("hard.h5"));
  EXPECT_TRUE(same_file(a, a));
  EXPECT_TRUE(same_file(a, (dir_ / "." / "a.h5").string()));
  EXPECT_TRUE(same_file(a, file("link.h5")));
  EXPECT_TRUE(same_file(file("hard.h5"), a));
  EXPECT_FALSE(same_file(a, b));
  EXPECT_FALSE(same_file(a, file("missing.h5")));
  EXPECT_FALSE(same_file(file("missing.h5"), file("missing.h5")));  // nothing to destroy
  EXPECT_FALSE(same_file(a, ""));
}

TEST_F(OutputPath, NewPathsAndRegularFilesAreWrittenInPlace) {
  EXPECT_EQ(output_file_target(file("new.h5")), file("new.h5"));
  const std::string old = write("old.h5", "previous");
  EXPECT_EQ(output_file_target(old), old);
  check_output_path("--output", file("new.h5"), {});
  check_output_path("--output", old, {{"--input", write("in.h5", "input")}});
}

TEST_F(OutputPath, OnlyRegularFilesMayBeReplaced) {
  ASSERT_EQ(::mkfifo(file("fifo").c_str(), 0600), 0);
  expect_error_with([&] { output_file_target(file("fifo")); }, {file("fifo"), "is a FIFO", "expected a regular file"});
  expect_error_with([&] { check_output_path("--output", file("fifo"), {}); },
                    {"--output '" + file("fifo") + "' is a FIFO", "expected a regular file"});
  expect_error_with([&] { check_output_path("--out", dir_.string(), {}); },
                    {"--out '" + dir_.string() + "' is a folder", "expected a regular file"});
  const std::string sock = socket_at("sock");
  ASSERT_FALSE(sock.empty());
  expect_error_with([&] { check_output_path("--h5", sock, {}); }, {"--h5 '" + sock + "' is a socket"});
  if (fs::exists("/dev/null"))  // checked only: nothing is written
    expect_error_with([] { check_output_path("--output", "/dev/null", {}); },
                      {"--output '/dev/null' is a character device", "expected a regular file"});
  expect_error_with([] { check_output_path("--output", "", {}); }, {"--output is empty"});
}

TEST_F(OutputPath, SymbolicLinksAreFollowedToARegularFile) {
  const std::string target = write("target.h5", "previous");
  fs::create_symlink(target, file("link.h5"));
  fs::create_symlink(file("link.h5"), file("chain.h5"));
  EXPECT_EQ(output_file_target(file("link.h5")), fs::canonical(target).string());
  EXPECT_EQ(output_file_target(file("chain.h5")), fs::canonical(target).string());
  check_output_path("--output", file("chain.h5"), {});

  fs::create_symlink(file("nowhere.h5"), file("dangling.h5"));
  expect_error_with([&] { check_output_path("--output", file("dangling.h5"), {}); },
                    {file("dangling.h5"), "symbolic link to '" + file("nowhere.h5") + "', which does not exist"});
  fs::create_symlink(dir_, file("to_folder"));
  expect_error_with([&] { check_output_path("--output", file("to_folder"), {}); },
                    {file("to_folder"), "symbolic link to a folder"});
  if (fs::exists("/dev/null")) {
    fs::create_symlink("/dev/null", file("to_null.h5"));
    expect_error_with([&] { output_file_target(file("to_null.h5")); }, {"symbolic link to a character device"});
  }
}

TEST_F(OutputPath, NoOutputIsAnotherFileOfTheCommandByAnyName) {
  const std::string in = write("in.h5", "input");
  fs::create_symlink(in, file("link.h5"));
  fs::create_hard_link(in, file("hard.h5"));
  for (const std::string& out : {in, (dir_ / "." / "in.h5").string(), file("link.h5"), file("hard.h5")}) {
    SCOPED_TRACE(out);
    expect_error_with([&] { check_output_path("--output", out, {{"--input", in}}); },
                      {"--output '" + out + "' is the same file as --input '" + in + "'", "would destroy"});
  }
  // Two outputs that do not exist yet, spelled differently.
  const std::string json_as_h5 = (dir_ / "." / "r.h5").string();
  expect_error_with([&] { check_output_path("--h5", file("r.h5"), {{"--benchmark_out", json_as_h5}}); },
                    {"--h5 '" + file("r.h5") + "' is the same file as --benchmark_out"});
  check_output_path("--h5", file("r.h5"), {{"--benchmark_out", file("r.json")}});
  // The matching entry is named, whichever it is; other missing or empty entries are skipped.
  expect_error_with(
      [&] {
        check_output_path("--out", file("hard.h5"),
                          {{"--config", ""}, {"--resume", file("missing.ckpt")}, {"the token shard", in}});
      },
      {"is the same file as the token shard '" + in + "'"});
  EXPECT_EQ(contents(in), "input");
}

TEST_F(OutputPath, TheFolderMustExistOrBeCreatable) {
  const std::string missing = file("no/such/q.h5");
  expect_error_with([&] { check_output_path("--output", missing, {}); },
                    {"--output '" + missing + "': folder '" + file("no/such") + "' does not exist"});
  check_output_path("--out", missing, {}, OutputFolder::may_be_created);
  const std::string plain = write("plain", "x");
  expect_error_with(
      [&] { check_output_path("--h5", plain + "/sub/r.h5", {}, OutputFolder::may_be_created); },
      {"--h5 '" + plain + "/sub/r.h5': cannot create the folder '" + plain + "/sub': '" + plain + "' is not a folder"});
  expect_error_with([&] { check_output_path("--output", plain + "/q.h5", {}); },
                    {"--output '" + plain + "/q.h5': '" + plain + "' is not a folder"});
  EXPECT_FALSE(fs::exists(file("no")));
  if (::geteuid() != 0) {  // root writes anywhere
    fs::create_directories(file("ro"));
    fs::permissions(file("ro"), fs::perms::owner_read | fs::perms::owner_exec);
    expect_error_with([&] { check_output_path("--out", file("ro/x.h5"), {}); },
                      {"folder '" + file("ro") + "' is not writable"});
    expect_error_with([&] { check_output_path("--out", file("ro/a/x.h5"), {}, OutputFolder::may_be_created); },
                      {"folder '" + file("ro") + "' is not writable"});
  }
}

// The atomic writer itself refuses what is not a regular file, before anything is written, and writes through a
// symbolic link to its target (the link stays).
TEST_F(OutputPath, ResultFileWriteKeepsToTheRules) {
  ResultFile f;
  f.set_attribute("git_sha", "x");

  ASSERT_EQ(::mkfifo(file("fifo").c_str(), 0600), 0);
  expect_error_with([&] { f.write(file("fifo")); }, {"writing result file '" + file("fifo") + "'", "is a FIFO"});
  EXPECT_TRUE(fs::is_fifo(file("fifo")));

  // A device node of this test's own (a copy of /dev/null's numbers), where the system lets us make one; else the
  // real /dev/null, which an unprivileged write could not replace anyway.
  const bool own_node = ::mknod(file("null").c_str(), S_IFCHR | 0666, ::makedev(1, 3)) == 0;
  const std::string device = own_node ? file("null") : "/dev/null";
  if (fs::exists(device)) {
    expect_error_with([&] { f.write(device); }, {"writing result file '" + device + "'", "is a character device"});
    EXPECT_TRUE(fs::is_character_file(device));
    EXPECT_FALSE(fs::exists(device + ".tmp-" + std::to_string(::getpid())));
  }

  expect_error_with([&] { f.write(dir_.string()); }, {"is a folder"});
  fs::create_symlink(file("nowhere.h5"), file("dangling.h5"));
  expect_error_with([&] { f.write(file("dangling.h5")); }, {"which does not exist"});
  EXPECT_FALSE(fs::exists(file("nowhere.h5")));

  const std::string target = write("target.h5", "previous");
  fs::create_symlink(target, file("link.h5"));
  f.write(file("link.h5"));
  EXPECT_TRUE(fs::is_symlink(file("link.h5")));
  EXPECT_EQ(H5Reader(target).string_attribute("/", "git_sha"), "x");
}

}  // namespace
}  // namespace fp4moe
