// Output paths of every command that writes a file (quantize --output, train --out, parity --out, the benchmarks'
// --h5): what the atomic writer (results/h5_file.h: a temporary file beside the output, then a rename over it) may
// replace, checked before any work starts so that a bad path fails at once and nothing is lost.
//
// The rules, for an output path P:
//   - P does not exist yet (it is created), or P is a regular file (it is replaced whole).
//   - Anything else that exists is refused: a folder, a character or block device (as root, a rename over
//     /dev/null would replace the device node with the result file), a FIFO, a socket.
//   - A symbolic link is followed (through a chain of links): the file written is its final target, which must be
//     an existing regular file; the link stays a link and names the new file. A link to anything else, or whose
//     target does not exist, is refused.
//   - P is not one of the command's other files (the inputs it reads, another output it writes): compared by
//     identity (device and inode, after following links), so another spelling of an input's path, a symbolic
//     link to it or a hard link to it is refused too; two paths that do not exist yet are compared as absolute
//     paths with the links of their existing parts resolved.
#pragma once

#include <string>
#include <vector>

namespace fp4moe {

// Another file of a command, named as the user gave it: {"--input", "x.h5"}, {"--config", "configs/tiny.toml"}.
struct NamedPath {
  std::string name;
  std::string path;
};

// True when `a` and `b` both exist and are one file: the same device and inode after following symbolic links (the
// same path spelled differently, a symbolic link to it, or a hard link). False when either does not exist.
bool same_file(const std::string& a, const std::string& b);

// The file an atomic write of `path` creates or replaces: `path` itself when it does not exist or is a regular
// file; the final target (canonical path) of a symbolic link to a regular file. Throws fp4moe::Error
// "'<path>' is <what it is>, expected <what an output may be>" for an empty path, an existing file that is not a
// regular file (its kind named), a symbolic link to one or to nothing, or a path that cannot be inspected (e.g. a
// parent that is a file). Messages carry no source location: they are meant for the user as they are.
std::string output_file_target(const std::string& path);

// Whether the output's folder must exist already, or may be created by the command (train --out, bench --h5).
enum class OutputFolder { must_exist, may_be_created };

// Everything a command checks about its output `path` (given as option `option`, e.g. "--output") before any
// work: a non-empty path, output_file_target's rules, the folder of the file written (must_exist: an existing,
// writable folder; may_be_created: the nearest existing ancestor is a writable folder), and that it is none
// of `others` (same_file, or the same absolute path when neither exists yet; entries with an empty path are
// skipped).
// Throws fp4moe::Error, one line: "<option> '<path>' <what was wrong>, expected <what was expected>".
void check_output_path(const std::string& option, const std::string& path, const std::vector<NamedPath>& others,
                       OutputFolder folder = OutputFolder::must_exist);

}  // namespace fp4moe
