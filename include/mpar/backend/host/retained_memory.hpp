#pragma once
/**
 * @file Keeps the memory a rank frees mapped in the process, so the next step's activations of the same
 * sizes reuse pages that are already there.
 *
 * Why: a training step allocates and frees the same activation sizes every step. glibc's malloc serves
 * large blocks with mmap (and raises that threshold only as far as the largest block freed so far) and
 * gives memory at the top of its heaps back to the kernel once more than a trim threshold is free: the
 * pages of a freed activation then go back to the kernel, and the next step's allocation faults them in
 * again, each one zeroed by the kernel. Measured on GPT training (hidden 256, 4 layers, 1,024 tokens per
 * step), about 8,000 page faults per step and a fifth of the step's CPU time in the kernel's page clearing.
 * With both thresholds fixed high, a step after the first faults no pages at all. The price is that freed
 * memory stays with the process (its resident size stays at its peak), as with a caching allocator.
 *
 * Process-wide and glibc-only (other C libraries: nothing to do); done once, by `HostBackend::init_rank`.
 */
#include <cstddef>
#include <mutex>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace mpar::host {

/** @brief Blocks up to this size come from malloc's heaps instead of their own mmap: glibc's largest allowed. */
inline constexpr std::size_t retained_block_limit = std::size_t(32) << 20;

/**
 * @brief Asks malloc (once per process) to serve blocks up to `retained_block_limit` from its heaps and
 * never to trim freed memory below 1 GiB back to the kernel. Returns whether the C library took both settings.
 */
inline bool retain_freed_memory() {
  static const bool done = [] {
#if defined(__GLIBC__)
    return mallopt(M_MMAP_THRESHOLD, int(retained_block_limit)) == 1 && mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1;
#else
    return false;
#endif
  }();
  return done;
}

}  // namespace mpar::host
