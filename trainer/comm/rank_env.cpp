#include "trainer/comm/rank_env.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "kernels/common/check.h"

namespace fp4moe {
namespace {

// A decimal integer in [0, INT_MAX]: digits only (no sign, no spaces). Rejects anything else, naming the variable.
int parse_count(const char* name, const char* value) {
  const std::string v = value;
  FP4MOE_CHECK(!v.empty() && v.find_first_not_of("0123456789") == std::string::npos && v.size() <= 10 &&
                   std::stoll(v) <= INT_MAX,
               "{}='{}': expected a non-negative decimal integer", name, v);
  return static_cast<int>(std::stoll(v));
}

// The variable's value as a count; rejects a missing one, naming `why` it is required.
int required_count(const EnvLookup& lookup, const char* name, const char* why) {
  const char* v = lookup(name);
  FP4MOE_CHECK(v != nullptr, "{} is not set ({})", name, why);
  return parse_count(name, v);
}

// rank and local_rank in [0, world_size), world_size >= 1, with the variables' names in the message.
void check_ranks(int rank, int world_size, int local_rank, const char* rank_name, const char* size_name,
                 const char* local_name) {
  FP4MOE_CHECK(world_size >= 1, "{}={}: expected at least 1", size_name, world_size);
  FP4MOE_CHECK(rank < world_size, "{}={}: expected a rank below {}={}", rank_name, rank, size_name, world_size);
  FP4MOE_CHECK(local_rank < world_size, "{}={}: expected a local rank below {}={}", local_name, local_rank, size_name,
               world_size);
}

std::string errno_text() { return std::strerror(errno); }

}  // namespace

EnvLookup process_env() {
  return [](const char* name) -> const char* { return std::getenv(name); };
}

RankEnv read_rank_env(const EnvLookup& lookup) {
  RankEnv env;
  for (const char* name : {kRankVar, kWorldSizeVar, kLocalRankVar, kNcclIdFileVar, kCommTimeoutVar})
    env.launched = env.launched || lookup(name) != nullptr;
  if (!env.launched) return env;
  const char* why = "the FP4MOE_* rank variables are set together, as fp4moe launch sets them";
  env.world_size = required_count(lookup, kWorldSizeVar, why);
  env.rank = required_count(lookup, kRankVar, why);
  env.local_rank = required_count(lookup, kLocalRankVar, why);
  check_ranks(env.rank, env.world_size, env.local_rank, kRankVar, kWorldSizeVar, kLocalRankVar);
  if (const char* f = lookup(kNcclIdFileVar)) env.unique_id_file = f;
  FP4MOE_CHECK(env.world_size == 1 || !env.unique_id_file.empty(),
               "{} is not set (a world of {} ranks needs the file through which rank 0 passes the NCCL unique id)",
               kNcclIdFileVar, env.world_size);
  if (const char* t = lookup(kCommTimeoutVar)) {
    const int s = parse_count(kCommTimeoutVar, t);
    FP4MOE_CHECK(s >= 1, "{}={}: expected a timeout of at least 1 second", kCommTimeoutVar, s);
    env.timeout = std::chrono::seconds(s);
  }
  return env;
}

std::vector<std::pair<std::string, std::string>> rank_env_variables(const RankEnv& env) {
  check_ranks(env.rank, env.world_size, env.local_rank, kRankVar, kWorldSizeVar, kLocalRankVar);
  FP4MOE_CHECK(env.rank >= 0 && env.local_rank >= 0, "{}={}, {}={}: expected non-negative ranks", kRankVar, env.rank,
               kLocalRankVar, env.local_rank);
  FP4MOE_CHECK(env.world_size == 1 || !env.unique_id_file.empty(), "{}: a world of {} ranks needs an id file",
               kNcclIdFileVar, env.world_size);
  FP4MOE_CHECK(env.timeout.count() >= 1, "{}={}: expected a timeout of at least 1 second", kCommTimeoutVar,
               env.timeout.count());
  std::vector<std::pair<std::string, std::string>> vars = {
      {kRankVar, std::to_string(env.rank)},
      {kWorldSizeVar, std::to_string(env.world_size)},
      {kLocalRankVar, std::to_string(env.local_rank)},
      {kCommTimeoutVar, std::to_string(env.timeout.count())}};
  if (!env.unique_id_file.empty()) vars.emplace_back(kNcclIdFileVar, env.unique_id_file);
  return vars;
}

std::optional<SchedulerRanks> scheduler_ranks(const EnvLookup& lookup) {
  SchedulerRanks s;
  if (lookup("OMPI_COMM_WORLD_RANK") != nullptr) {
    const char* why = "Open MPI sets it for every process of mpirun";
    s.scheduler = "Open MPI";
    s.rank = required_count(lookup, "OMPI_COMM_WORLD_RANK", why);
    s.world_size = required_count(lookup, "OMPI_COMM_WORLD_SIZE", why);
    s.local_rank = required_count(lookup, "OMPI_COMM_WORLD_LOCAL_RANK", why);
    check_ranks(s.rank, s.world_size, s.local_rank, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                "OMPI_COMM_WORLD_LOCAL_RANK");
    return s;
  }
  const char* step = lookup("SLURM_STEP_ID");
  if (step == nullptr || lookup("SLURM_PROCID") == nullptr) return std::nullopt;
  const char* why = "Slurm sets it for every task of srun";
  s.scheduler = "Slurm";
  s.rank = required_count(lookup, "SLURM_PROCID", why);
  s.world_size = required_count(lookup, "SLURM_NTASKS", why);
  s.local_rank = required_count(lookup, "SLURM_LOCALID", why);
  check_ranks(s.rank, s.world_size, s.local_rank, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID");
  const char* job = lookup("SLURM_JOB_ID");
  FP4MOE_CHECK(job != nullptr && *job != '\0', "SLURM_JOB_ID is not set ({})", why);
  s.job_key = fmt::format("slurm-{}.{}", job, step);
  return s;
}

int rank_device(const RankEnv& env, int device_count) {
  FP4MOE_CHECK(device_count >= 1, "rank {}: no CUDA device visible", env.rank);
  if (device_count == 1) return 0;
  FP4MOE_CHECK(env.local_rank < device_count,
               "rank {}: {}={} but {} CUDA devices are visible (expected one device per local rank, or exactly one "
               "visible device per process)",
               env.rank, kLocalRankVar, env.local_rank, device_count);
  return env.local_rank;
}

ncclUniqueId share_unique_id(const RankEnv& env, const std::function<ncclUniqueId()>& make_id) {
  if (env.unique_id_file.empty()) {
    FP4MOE_CHECK(env.world_size == 1, "rank {}: a world of {} ranks needs {}", env.rank, env.world_size,
                 kNcclIdFileVar);
    return make_id();
  }
  if (env.rank != 0) return read_unique_id_file(env.unique_id_file, env.timeout, env.rank);
  const ncclUniqueId id = make_id();
  write_unique_id_file(env.unique_id_file, id);
  return id;
}

void write_unique_id_file(const std::string& path, const ncclUniqueId& id) {
  const std::string tmp = fmt::format("{}.tmp.{}", path, static_cast<long>(getpid()));
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  FP4MOE_CHECK(fd >= 0, "cannot create {} for the NCCL unique id: {}", tmp, errno_text());
  size_t done = 0;
  std::string error;
  while (done < sizeof(id.internal) && error.empty()) {
    const ssize_t n = write(fd, id.internal + done, sizeof(id.internal) - done);
    if (n > 0) done += static_cast<size_t>(n);
    else if (n < 0 && errno != EINTR) error = "write: " + errno_text();
  }
  if (error.empty() && fsync(fd) != 0) error = "fsync: " + errno_text();  // before the name appears (shared paths)
  if (close(fd) != 0 && error.empty()) error = "close: " + errno_text();
  if (error.empty() && link(tmp.c_str(), path.c_str()) != 0)
    error = errno == EEXIST ? std::string("it exists already (an id from an earlier run: each launch needs a fresh "
                                          "folder or file name)")
                            : "link: " + errno_text();
  unlink(tmp.c_str());
  FP4MOE_CHECK(error.empty(), "cannot write the NCCL unique id to {}: {}", path, error);
}

ncclUniqueId read_unique_id_file(const std::string& path, std::chrono::milliseconds timeout, int rank) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int fd = -1;
  while ((fd = open(path.c_str(), O_RDONLY | O_CLOEXEC)) < 0) {
    FP4MOE_CHECK(errno == ENOENT || errno == EINTR, "rank {}: cannot open {}: {}", rank, path, errno_text());
    FP4MOE_CHECK(std::chrono::steady_clock::now() < deadline,
                 "rank {}: no NCCL unique id in {} after {} ms (rank 0 writes it when it starts: did it fail?)", rank,
                 path, timeout.count());
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ncclUniqueId id;
  size_t done = 0;
  std::string error;
  char extra = 0;
  while (error.empty()) {
    const ssize_t n = done < sizeof(id.internal) ? read(fd, id.internal + done, sizeof(id.internal) - done)
                                                 : read(fd, &extra, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) error = "read: " + errno_text();
    else if (n == 0) break;
    else if (done == sizeof(id.internal)) error = fmt::format("more than {} bytes", sizeof(id.internal));
    else done += static_cast<size_t>(n);
  }
  close(fd);
  if (error.empty() && done != sizeof(id.internal))
    error = fmt::format("{} bytes, expected {}", done, sizeof(id.internal));
  FP4MOE_CHECK(error.empty(), "rank {}: {} does not hold an NCCL unique id: {}", rank, path, error);
  return id;
}

}  // namespace fp4moe
