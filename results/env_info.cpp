#include "results/env_info.h"

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <nccl.h>
#include <unistd.h>

#include <cctype>
#include <fstream>
#include <sstream>

namespace fp4moe {

namespace {

// CUDA encodes versions as 1000 * major + 10 * minor.
std::string cuda_version_string(int v) { return fmt::format("{}.{}", v / 1000, (v % 1000) / 10); }

// The version of the loaded NVIDIA kernel module, from /proc/driver/nvidia/version ("" when absent).
std::string kernel_module_version() {
  std::ifstream f("/proc/driver/nvidia/version");
  std::string line;
  if (!f || !std::getline(f, line)) return {};
  // "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.15  <date>": the first token shaped like d+.d+[.d+]
  std::istringstream words(line.substr(line.find(':') == std::string::npos ? 0 : line.find(':') + 1));
  std::string w;
  while (words >> w) {
    bool digits_and_dots = !w.empty() && std::isdigit(static_cast<unsigned char>(w[0]));
    int dots = 0;
    for (char c : w) {
      if (c == '.') ++dots;
      else if (!std::isdigit(static_cast<unsigned char>(c))) digits_and_dots = false;
    }
    if (digits_and_dots && dots >= 1) return w;
  }
  return {};
}

std::string cuda_error_text(cudaError_t err) {
  return fmt::format("{}: {}", cudaGetErrorName(err), cudaGetErrorString(err));
}

}  // namespace

EnvInfo query_env_info() {
  EnvInfo env;

  int driver_cuda = 0;
  if (cudaDriverGetVersion(&driver_cuda) != cudaSuccess) driver_cuda = 0;
  std::string module = kernel_module_version();
  if (driver_cuda == 0 && module.empty()) env.driver = "none";
  else if (module.empty()) env.driver = fmt::format("unknown (CUDA {})", cuda_version_string(driver_cuda));
  else env.driver = fmt::format("{} (CUDA {})", module, cuda_version_string(driver_cuda));

  int runtime = 0;
  env.cuda_runtime = cudaRuntimeGetVersion(&runtime) == cudaSuccess ? cuda_version_string(runtime) : "unknown";

  // cuBLAS(Lt) encodes 10000 * major + 100 * minor + patch.
  size_t lt = cublasLtGetVersion();
  env.cublaslt = fmt::format("{}.{}.{}", lt / 10000, (lt % 10000) / 100, lt % 100);

  // NCCL >= 2.9 encodes 10000 * major + 100 * minor + patch, older releases 1000 * major + 100 * minor + patch.
  int nccl = 0;
  if (ncclGetVersion(&nccl) != ncclSuccess) env.nccl = "unknown";
  else if (nccl >= 10000) env.nccl = fmt::format("{}.{}.{}", nccl / 10000, (nccl % 10000) / 100, nccl % 100);
  else env.nccl = fmt::format("{}.{}.{}", nccl / 1000, (nccl % 1000) / 100, nccl % 100);

  char host[256] = {};
  env.host = gethostname(host, sizeof host - 1) == 0 ? host : "unknown";

  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error
    env.no_gpu_reason = cuda_error_text(err);
    if (driver_cuda == 0 && module.empty()) env.no_gpu_reason += "; no NVIDIA driver is loaded";
    return env;
  }
  if (count == 0) {
    env.no_gpu_reason = "the driver reports no CUDA device";
    return env;
  }
  for (int i = 0; i < count; ++i) {
    GpuInfo g;
    g.index = i;
    cudaDeviceProp p{};
    if ((err = cudaGetDeviceProperties(&p, i)) != cudaSuccess) {
      cudaGetLastError();
      g.name = fmt::format("unknown ({})", cuda_error_text(err));
      env.gpus.push_back(g);
      continue;
    }
    g.name = p.name;
    g.cc_major = p.major;
    g.cc_minor = p.minor;
    g.memory_bytes = static_cast<int64_t>(p.totalGlobalMem);
    int v = 0;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, i) == cudaSuccess) g.sm_count = v;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrL2CacheSize, i) == cudaSuccess) g.l2_bytes = v;
    env.gpus.push_back(g);
  }
  return env;
}

std::string gpu_summary(const EnvInfo& env) {
  if (env.gpus.empty()) return "none";
  bool same = true;
  for (const auto& g : env.gpus) same = same && g.name == env.gpus[0].name;
  if (env.gpus.size() == 1 || !same) return env.gpus[0].name;
  return fmt::format("{} x{}", env.gpus[0].name, env.gpus.size());
}

std::string why_no_cuda_device() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return fmt::format("no CUDA device ({})", cuda_error_text(err));
  }
  if (count == 0) return "no CUDA device (the driver reports none)";
  return {};
}

}  // namespace fp4moe
