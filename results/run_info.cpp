#include "results/run_info.h"

#include <fmt/format.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string_view>

namespace fp4moe {

namespace {

bool shell_safe(const std::string& s) {
  if (s.empty()) return false;
  for (unsigned char c : s)
    if (!(std::isalnum(c) || std::string_view("_-./=:,+@%").find(static_cast<char>(c)) != std::string_view::npos))
      return false;
  return true;
}

std::string shell_quote(const std::string& s) {
  if (shell_safe(s)) return s;
  std::string q = "'";
  for (char c : s) q += (c == '\'') ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

}  // namespace

std::string source_git_sha() {
  // A copy of the tree without (or with stale) git metadata, e.g. on a GPU machine: the caller names the commit.
  if (const char* env = std::getenv("FP4MOE_GIT_SHA"); env != nullptr && *env != '\0') return env;
#ifdef FP4MOE_SOURCE_DIR
  const std::string cmd = fmt::format("git -C {} rev-parse HEAD 2>/dev/null", shell_quote(FP4MOE_SOURCE_DIR));
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return "unknown";
  char buf[128] = {};
  std::string out = std::fgets(buf, sizeof buf, p) ? buf : "";
  int status = ::pclose(p);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  if (status == 0 && out.size() == 40) return out;
#endif
  return "unknown";
}

std::string utc_timestamp() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string command_line(int argc, const char* const* argv) {
  std::string s;
  for (int i = 0; i < argc; ++i) {
    if (i) s += ' ';
    s += shell_quote(argv[i] ? argv[i] : "");
  }
  return s;
}

void fill_root_attributes(ResultFile& file, const std::string& command, const EnvInfo& env) {
  file.set_attribute("schema_version", kResultSchemaVersion);
  file.set_attribute("git_sha", source_git_sha());
  file.set_attribute("date", utc_timestamp());
  file.set_attribute("gpu", gpu_summary(env));
  file.set_attribute("driver", env.driver);
  file.set_attribute("cuda", env.cuda_runtime);
  file.set_attribute("cublaslt", env.cublaslt);
  file.set_attribute("nccl", env.nccl);
  file.set_attribute("host", env.host);
  file.set_attribute("command", command);
}

void fill_root_attributes(ResultFile& file, const std::string& command) {
  fill_root_attributes(file, command, query_env_info());
}

}  // namespace fp4moe
