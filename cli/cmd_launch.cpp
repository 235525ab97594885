// `fp4moe launch [--gpus N] [--timeout-s T] [--grace-s G] [--rendezvous DIR] -- <subcommand> [its options]`: runs
// the subcommand as the ranks of a multi-process run (issue 17 item 3), one process per GPU, each with the rank
// environment of trainer/comm/rank_env.h and NCCL_NVLS_ENABLE=0 (no NVLink multicast: NVLS buffers take GPU memory
// and the exchanges are point-to-point).
//
// One node, no scheduler: N child processes of this executable (/proc/self/exe), ranks 0..N-1, local rank = rank.
// Every child sees the node's GPUs (CUDA_VISIBLE_DEVICES, if the user set it, passes through unchanged) and uses
// the one of its local rank (rank_device): NCCL then sees all GPUs of the node for its topology (NVLink paths
// between the processes), the same rule holds under a scheduler where every task sees every GPU, and a user's
// CUDA_VISIBLE_DEVICES keeps its meaning. The NCCL unique id goes through <fresh folder>/nccl-unique-id: the folder
// is made by mkdtemp for this launch (under --rendezvous DIR, else $TMPDIR, else /tmp) and removed at the end, so a
// file of an earlier run is never read. World size 1 (the default, --gpus 1) runs the subcommand as one child the
// same way, its output unchanged; with N > 1 each line a child writes to stdout or stderr is prefixed "[rank R] ".
//
// Under a scheduler (scheduler_ranks: srun's tasks or mpirun's processes) the ranks are its own: launch starts one
// child with the scheduler's rank, size and local rank, and --gpus is refused. The id file is
// DIR/nccl-unique-id[.slurm-<job>.<step>] in --rendezvous DIR, required when the world has more than one rank; DIR
// must be a folder every rank reads (a shared file system when the ranks span several nodes). Under Open MPI, which
// names no run, DIR must be fresh for each run (rank 0 refuses an id file that exists). Ending the other nodes'
// ranks when one fails is then the scheduler's job (srun --kill-on-bad-exit, mpirun's default) together with the
// bounded NCCL waits (nccl_transport.h).
//
// Failure behaviour: cli/launcher.h. FP4MOE_LAUNCH_EXECUTABLE, when set, names the program the children run instead
// of this one, with the arguments after -- (not checked against fp4moe's subcommands): the tests run a script
// through it that fails or hangs on chosen ranks, and a GPU test program under launch builds its NCCL communicator
// from the rank environment (tests/trainer/test_rank_env_gpu.cpp).
// Exit codes: 0 every rank exited 0; 2 bad arguments (one line, nothing started); otherwise the failed rank's exit
// status (128 + the signal number when a signal ended it), or 128 + the signal number of a SIGINT or SIGTERM that
// stopped the launch; 1 the launch itself failed (no process could be started).
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>

#include "cli/commands.h"
#include "cli/launcher.h"
#include "kernels/common/check.h"
#include "trainer/comm/rank_env.h"

