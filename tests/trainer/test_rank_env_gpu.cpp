// GPU test of NCCL built from the rank environment (trainer/comm/nccl_transport.h, rank_env.h). Run by itself it
// is a world of one with an id file of its own; run under the launcher it is one rank of the launch (one line):
//   FP4MOE_LAUNCH_EXECUTABLE=build/tests/fp4moe_tests_gpu_trainer
//   build/fp4moe launch --gpus N -- --gtest_filter='RankEnvGpu.*'
// Every rank sends to every rank (itself included) a byte pattern of the pair, of a length that differs per receiver,
// and checks what it received from each and the counted bytes.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <vector>

#include "tests/common/gpu_test_util.h"
#include "tests/common/temp_dir.h"
#include "trainer/comm/nccl_transport.h"
#include "trainer/comm/rank_env.h"

namespace fp4moe::test {
namespace {

// The bytes rank `from` sends to rank `to`: 1000 + 16 `to` of them, a pattern of the pair.
std::vector<uint8_t> pair_bytes(int from, int to) {
  std::vector<uint8_t> b(static_cast<size_t>(1000 + 16 * to));
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>(i * 37 + 11 + 61 * from + 101 * to);
  return b;
}

TEST(RankEnvGpu, NcclTransportFromTheRankEnvironment) {
  FP4MOE_REQUIRE_DEVICE();
  TempDir dir;
  setenv("NCCL_NVLS_ENABLE", "0", 0);  // the launcher's setting, unless the caller set it
  RankEnv env = read_rank_env(process_env());
  if (!env.launched) {  // by itself: rank 0 of 1, through an id file all the same
    env.unique_id_file = dir.file("nccl-unique-id");
    env.timeout = std::chrono::seconds(60);
  }
  NcclTransport transport(env);  // makes the rank's device current
  const int rank = env.rank, world = env.world_size;
  EXPECT_EQ(transport.rank(), rank);
  EXPECT_EQ(transport.world_size(), world);
  if (rank == 0) {
    EXPECT_EQ(std::filesystem::file_size(env.unique_id_file), sizeof(ncclUniqueId::internal));
  }

  std::vector<std::unique_ptr<DeviceBuffer<uint8_t>>> send, recv;
  std::vector<EpPeerBuffers> peers;
  for (int p = 0; p < world; ++p) {
    const std::vector<uint8_t> out = pair_bytes(rank, p);
    const size_t in = pair_bytes(p, rank).size();
    send.push_back(std::make_unique<DeviceBuffer<uint8_t>>(out.size()));
    recv.push_back(std::make_unique<DeviceBuffer<uint8_t>>(in));
    send.back()->upload(out);
    recv.back()->poison();
    peers.push_back({send.back()->ptr, static_cast<int64_t>(out.size()), recv.back()->ptr, static_cast<int64_t>(in)});
  }
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreate(&stream));
  const EpExchangeBytes bytes = transport.exchange(peers, stream);
  transport.wait(stream);
  CUDA_CHECK(cudaStreamDestroy(stream));
  int64_t sent = 0, received = 0;
  for (int p = 0; p < world; ++p) {
    EXPECT_EQ(recv[p]->download(), pair_bytes(p, rank)) << "rank " << rank << " from rank " << p;
    if (p != rank) {
      sent += static_cast<int64_t>(pair_bytes(rank, p).size());
      received += static_cast<int64_t>(pair_bytes(p, rank).size());
    }
  }
  EXPECT_EQ(bytes.to_self, static_cast<int64_t>(pair_bytes(rank, rank).size()));
  EXPECT_EQ(bytes.sent, sent);
  EXPECT_EQ(bytes.received, received);

  // A second communicator under the same file is refused: the id of this run is there already (world of one only:
  // with more ranks the others would wait for a rank 0 that never joins).
  if (world == 1) {
    EXPECT_THROW(NcclComm{env}, Error);
  }
}

}  // namespace
}  // namespace fp4moe::test
