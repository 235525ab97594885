// `fp4moe env`: the GPUs, NVIDIA driver, CUDA runtime, cuBLASLt and NCCL versions of this machine, the cuDNN this
// build's attention backend was built against and loads (kernels/attention/cudnn_sdpa.h), and this
// process's rank environment (trainer/comm/rank_env.h: set by `fp4moe launch`, so that `fp4moe launch --gpus N --
// env` shows what every rank was given). Without a GPU it says "no CUDA device" with the reason, still prints the
// rest and exits 0; a malformed rank environment is an error (one line, exit 2, nothing printed).
#include <fmt/format.h>

#include "cli/commands.h"
#include "kernels/attention/cudnn_sdpa.h"
#include "kernels/common/check.h"
#include "results/env_info.h"
#include "trainer/comm/rank_env.h"

namespace fp4moe::cli {

static int run_env() {
  RankEnv rank;
  try {
    rank = read_rank_env(process_env());
  } catch (const Error& e) {
    throw CliError(user_message(e.what()));
  }
  EnvInfo env = query_env_info();
  if (env.gpus.empty()) fmt::print("GPU:          no CUDA device ({})\n", env.no_gpu_reason);
  for (const auto& g : env.gpus)
    fmt::print("GPU {}:        {} (sm_{}{}), {} SMs, {:.1f} GiB, L2 {:.1f} MiB\n", g.index, g.name, g.cc_major,
               g.cc_minor, g.sm_count, static_cast<double>(g.memory_bytes) / (1 << 30),
               static_cast<double>(g.l2_bytes) / (1 << 20));
  fmt::print("driver:       {}\n", env.driver);
  fmt::print("CUDA runtime: {}\n", env.cuda_runtime);
  fmt::print("cuBLASLt:     {}\n", env.cublaslt);
  fmt::print("NCCL:         {}\n", env.nccl);
  fmt::print("cuDNN:        {}\n", cudnn_sdpa_version_text());
  fmt::print("host:         {}\n", env.host);
  if (!rank.launched)
    fmt::print("rank:         0 of 1 (no rank environment: not started by fp4moe launch)\n");
  else
    fmt::print("rank:         {} of {}, local rank {}, NCCL id file {}, timeout {} s\n", rank.rank, rank.world_size,
               rank.local_rank, rank.unique_id_file.empty() ? "(none)" : rank.unique_id_file, rank.timeout.count());
  return kExitOk;
}

Command add_env_command(CLI::App& app) {
  CLI::App* sub = app.add_subcommand(
      "env", "print the GPU, driver, CUDA runtime, cuBLASLt, NCCL and cuDNN versions, and the rank environment");
  return {sub, run_env};
}

}  // namespace fp4moe::cli
