// The machine a run happens on: GPUs, NVIDIA driver, CUDA runtime, cuBLASLt and NCCL versions, host name.
// One query shared by `fp4moe env`, the root attributes of result files and the benchmarks (L2 size).
// Works without a GPU or driver: the GPU list is then empty, no_gpu_reason says why, and the library versions
// (which need no device) are still filled.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fp4moe {

struct GpuInfo {
  int index = 0;
  std::string name;          // e.g. "NVIDIA H200"
  int cc_major = 0, cc_minor = 0;
  int sm_count = 0;
  int64_t memory_bytes = 0;  // total global memory
  int64_t l2_bytes = 0;      // L2 cache size
};

struct EnvInfo {
  std::vector<GpuInfo> gpus;  // empty when no CUDA device is usable
  std::string no_gpu_reason;  // why gpus is empty (CUDA's error name and text), else ""
  std::string driver;         // NVIDIA kernel module version and the CUDA version it supports, e.g.
                              // "570.86.15 (CUDA 12.8)"; "none" when no driver is loaded
  std::string cuda_runtime;   // the CUDA runtime library in use, e.g. "13.0"
  std::string cublaslt;       // e.g. "13.1.0"
  std::string nccl;           // e.g. "2.28.9"
  std::string host;           // host name
};

// Never throws for a missing device or driver (that is reported in the result).
EnvInfo query_env_info();

// "NVIDIA H200" (device 0), "NVIDIA H200 x8" for several identical devices, "none" without a device.
std::string gpu_summary(const EnvInfo& env);

// Empty when a CUDA device is usable, else "no CUDA device (<reason>)". For programs that need a GPU.
std::string why_no_cuda_device();

}  // namespace fp4moe
