#pragma once
/**
 * @file `backend_copy<B>(x)`: a copy of an activation made by backend `B` (one `B::copy` into uninitialised
 * storage), for the activations a layer keeps for its backward while it receives them by const reference.
 *
 * Why not `Activation(x)`: that copy is made by the host, reading and writing every byte of rank memory
 * (on a device backend, a migration there and back); `B::copy` stays on the rank's stream. A layer that
 * receives its input as an rvalue moves it instead, which costs nothing.
 */
#include "mpar/backend/backend.hpp"
#include "mpar/core/tensor.hpp"
#include "mpar/nn/activation.hpp"

namespace mpar::nn {

template <backend B, class T, std::size_t R>
[[nodiscard]] Tensor<T, R> backend_copy(const Tensor<T, R>& x) {
  Tensor<T, R> y(x.shape(), uninitialized);
  B::run(ops::copy<T>{.n = x.size(), .src = x.data(), .dst = y.data()});
  return y;
}

/** The same for a typed activation: the copy keeps the layout. */
template <backend B, class L>
[[nodiscard]] Act<L> backend_copy(const Act<L>& x) {
  return Act<L>(backend_copy<B>(x.tensor()));
}

}  // namespace mpar::nn
