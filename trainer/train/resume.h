// Which checkpoint `fp4moe train --resume PATH|latest` continues from (files of trainer/checkpoint.h).
#pragma once

#include <string>

namespace fp4moe {

// The checkpoint of the highest step in `dir`: among the files named step_<digits>.ckpt (checkpoint_file_name),
// the one with the largest number; temporary files of an unfinished write and other names are ignored. "" when
// there is none. Throws fp4moe::Error when `dir` is not a folder or cannot be listed.
std::string latest_checkpoint(const std::string& dir);

// `arg` "latest": latest_checkpoint(checkpoint_dir), which must exist. Anything else is a path that must name an
// existing regular file. Throws fp4moe::Error saying which: no checkpoint_dir for "latest", no checkpoint in it,
// or a missing file.
std::string resolve_resume_path(const std::string& arg, const std::string& checkpoint_dir);

}  // namespace fp4moe
