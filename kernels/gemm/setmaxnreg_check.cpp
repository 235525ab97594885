#include "kernels/gemm/setmaxnreg_check.h"

#include <cuda_runtime.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <mutex>
#include <unordered_map>

#include "kernels/common/check.h"

namespace fp4moe {

std::string setmaxnreg_pool_shortfall(const char* kernel, int num_regs, int threads,
                                      std::initializer_list<uint32_t> warpgroup_regs) {
  const auto counts = [&] { return fmt::format("{}", fmt::join(warpgroup_regs, ", ")); };
  if (threads <= 0 || threads % 128 != 0 || warpgroup_regs.size() != static_cast<size_t>(threads / 128))
    return fmt::format("{}: setmaxnreg counts [{}] given for {} threads, expected one per warpgroup of 128 threads",
                       kernel, counts(), threads);
  if (num_regs <= 0) return fmt::format("{}: the kernel reports {} registers per thread", kernel, num_regs);
  int64_t asked = 0;
  for (uint32_t r : warpgroup_regs) asked += int64_t{128} * r;
  const int64_t pool = int64_t{num_regs} * threads;
  if (asked <= pool) return "";
  return fmt::format(
      "{}: compiled to {} registers per thread, a block of {} threads holds {}, but its warpgroups' setmaxnreg counts "
      "[{}] ask for 128 x ({}) = {}: setmaxnreg.inc would wait forever (the kernel must be compiled to {} registers "
      "per thread or more, or the counts lowered)",
      kernel, num_regs, threads, pool, counts(), fmt::join(warpgroup_regs, " + "), asked,
      (asked + threads - 1) / threads);
}

void check_setmaxnreg_pool(const void* kernel, const char* name, int threads,
                           std::initializer_list<uint32_t> warpgroup_regs) {
  static std::mutex mutex;
  static std::unordered_map<const void*, int> num_regs_of;  // numRegs of each kernel checked so far
  int num_regs = 0;
  {
    const std::lock_guard<std::mutex> lock(mutex);
    const auto it = num_regs_of.find(kernel);
    if (it != num_regs_of.end()) num_regs = it->second;
  }
  if (num_regs == 0) {
    cudaFuncAttributes attr{};
    CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
    num_regs = attr.numRegs;
    const std::lock_guard<std::mutex> lock(mutex);
    num_regs_of.emplace(kernel, num_regs);
  }
  const std::string shortfall = setmaxnreg_pool_shortfall(name, num_regs, threads, warpgroup_regs);
  FP4MOE_CHECK(shortfall.empty(), "{}", shortfall);
}

}  // namespace fp4moe
