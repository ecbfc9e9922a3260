#pragma once
/**
 * @file `all_reduce_gradients<B>(comm, params)`: the sum over a group of several parameters' gradients in one
 * collective, for gradients each rank holds only a share of (a sequence-parallel layer norm's gain and bias: each
 * tensor rank sees its own tokens).
 */
#include <cstddef>
#include <span>

#include "mpar/backend/backend.hpp"
#include "mpar/comm/communicator.hpp"
#include "mpar/core/memory_resource.hpp"
#include "mpar/nn/parameter.hpp"

namespace mpar::nn {

/**
 * @brief Replaces each gradient of `params` by its sum over `comm`: the gradients are packed into one buffer by
 * backend copies, all-reduced once (one collective whatever their number: they are small, and a collective's
 * latency is what they cost), and copied back. Nothing happens on a one-rank group.
 */
template <backend B, communicator C>
void all_reduce_gradients(C& comm, std::span<Parameter* const> params) {
  if (comm.size() == 1 || params.empty()) return;
  std::size_t n = 0;
  for (const Parameter* p : params) n += p->grad.size();
  Buffer<float> packed = uninitialized_buffer<float>(n);  // the copies write it whole
  std::size_t at = 0;
  for (const Parameter* p : params) {
    B::run(ops::copy<float>{.n = p->grad.size(), .src = p->grad.data(), .dst = packed.data() + at});
    at += p->grad.size();
  }
  comm.all_reduce(std::span<float>(packed), ReduceOp::sum);
  at = 0;
  for (Parameter* p : params) {
    B::run(ops::copy<float>{.n = p->grad.size(), .src = packed.data() + at, .dst = p->grad.data()});
    at += p->grad.size();
  }
}

}  // namespace mpar::nn
