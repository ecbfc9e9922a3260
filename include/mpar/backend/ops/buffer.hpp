#pragma once
/**
 * @file The buffer operations on rank memory (`ops::zero`, `fill`, `copy`, `copy_2d`, `copy_2d_batched`, `convert`,
 * `init_values`), class templates over their element types, named at the call, with their host
 * reference (backend/host/buffer_ops.hpp). See backend/ops/operation.hpp.
 *
 * With them no host loop touches rank memory: a layer zeroes, fills, copies, converts and initialises its buffers
 * where they live.
 */
#include <cstddef>
#include <type_traits>

#include "mpar/backend/copy_2d_shape.hpp"
#include "mpar/backend/host/buffer_ops.hpp"
#include "mpar/backend/types.hpp"  // BatchStrides, BatchExtents
#include "mpar/core/init.hpp"      // InitBlock

namespace mpar::ops {

/** `x[i] = 0` for `i < n` (all-zero bytes). */
template <class T>
struct zero {
  static constexpr const char* name = "zero";
  std::size_t n = 0;
  T* x = nullptr;
  template <class F>
  void each_operand(F&& f) {
    f(x);
  }
};

/** `x[i] = value` for `i < n` (`value` converted to `x`'s type at the call). */
template <class T>
struct fill {
  static constexpr const char* name = "fill";
  std::size_t n = 0;
  std::type_identity_t<T> value{};
  T* x = nullptr;
  template <class F>
  void each_operand(F&& f) {
    f(x);
  }
};

/** `dst[i] = src[i]` for `i < n`; the ranges must not overlap. */
template <class T>
struct copy {
  static constexpr const char* name = "copy";
  std::size_t n = 0;
  const T* src = nullptr;
  T* dst = nullptr;
  template <class F>
  void each_operand(F&& f) {
    f(src), f(dst);
  }
};

/**
 * `dst[r * dst_ld + c] = src[r * src_ld + c]` for `r < rows`, `c < cols`: a block of one row-major matrix into
 * another; the blocks must not overlap. Leading dimensions of at least `cols`, checked when the operation is issued
 * (`check`), so a wrong call throws at the call on every backend.
 */
template <class T>
struct copy_2d {
  static constexpr const char* name = "copy_2d";
  std::size_t rows = 0, cols = 0;
  const T* src = nullptr;
  std::size_t src_ld = 0;
  T* dst = nullptr;
  std::size_t dst_ld = 0;
  void check(const char* backend) const { mpar::detail::require_copy_2d_shape(backend, rows, cols, src_ld, dst_ld); }
  template <class F>
  void each_operand(F&& f) {
    f(src), f(dst);
  }
};

/**
 * A two-level batch of `copy_2d` blocks: for `i < batch.outer`, `j < batch.inner`, the block at `src + i *
 * src_stride.outer + j * src_stride.inner` into the one at `dst + i * dst_stride.outer + j * dst_stride.inner`
 * (e.g. the heads of a `[tokens, heads head_dim]` matrix into dense `[batch, heads, seq, head_dim]` blocks).
 */
template <class T>
struct copy_2d_batched {
  static constexpr const char* name = "copy_2d_batched";
  std::size_t rows = 0, cols = 0;
  const T* src = nullptr;
  std::size_t src_ld = 0;
  BatchStrides src_stride{};
  T* dst = nullptr;
  std::size_t dst_ld = 0;
  BatchStrides dst_stride{};
  BatchExtents batch{};
  void check(const char* backend) const { mpar::detail::require_copy_2d_shape(backend, rows, cols, src_ld, dst_ld); }
  template <class F>
  void each_operand(F&& f) {
    f(src), f(dst);
  }
};

/** `dst[i] = To(src[i])`: fp32 to bf16/f16 rounds to nearest even, 16-bit to fp32 is exact. */
template <class From, class To>
struct convert {
  static constexpr const char* name = "convert";
  std::size_t n = 0;
  const From* src = nullptr;
  To* dst = nullptr;
  template <class F>
  void each_operand(F&& f) {
    f(src), f(dst);
  }
};

/**
 * A parameter block's counter-based initial values (core/init.hpp) into `x`, bit for bit those of `init_value` on
 * the host: a parameter is initialised where it lives, with no upload.
 */
template <class T>
struct init_values {
  static constexpr const char* name = "init_values";
  InitBlock block{};
  T* x = nullptr;
  template <class F>
  void each_operand(F&& f) {
    f(x);
  }
};

/** Calls `op.check(backend)` where the operation has argument checks to run when it is issued. */
template <class Op>
void check_when_issued(const Op& op, const char* backend) {
  if constexpr (requires { op.check(backend); }) op.check(backend);
}

template <class T>
void host_reference(const zero<T>& op) {
  host::zero(op.n, op.x);
}
template <class T>
void host_reference(const fill<T>& op) {
  host::fill(op.n, op.value, op.x);
}
template <class T>
void host_reference(const copy<T>& op) {
  host::copy(op.n, op.src, op.dst);
}
template <class T>
void host_reference(const copy_2d<T>& op) {
  host::copy_2d(op.rows, op.cols, op.src, op.src_ld, op.dst, op.dst_ld);
}
template <class T>
void host_reference(const copy_2d_batched<T>& op) {
  host::copy_2d_batched(op.rows, op.cols, op.src, op.src_ld, op.src_stride, op.dst, op.dst_ld, op.dst_stride, op.batch);
}
template <class From, class To>
void host_reference(const convert<From, To>& op) {
  host::convert(op.n, op.src, op.dst);
}
template <class T>
  requires std::is_same_v<T, float> || std::is_same_v<T, double>
void host_reference(const init_values<T>& op) { host::init_values(op.block, op.x); }

}  // namespace mpar::ops
