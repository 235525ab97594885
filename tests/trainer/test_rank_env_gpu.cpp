// GPU test of NCCL built from the rank environment (trainer/comm/nccl_transport.h, rank_env.h) at world size 1, as
// `fp4moe launch --gpus 1` gives it: rank 0 makes the unique id, leaves it in the id file, and its exchange with
// itself moves the bytes unchanged.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <vector>

#include "tests/common/gpu_test_util.h"
#include "tests/common/temp_dir.h"
#include "trainer/comm/nccl_transport.h"
#include "trainer/comm/rank_env.h"

namespace fp4moe::test {
namespace {

TEST(RankEnvGpu, NcclTransportFromTheRankEnvironment) {
  FP4MOE_REQUIRE_DEVICE();
  TempDir dir;
  setenv("NCCL_NVLS_ENABLE", "0", 0);  // the launcher's setting, unless the caller set it
  RankEnv env;
  env.launched = true;
  env.unique_id_file = dir.file("nccl-unique-id");
  env.timeout = std::chrono::seconds(60);
  NcclTransport transport(env);
  EXPECT_EQ(transport.rank(), 0);
  EXPECT_EQ(transport.world_size(), 1);
  EXPECT_EQ(std::filesystem::file_size(env.unique_id_file), sizeof(ncclUniqueId::internal));

  constexpr size_t kBytes = 1000;
  std::vector<uint8_t> sent(kBytes);
  for (size_t i = 0; i < kBytes; ++i) sent[i] = static_cast<uint8_t>(i * 37 + 11);
  DeviceBuffer<uint8_t> src(kBytes), dst(kBytes);
  src.upload(sent);
  dst.poison();
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreate(&stream));
  const EpExchangeBytes bytes =
      transport.exchange({EpPeerBuffers{src.ptr, static_cast<int64_t>(kBytes), dst.ptr, static_cast<int64_t>(kBytes)}},
                         stream);
  transport.wait(stream);
  CUDA_CHECK(cudaStreamDestroy(stream));
  EXPECT_EQ(dst.download(), sent);
  EXPECT_EQ(bytes.to_self, static_cast<int64_t>(kBytes));
  EXPECT_EQ(bytes.sent, 0);
  EXPECT_EQ(bytes.received, 0);

  // A second communicator under the same file is refused: the id of this launch is already there.
  EXPECT_THROW(NcclComm{env}, Error);
}

}  // namespace
}  // namespace fp4moe::test
