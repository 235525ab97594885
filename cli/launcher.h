// The process supervision of `fp4moe launch` (cmd_launch.cpp): starts one child process per rank, relays their
// output, and ends them all when one fails or when the launcher is asked to stop.
//
// Each child runs in a process group of its own (setpgid), so that a terminal's Ctrl-C reaches the launcher only and
// the launcher's signals reach the child and anything it started; it dies with the launcher (PR_SET_PDEATHSIG
// SIGKILL), so that no rank outlives a launcher that was killed. Out of the terminal's foreground group, a child
// must not read the terminal (it would be stopped by SIGTTIN); fp4moe's subcommands read none. Failure behaviour:
//   - a child that exits non-zero or is killed by a signal (the first one) fails the launch: the others' groups get
//     SIGTERM, then SIGKILL after the grace period; the launch ends with one line naming the rank and its exit
//     status or signal, and exits with the child's status (128 + the signal number for a signal);
//   - a SIGINT or SIGTERM to the launcher is forwarded to every child's group (train stops after its current step
//     and writes its checkpoint); a second one sends SIGKILL; the launch exits 128 + the first signal's number;
//   - the launcher returns only once every child was reaped.
#pragma once

#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace fp4moe::cli {

struct ChildSpec {
  int rank = 0;
  std::vector<std::pair<std::string, std::string>> env;  // set (or replaced) in the launcher's environment
};

struct LaunchSpec {
  std::string executable;                // the program every child runs (execv)
  std::vector<std::string> argv;         // its argument vector, argv[0] included
  std::vector<ChildSpec> children;       // one per rank
  int world_size = 1;                    // for the messages ("rank 1 of 2")
  bool label_output = false;             // prefix each line of a child's stdout and stderr with "[rank R] "
  std::chrono::milliseconds grace{10000};  // between SIGTERM and SIGKILL
};

struct LaunchOutcome {
  int exit_code = 0;    // 0: every child exited 0
  std::string message;  // one line when exit_code != 0 (without the "fp4moe launch: " prefix)
};

// Runs the children to completion as described above. Rejects (fp4moe::Error) an empty child list or argv, and a
// failure to create pipes or processes (children already started are killed and reaped first).
LaunchOutcome run_children(const LaunchSpec& spec);

}  // namespace fp4moe::cli
