#pragma once
/**
 * @file The argument check of the backends' strided 2-D copy (`copy_2d`, memory_backend.hpp), shared so that
 * every backend rejects the same calls with the same message, when the call is issued.
 *
 * Why at issue time: on a stream-ordered backend the copy runs later, where a failure would surface only at the
 * next wait, far from the call that caused it; on CUDA a pitch shorter than a row makes `cudaMemcpy2DAsync`
 * fail with an error code that names no sizes.
 */
#include <cstddef>

#include "mpar/core/error.hpp"

namespace mpar::detail {

/**
 * Throws `config_error` unless both leading dimensions hold a whole row (`src_ld >= cols`, `dst_ld >= cols`):
 * a shorter one would make consecutive rows overlap. Checked even when `rows` is 0, so a wrong call is caught
 * by the first test that makes it, not by the first one with data.
 */
inline void require_copy_2d_shape(const char* backend, std::size_t rows, std::size_t cols, std::size_t src_ld,
                                  std::size_t dst_ld) {
  require(src_ld >= cols && dst_ld >= cols, backend, "::copy_2d of ", rows, " x ", cols,
          " elements: the leading dimensions (src_ld = ", src_ld, ", dst_ld = ", dst_ld,
          ") must each be at least cols = ", cols,
          " (the elements from one row's start to the next row's); pass the row length of the matrix the block "
          "lies in");
}

}  // namespace mpar::detail