namespace fp4moe::cli {
namespace {

namespace fs = std::filesystem;

// FP4MOE_LAUNCH_EXECUTABLE, or "" when it is not set.
std::string launch_executable_override() {
  const char* e = std::getenv("FP4MOE_LAUNCH_EXECUTABLE");
  return e != nullptr ? e : "";
}

// The program the children run: FP4MOE_LAUNCH_EXECUTABLE, else this executable.
std::string child_executable() {
  if (const std::string e = launch_executable_override(); !e.empty()) return e;
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  FP4MOE_CHECK(n > 0, "cannot find this executable through /proc/self/exe");
  return std::string(buf, static_cast<size_t>(n));
}

// A fresh folder for this launch's id file, under `parent` (else $TMPDIR, else /tmp).
fs::path make_launch_dir(const std::string& parent) {
  const char* tmp = std::getenv("TMPDIR");
  const fs::path base = !parent.empty() ? fs::path(parent) : fs::path(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp");
  std::string templ = (base / "fp4moe-launch-XXXXXX").string();
  if (mkdtemp(templ.data()) == nullptr)
    throw CliError(fmt::format("cannot create a launch folder under {}: {}", base.string(), std::strerror(errno)));
  return templ;
}

struct LaunchCommand {
  CLI::App* root = nullptr;
  CLI::App* sub = nullptr;
  int gpus = 1;
  int timeout_s = kDefaultCommTimeoutS;
  double grace_s = 10;
  std::string rendezvous;
  std::vector<std::string> command;

  void check_command() const {
    std::vector<std::string> extras = sub->remaining();  // with allow_extras, CLI11 keeps the "--" itself there
    extras.erase(std::remove(extras.begin(), extras.end(), "--"), extras.end());
    if (!extras.empty())
      throw CliError(fmt::format("unexpected argument{} '{}': the subcommand's options go after --, e.g. fp4moe "
                                 "launch --gpus 2 -- train --config FILE",
                                 extras.size() == 1 ? "" : "s", fmt::join(extras, " ")));
    if (command.empty())
      throw CliError("no subcommand to run: expected fp4moe launch [--gpus N] -- <subcommand> [its options], e.g. "
                     "-- train --config FILE");
    if (command.front() == "launch")
      throw CliError("launch cannot run under launch: name the subcommand every rank runs (e.g. -- train ...)");
    if (!launch_executable_override().empty()) return;  // another program: its own arguments
    std::vector<std::string> known;
    for (const CLI::App* a : root->get_subcommands([](CLI::App*) { return true; }))
      if (a->get_name() != "launch") known.push_back(a->get_name());
    if (std::find(known.begin(), known.end(), command.front()) == known.end())
      throw CliError(fmt::format("unknown subcommand '{}' after --: expected one of {}", command.front(),
                                 fmt::join(known, ", ")));
  }

  int run() {
    check_command();
    if (gpus < 1) throw CliError(fmt::format("--gpus {}: expected the number of GPUs of this node to use, >= 1", gpus));
    if (timeout_s < 1) throw CliError(fmt::format("--timeout-s {}: expected at least 1 second", timeout_s));
    if (!(grace_s >= 0 && grace_s <= 3600))
      throw CliError(fmt::format("--grace-s {}: expected a number of seconds in [0, 3600]", grace_s));
    std::optional<SchedulerRanks> scheduler;
    try {
      if (read_rank_env(process_env()).launched)
        throw CliError(fmt::format("{} is set: this process is a rank of a launch already; run the subcommand itself",
                                   kRankVar));
      scheduler = scheduler_ranks(process_env());
    } catch (const Error& e) {
      throw CliError(user_message(e.what()));
    }

    LaunchSpec spec;
    spec.executable = child_executable();
    spec.argv.push_back(spec.executable);
    spec.argv.insert(spec.argv.end(), command.begin(), command.end());
    spec.grace = std::chrono::milliseconds(static_cast<int64_t>(grace_s * 1000));
    std::vector<RankEnv> ranks;
    fs::path launch_dir;  // removed at the end (no scheduler)
    std::string id_file_to_remove;
    if (scheduler) {
      if (sub->count("--gpus") > 0)
        throw CliError(fmt::format("--gpus applies without a scheduler: under {} the ranks are its {} tasks",
                                   scheduler->scheduler, scheduler->world_size));
      RankEnv r{scheduler->rank, scheduler->world_size, scheduler->local_rank, {}, std::chrono::seconds(timeout_s),
                true};
      if (r.world_size > 1) {
        if (rendezvous.empty())
          throw CliError(fmt::format("under {} with {} ranks --rendezvous DIR is required: a folder every rank reads "
                                     "(a shared file system when the ranks span several nodes)",
                                     scheduler->scheduler, r.world_size));
        if (!fs::is_directory(rendezvous))
          throw CliError(fmt::format("--rendezvous {}: not a folder", rendezvous));
        const std::string suffix = scheduler->job_key.empty() ? "" : "." + scheduler->job_key;
        r.unique_id_file = (fs::path(rendezvous) / ("nccl-unique-id" + suffix)).string();
        if (r.rank == 0) id_file_to_remove = r.unique_id_file;
      }
      ranks.push_back(r);
    } else {
      if (!rendezvous.empty() && !fs::is_directory(rendezvous))
        throw CliError(fmt::format("--rendezvous {}: not a folder", rendezvous));
      launch_dir = make_launch_dir(rendezvous);
      for (int r = 0; r < gpus; ++r)
        ranks.push_back({r, gpus, r, (launch_dir / "nccl-unique-id").string(), std::chrono::seconds(timeout_s), true});
    }
    spec.world_size = ranks.front().world_size;
    spec.label_output = ranks.size() > 1;
    for (const RankEnv& r : ranks) {
      ChildSpec c{r.rank, rank_env_variables(r)};
      c.env.emplace_back("NCCL_NVLS_ENABLE", "0");
      spec.children.push_back(std::move(c));
    }

    // The id file and the launch folder go once every rank ended, whatever the outcome.
    auto cleanup = [&] {
      std::error_code ec;
      if (!id_file_to_remove.empty()) fs::remove(id_file_to_remove, ec);
      if (!launch_dir.empty()) fs::remove_all(launch_dir, ec);
    };
    LaunchOutcome out;
    try {
      out = run_children(spec);
    } catch (...) {
      cleanup();
      throw;
    }
    cleanup();
    if (out.exit_code != 0) std::fprintf(stderr, "fp4moe launch: %s\n", out.message.c_str());
    return out.exit_code;
  }
};

}  // namespace

Command add_launch_command(CLI::App& app) {
  CLI::App* sub = app.add_subcommand(
      "launch", "run a subcommand as N ranks, one process per GPU of this node (or the ranks of srun / mpirun)");
  auto cmd = std::make_shared<LaunchCommand>();
  cmd->root = &app;
  cmd->sub = sub;
  sub->add_option("--gpus", cmd->gpus, "number of ranks on this node, one per GPU (default 1; not under srun/mpirun)");
  sub->add_option("--timeout-s", cmd->timeout_s,
                  "bound in seconds on every wait for another rank: the NCCL id, the communicator, each exchange "
                  "(default 300)");
  sub->add_option("--grace-s", cmd->grace_s,
                  "seconds between SIGTERM and SIGKILL when a rank failed and the others are stopped (default 10)");
  sub->add_option("--rendezvous", cmd->rendezvous,
                  "folder of the NCCL id file: required under srun/mpirun with more than one rank (shared by all "
                  "nodes); on one node the parent of the launch's fresh folder (default $TMPDIR or /tmp)");
  sub->add_option("command", cmd->command, "after --: the subcommand every rank runs and its options");
  sub->allow_extras();  // options of the subcommand given before -- are refused by run() with a hint
  return {sub, [cmd] { return cmd->run(); }};
}

}  // namespace fp4moe::cli
