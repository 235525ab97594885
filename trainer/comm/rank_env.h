// The rank environment of a multi-process run (issue 17 item 3): which rank of how many this process is, which GPU
// of its node it uses, and the file through which rank 0 hands the NCCL unique id to the others. `fp4moe launch`
// (cli/cmd_launch.cpp) sets the variables below for every process it starts; under Slurm (srun) or Open MPI
// (mpirun) it reads the scheduler's ranks (scheduler_ranks) and starts one process with the same variables.
//
//   FP4MOE_RANK            this process's rank, in [0, FP4MOE_WORLD_SIZE)
//   FP4MOE_WORLD_SIZE      the number of ranks, >= 1
//   FP4MOE_LOCAL_RANK      the rank among those on this node, in [0, FP4MOE_WORLD_SIZE): the CUDA device it uses
//                          (rank_device)
//   FP4MOE_NCCL_ID_FILE    where rank 0 writes ncclGetUniqueId's 128 bytes and the others read them (share_unique_id);
//                          required when FP4MOE_WORLD_SIZE > 1
//   FP4MOE_COMM_TIMEOUT_S  the bound, in seconds, on every wait for another rank (the id file, the communicator's
//                          initialisation, each exchange); optional, default 300
//
// None of them set: a world of one (rank 0 of 1, no id file). Some set: the first three are required.
#pragma once

#include <nccl.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace fp4moe {

inline constexpr const char* kRankVar = "FP4MOE_RANK";
inline constexpr const char* kWorldSizeVar = "FP4MOE_WORLD_SIZE";
inline constexpr const char* kLocalRankVar = "FP4MOE_LOCAL_RANK";
inline constexpr const char* kNcclIdFileVar = "FP4MOE_NCCL_ID_FILE";
inline constexpr const char* kCommTimeoutVar = "FP4MOE_COMM_TIMEOUT_S";
inline constexpr int kDefaultCommTimeoutS = 300;

struct RankEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string unique_id_file;  // empty: rank 0 makes the id itself (world size 1 only)
  std::chrono::seconds timeout{kDefaultCommTimeoutS};
  bool launched = false;  // the FP4MOE_* variables were set (false: the default world of one)
};

// Looks up one environment variable: its value, or null when it is not set. process_env() reads this process's.
using EnvLookup = std::function<const char*(const char*)>;
EnvLookup process_env();

// The rank environment from the FP4MOE_* variables. Rejects (fp4moe::Error, one line naming the variable and what
// was expected): a value that is not a decimal integer (sign, spaces, overflow included), FP4MOE_WORLD_SIZE < 1,
// FP4MOE_RANK or FP4MOE_LOCAL_RANK outside [0, world size), a missing FP4MOE_RANK, FP4MOE_WORLD_SIZE or
// FP4MOE_LOCAL_RANK when any FP4MOE_* variable is set, a missing or empty FP4MOE_NCCL_ID_FILE when the world size
// is > 1, FP4MOE_COMM_TIMEOUT_S < 1.
RankEnv read_rank_env(const EnvLookup& lookup);

// The FP4MOE_* variables (name, value) that make read_rank_env return `env` (launched set); the id file is left out
// when empty. Rejects (fp4moe::Error) what read_rank_env rejects.
std::vector<std::pair<std::string, std::string>> rank_env_variables(const RankEnv& env);

// The ranks a scheduler gave this process. Open MPI: OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE,
// OMPI_COMM_WORLD_LOCAL_RANK (checked first: mpirun inside a Slurm allocation sets both). Slurm: SLURM_PROCID,
// SLURM_NTASKS, SLURM_LOCALID, taken only in a task of srun (SLURM_STEP_ID set): a batch script or an salloc shell
// has SLURM_PROCID 0 without being a rank. job_key names the run where the scheduler has a name for it (Slurm:
// "slurm-<SLURM_JOB_ID>.<SLURM_STEP_ID>"; Open MPI: empty). nullopt: no scheduler. Rejects (fp4moe::Error, naming
// the variable) missing or malformed values and ranks outside [0, size).
struct SchedulerRanks {
  std::string scheduler;  // "Slurm" or "Open MPI"
  int rank = 0, world_size = 1, local_rank = 0;
  std::string job_key;
};
std::optional<SchedulerRanks> scheduler_ranks(const EnvLookup& lookup);

// The CUDA device (an index among the visible ones) that rank `env` uses: its local rank; or device 0 when exactly
// one device is visible (a scheduler that binds one GPU per task through CUDA_VISIBLE_DEVICES). Rejects
// (fp4moe::Error) device_count < 1 and a local rank >= device_count > 1.
int rank_device(const RankEnv& env, int device_count);

// The unique id through env.unique_id_file: rank 0 calls make_id and writes the bytes (write_unique_id_file), every
// other rank waits for them (read_unique_id_file, bounded by env.timeout). Without a file (world size 1) it returns
// make_id(). Rejects what the two functions reject.
ncclUniqueId share_unique_id(const RankEnv& env, const std::function<ncclUniqueId()>& make_id);

// Writes the id's NCCL_UNIQUE_ID_BYTES bytes to `path` atomically: to a temporary file beside it, flushed, then
// linked to `path` (link(2) refuses an existing name, so a file from an earlier run is never overwritten nor taken
// for this one's). Rejects (fp4moe::Error) an existing `path`, a missing folder, any I/O error; no temporary file
// is left behind.
void write_unique_id_file(const std::string& path, const ncclUniqueId& id);

// Waits up to `timeout` for `path` to appear, then reads the id from it. Rejects (fp4moe::Error, naming `rank` and
// the path) a timeout (rank 0 did not write it: it failed or did not start), a file of another size than
// NCCL_UNIQUE_ID_BYTES, a read error.
ncclUniqueId read_unique_id_file(const std::string& path, std::chrono::milliseconds timeout, int rank);

}  // namespace fp4moe
