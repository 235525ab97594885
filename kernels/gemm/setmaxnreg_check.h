// Launch-time check of a warp-specialised kernel's register reallocation (setmaxnreg, PTX ISA "setmaxnreg").
//
// A thread block of `threads` threads holds threads x numRegs registers, numRegs being the count per thread the
// kernel was compiled to (cudaFuncAttributes::numRegs, ptxas -v "Used N registers"). setmaxnreg.dec gives a
// warpgroup's registers back to that pool and setmaxnreg.inc waits until the pool holds what the warpgroup asks for:
// if the counts the warpgroups set sum to more than the pool, the increasing warpgroups wait forever (a hang, no
// error). sm90::setmaxnreg_fits (sm90_ptx.cuh) checks the counts at compile time against the count a block of that
// size is given at one block per SM (168 for 384 threads); this checks them at launch against the count the compiler
// actually chose, so that a kernel compiled to fewer registers is refused instead of hanging.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

namespace fp4moe {

// The arithmetic of the check, without a device: "" when the pool of a block of `threads` threads at `num_regs`
// registers each holds the counts after reallocation, num_regs * threads >= sum over warpgroups of 128 *
// warpgroup_regs[w]; otherwise a message naming `kernel`, num_regs, threads and the counts. warpgroup_regs holds
// one count per warpgroup of 128 threads, in warpgroup order (threads / 128 of them; a warpgroup that does not
// execute setmaxnreg is given num_regs). Also returns a message for threads not a positive multiple of 128, a count
// list of another length, or num_regs <= 0.
std::string setmaxnreg_pool_shortfall(const char* kernel, int num_regs, int threads,
                                      std::initializer_list<uint32_t> warpgroup_regs);

// Before a launch of `kernel` (a __global__ function's address) with `threads` threads per block: throws
// fp4moe::Error with setmaxnreg_pool_shortfall's message when the kernel's pool cannot hold `warpgroup_regs`. The
// kernel's numRegs is read once (cudaFuncGetAttributes, at its first check) and kept for the process (thread-safe);
// later checks are arithmetic only. The numRegs of a __global__ function is the same on every device of the build's
// architecture (sm_90a code only).
void check_setmaxnreg_pool(const void* kernel, const char* name, int threads,
                           std::initializer_list<uint32_t> warpgroup_regs);

}  // namespace fp4moe
