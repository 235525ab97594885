// `fp4moe env`: the GPUs, NVIDIA driver, CUDA runtime, cuBLASLt and NCCL versions of this machine.
// Without a GPU it says "no CUDA device" with the reason, still prints the library versions and exits 0.
#include <fmt/format.h>

#include "cli/commands.h"
#include "results/env_info.h"

namespace fp4moe::cli {

static int run_env() {
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
  fmt::print("host:         {}\n", env.host);
  return kExitOk;
}

Command add_env_command(CLI::App& app) {
  CLI::App* sub = app.add_subcommand("env", "print the GPU, driver, CUDA runtime, cuBLASLt and NCCL versions");
  return {sub, run_env};
}

}  // namespace fp4moe::cli
