#pragma once
/**
 * @file CUDA's function and variable qualifiers for g++ (MPAR_CUDA_EMULATION): every function is a host
 * function, and a `__shared__` variable is one per host thread.
 *
 * The emulation runs the blocks of a launch one after another on the launching thread (emulation/simt.hpp),
 * so a `static thread_local` variable is the block's own while the block runs: exactly one block's threads
 * see it at a time, as with a block's shared memory. Like shared memory it is not cleared between blocks.
 */

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __shared__ static thread_local

/** Lanes per warp, as the device's built-in `warpSize`. */
inline constexpr int warpSize = 32;
