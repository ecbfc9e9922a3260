#pragma once
/** @file The host (CPU) backend policy type. */
#include <cstddef>

#include "mpar/backend/host/gemm.hpp"
#include "mpar/backend/host/kernels.hpp"

#if defined(MPAR_HAVE_OPENBLAS)
extern "C" void openblas_set_num_threads(int);
#endif

namespace mpar {

/** @brief Memory-space tag: ordinary host memory. */
struct HostMemory {
  static constexpr const char* name = "host";
};

/**
 * @brief The CPU backend: host memory, CBLAS GEMM (single-threaded per rank) and the host kernels.
 *
 * Layers and executors are templates over a backend type; this one carries no state, so a call
 * through it is an ordinary inlined function call.
 */
struct HostBackend {
  using memory_space = HostMemory;
  template <class T, std::size_t R>
  using tensor_type = Tensor<T, R>;
  static constexpr const char* name = "host";

  /** Called once per rank before compute: keeps BLAS single-threaded so ranks do not oversubscribe cores. */
  static void init_rank() {
#if defined(MPAR_HAVE_OPENBLAS)
    openblas_set_num_threads(1);
#endif
  }

  template <class T>
  static void gemm(Trans ta, Trans tb, std::size_t m, std::size_t n, std::size_t k, T alpha, const T* a,
                   std::size_t lda, const T* b, std::size_t ldb, T beta, T* c, std::size_t ldc) {
    mpar::gemm<T>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
};

/**
 * @brief A compute backend: `memory_space`, a `tensor_type<T, R>` template, `init_rank()` and a
 * row-major `gemm<T>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)`.
 */
template <class B>
concept backend = requires(const float* a, float* c) {
  typename B::memory_space;
  typename B::template tensor_type<float, 2>;
  B::init_rank();
  B::template gemm<float>(Trans::no, Trans::no, std::size_t{}, std::size_t{}, std::size_t{}, 1.0f, a, std::size_t{}, a,
                          std::size_t{}, 0.0f, c, std::size_t{});
};

static_assert(backend<HostBackend>);

}  // namespace mpar
