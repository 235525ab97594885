// CPU tests of the rank environment (trainer/comm/rank_env.h): the FP4MOE_* variables and the schedulers' ranks,
// the device of a rank, and the NCCL unique id's file handshake between ranks (threads; rank 0's id from NCCL's own
// ncclGetUniqueId, which needs no GPU, or a dummy id where the bytes must be known).
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "kernels/common/check.h"
#include "tests/common/temp_dir.h"
#include "tests/common/trainer_test_util.h"
#include "trainer/comm/rank_env.h"

namespace fp4moe::test {
namespace {

using Vars = std::map<std::string, std::string>;

// An EnvLookup over `vars` (kept by the caller).
EnvLookup lookup_in(const Vars& vars) {
  return [&vars](const char* name) -> const char* {
    const auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}


Vars launched(const std::string& rank, const std::string& world, const std::string& local) {
  return {{kRankVar, rank}, {kWorldSizeVar, world}, {kLocalRankVar, local}, {kNcclIdFileVar, "/tmp/x/nccl-unique-id"}};
}

ncclUniqueId dummy_id(char seed) {
  ncclUniqueId id;
  for (size_t i = 0; i < sizeof(id.internal); ++i) id.internal[i] = static_cast<char>(seed + 7 * i);
  return id;
}

TEST(RankEnv, NoVariableIsAWorldOfOne) {
  const Vars none;
  const RankEnv env = read_rank_env(lookup_in(none));
  EXPECT_FALSE(env.launched);
  EXPECT_EQ(env.rank, 0);
  EXPECT_EQ(env.world_size, 1);
  EXPECT_EQ(env.local_rank, 0);
  EXPECT_TRUE(env.unique_id_file.empty());
  EXPECT_EQ(env.timeout.count(), kDefaultCommTimeoutS);
}

TEST(RankEnv, ReadsWhatTheLauncherSets) {
  RankEnv want;
  want.rank = 3;
  want.world_size = 8;
  want.local_rank = 3;
  want.unique_id_file = "/tmp/fp4moe-launch-abc/nccl-unique-id";
  want.timeout = std::chrono::seconds(42);
  Vars vars;
  for (const auto& [name, value] : rank_env_variables(want)) vars[name] = value;
  EXPECT_EQ(vars.at(kRankVar), "3");
  const RankEnv got = read_rank_env(lookup_in(vars));
  EXPECT_TRUE(got.launched);
  EXPECT_EQ(got.rank, 3);
  EXPECT_EQ(got.world_size, 8);
  EXPECT_EQ(got.local_rank, 3);
  EXPECT_EQ(got.unique_id_file, want.unique_id_file);
  EXPECT_EQ(got.timeout.count(), 42);
}

TEST(RankEnv, WorldOfOneNeedsNoIdFile) {
  Vars vars = launched("0", "1", "0");
  vars.erase(kNcclIdFileVar);
  const RankEnv env = read_rank_env(lookup_in(vars));
  EXPECT_TRUE(env.launched);
  EXPECT_EQ(env.world_size, 1);
  EXPECT_TRUE(env.unique_id_file.empty());
}

TEST(RankEnv, MissingVariableIsNamed) {
  for (const char* missing : {kRankVar, kWorldSizeVar, kLocalRankVar}) {
    Vars vars = launched("1", "2", "1");
    vars.erase(missing);
    const std::string msg = test::error_message([&] { read_rank_env(lookup_in(vars)); });
    EXPECT_NE(msg.find(std::string(missing) + " is not set"), std::string::npos) << msg;
  }
  Vars vars = launched("1", "2", "1");
  vars.erase(kNcclIdFileVar);
  const std::string msg = test::error_message([&] { read_rank_env(lookup_in(vars)); });
  EXPECT_NE(msg.find(std::string(kNcclIdFileVar) + " is not set"), std::string::npos) << msg;
  // Any one variable marks a launched process: the others are then required.
  const Vars only_timeout = {{kCommTimeoutVar, "10"}};
  EXPECT_NE(test::error_message([&] { read_rank_env(lookup_in(only_timeout)); }).find(kWorldSizeVar), std::string::npos);
}

TEST(RankEnv, MalformedNumbersAreNamed) {
  for (const char* bad : {"", "-1", "+1", " 1", "1 ", "1x", "0x1", "1.0", "99999999999", "2147483648"}) {
    const Vars vars = launched(bad, "4", "0");
    const std::string msg = test::error_message([&] { read_rank_env(lookup_in(vars)); });
    EXPECT_NE(msg.find(std::string(kRankVar) + "='" + bad + "': expected a non-negative decimal integer"),
              std::string::npos)
        << bad << ": " << msg;
  }
  Vars vars = launched("0", "2", "0");
  vars[kCommTimeoutVar] = "ten";
  EXPECT_NE(test::error_message([&] { read_rank_env(lookup_in(vars)); }).find(kCommTimeoutVar), std::string::npos);
  vars[kCommTimeoutVar] = "0";
  EXPECT_NE(test::error_message([&] { read_rank_env(lookup_in(vars)); }).find("at least 1 second"), std::string::npos);
}

TEST(RankEnv, RanksOutsideTheWorldAreRejected) {
  struct Case {
    const char *rank, *world, *local, *named;
  };
  for (const Case& c : {Case{"2", "2", "0", kRankVar}, Case{"0", "2", "2", kLocalRankVar},
                        Case{"0", "0", "0", kWorldSizeVar}}) {
    const Vars vars = launched(c.rank, c.world, c.local);
    const std::string msg = test::error_message([&] { read_rank_env(lookup_in(vars)); });
    EXPECT_EQ(msg.rfind(std::string(c.named) + "=", 0), 0u) << msg;
  }
  RankEnv bad;
  bad.rank = 2;
  bad.world_size = 2;
  bad.unique_id_file = "f";
  EXPECT_FALSE(test::error_message([&] { rank_env_variables(bad); }).empty());
  bad.rank = 1;
  bad.unique_id_file.clear();
  EXPECT_FALSE(test::error_message([&] { rank_env_variables(bad); }).empty());
}

TEST(SchedulerRanks, NoneWithoutScheduler) {
  const Vars vars = {{"HOME", "/root"}};
  EXPECT_FALSE(scheduler_ranks(lookup_in(vars)).has_value());
}

TEST(SchedulerRanks, SlurmTaskOfSrun) {
  const Vars vars = {{"SLURM_JOB_ID", "981"}, {"SLURM_STEP_ID", "2"}, {"SLURM_PROCID", "13"},
                     {"SLURM_NTASKS", "16"}, {"SLURM_LOCALID", "5"}};
  const auto s = scheduler_ranks(lookup_in(vars));
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->scheduler, "Slurm");
  EXPECT_EQ(s->rank, 13);
  EXPECT_EQ(s->world_size, 16);
  EXPECT_EQ(s->local_rank, 5);
  EXPECT_EQ(s->job_key, "slurm-981.2");
}

// A batch script (or an salloc shell) has SLURM_PROCID 0 and SLURM_NTASKS of the allocation without being a rank.
TEST(SchedulerRanks, SlurmBatchScriptIsNotARank) {
  const Vars vars = {{"SLURM_JOB_ID", "981"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "16"}, {"SLURM_LOCALID", "0"}};
  EXPECT_FALSE(scheduler_ranks(lookup_in(vars)).has_value());
}

TEST(SchedulerRanks, OpenMpiBeforeSlurm) {
  const Vars vars = {{"SLURM_JOB_ID", "981"}, {"SLURM_STEP_ID", "0"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"},
                     {"SLURM_LOCALID", "0"}, {"OMPI_COMM_WORLD_RANK", "6"}, {"OMPI_COMM_WORLD_SIZE", "8"},
                     {"OMPI_COMM_WORLD_LOCAL_RANK", "2"}};
  const auto s = scheduler_ranks(lookup_in(vars));
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->scheduler, "Open MPI");
  EXPECT_EQ(s->rank, 6);
  EXPECT_EQ(s->world_size, 8);
  EXPECT_EQ(s->local_rank, 2);
  EXPECT_TRUE(s->job_key.empty());
}

TEST(SchedulerRanks, BadValuesAreNamed) {
  const Vars no_size = {{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}};
  EXPECT_NE(test::error_message([&] { scheduler_ranks(lookup_in(no_size)); }).find("OMPI_COMM_WORLD_SIZE is not set"),
            std::string::npos);
  const Vars outside = {{"SLURM_JOB_ID", "5"}, {"SLURM_STEP_ID", "0"}, {"SLURM_PROCID", "4"},
                        {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "0"}};
  EXPECT_EQ(test::error_message([&] { scheduler_ranks(lookup_in(outside)); }).rfind("SLURM_PROCID=4", 0), 0u);
  const Vars malformed = {{"SLURM_JOB_ID", "5"}, {"SLURM_STEP_ID", "0"}, {"SLURM_PROCID", "0"},
                          {"SLURM_NTASKS", "four"}, {"SLURM_LOCALID", "0"}};
  EXPECT_EQ(test::error_message([&] { scheduler_ranks(lookup_in(malformed)); }).rfind("SLURM_NTASKS='four'", 0), 0u);
}

TEST(RankDevice, LocalRankOrTheOneVisibleDevice) {
  RankEnv env;
  env.rank = 9;
  env.world_size = 16;
  env.local_rank = 1;
  EXPECT_EQ(rank_device(env, 8), 1);
  EXPECT_EQ(rank_device(env, 1), 0);  // one GPU bound to the task by the scheduler
  env.local_rank = 3;
  EXPECT_NE(test::error_message([&] { rank_device(env, 2); }).find("FP4MOE_LOCAL_RANK=3 but 2 CUDA devices"), std::string::npos);
  EXPECT_NE(test::error_message([&] { rank_device(env, 0); }).find("no CUDA device"), std::string::npos);
}

// Rank 0 writes the id late; the other ranks, started first, wait for it and all read rank 0's bytes.
TEST(UniqueIdFile, RanksReadWhatRankZeroWrites) {
  TempDir dir;
  constexpr int kWorld = 4;
  std::vector<ncclUniqueId> got(kWorld);
  std::vector<std::string> errors(kWorld);
  std::vector<std::thread> ranks;
  for (int r = kWorld - 1; r >= 0; --r)
    ranks.emplace_back([&, r] {
      RankEnv env;
      env.rank = r;
      env.world_size = kWorld;
      env.local_rank = r;
      env.unique_id_file = dir.file("nccl-unique-id");
      env.timeout = std::chrono::seconds(20);
      try {
        got[r] = share_unique_id(env, [] {
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
          return dummy_id(5);
        });
      } catch (const Error& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : ranks) t.join();
  const ncclUniqueId want = dummy_id(5);
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(errors[r], "") << "rank " << r;
    EXPECT_EQ(std::memcmp(got[r].internal, want.internal, sizeof(want.internal)), 0) << "rank " << r;
  }
  // Only the id file is left (the temporary file was linked, then removed).
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) names.push_back(e.path().filename());
  EXPECT_EQ(names, std::vector<std::string>{"nccl-unique-id"});
}

// NCCL's own unique id, made without a GPU, travels through the file intact.
TEST(UniqueIdFile, NcclUniqueIdNeedsNoDevice) {
  TempDir dir;
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  write_unique_id_file(dir.file("id"), id);
  const ncclUniqueId back = read_unique_id_file(dir.file("id"), std::chrono::seconds(1), 1);
  EXPECT_EQ(std::memcmp(back.internal, id.internal, sizeof(id.internal)), 0);
}

// An id file of an earlier run is neither overwritten nor taken for this one's.
TEST(UniqueIdFile, RankZeroRefusesAnExistingFile) {
  TempDir dir;
  const std::string stale(sizeof(ncclUniqueId::internal), 'S');
  const std::string path = dir.write("nccl-unique-id", stale);
  const std::string msg = test::error_message([&] { write_unique_id_file(path, dummy_id(1)); });
  EXPECT_NE(msg.find("exists already"), std::string::npos) << msg;
  std::ifstream in(path, std::ios::binary);
  const std::string kept((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(kept, stale);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), std::filesystem::directory_iterator()), 1);
}

TEST(UniqueIdFile, WaitIsBoundedAndNamesTheRank) {
  TempDir dir;
  const auto start = std::chrono::steady_clock::now();
  const std::string msg =
      test::error_message([&] { read_unique_id_file(dir.file("nccl-unique-id"), std::chrono::milliseconds(150), 3); });
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_NE(msg.find("rank 3: no NCCL unique id in " + dir.file("nccl-unique-id") + " after 150 ms"),
            std::string::npos)
      << msg;
  EXPECT_GE(waited, std::chrono::milliseconds(150));
  EXPECT_LT(waited, std::chrono::seconds(5));
}

TEST(UniqueIdFile, WrongSizeIsRejected) {
  TempDir dir;
  const size_t n = sizeof(ncclUniqueId::internal);
  for (const std::string& text : {std::string(), std::string(5, 'x'), std::string(n + 1, 'x')}) {
    const std::string path = dir.write("id", text);
    const std::string msg = test::error_message([&] { read_unique_id_file(path, std::chrono::seconds(1), 2); });
    EXPECT_NE(msg.find("does not hold an NCCL unique id"), std::string::npos) << text.size() << ": " << msg;
  }
  EXPECT_NE(test::error_message([&] { write_unique_id_file(dir.file("missing/id"), dummy_id(0)); }).find("cannot create"),
            std::string::npos);
}

TEST(UniqueIdFile, WorldOfOneWithoutFileMakesItsOwn) {
  RankEnv env;
  int made = 0;
  const ncclUniqueId id = share_unique_id(env, [&] {
    ++made;
    return dummy_id(9);
  });
  EXPECT_EQ(made, 1);
  EXPECT_EQ(id.internal[0], dummy_id(9).internal[0]);
  env.world_size = 2;
  EXPECT_NE(test::error_message([&] { share_unique_id(env, [] { return dummy_id(0); }); }).find(kNcclIdFileVar),
            std::string::npos);
}

}  // namespace
}  // namespace fp4moe::test
