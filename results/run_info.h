// Provenance of a result file: the root attributes of DESIGN.md "Results" (schema_version, git_sha, date, gpu,
// driver, cuda, cublaslt, nccl, host, command).
#pragma once

#include <string>

#include "results/env_info.h"
#include "results/h5_file.h"

namespace fp4moe {

// Version of the result-file layout described in results/h5_file.h. Bump it when the layout changes.
constexpr int64_t kResultSchemaVersion = 1;

// HEAD of the source tree this binary was built from (git rev-parse at run time), or $FP4MOE_GIT_SHA when set
// (a copy of the tree without git metadata); "unknown" when neither gives one.
std::string source_git_sha();

// The current UTC time as ISO 8601, e.g. "2026-01-31T12:00:00Z".
std::string utc_timestamp();

// argv joined by spaces, each argument quoted for a POSIX shell when it needs it.
std::string command_line(int argc, const char* const* argv);

// Sets the root attributes on `file`: schema_version (int64), git_sha, date, gpu (gpu_summary), driver, cuda
// (runtime), cublaslt, nccl, host, command (strings).
void fill_root_attributes(ResultFile& file, const std::string& command, const EnvInfo& env);
void fill_root_attributes(ResultFile& file, const std::string& command);  // queries the environment

}  // namespace fp4moe
