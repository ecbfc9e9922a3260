#pragma once
/**
 * @file `write_host_factors`: the update factors of a step whose gradient scale the host chose, written
 * into rank memory through the stream-ordered copy (backend/rank_transfer.hpp).
 */
#include "mpar/backend/backend.hpp"
#include "mpar/backend/host/optimizer_kernels.hpp"
#include "mpar/backend/rank_transfer.hpp"

namespace mpar::optim {

/**
 * @brief The factors of an update whose gradient scale the host chose (an optimizer's `step(lr, grad_scale)`):
 * `{grad_scale, no skip}` written into `slot` (one element of rank memory) for the update to read; returns `slot`.
 */
template <backend B>
const UpdateFactors* write_host_factors(float grad_scale, UpdateFactors* slot) {
  const UpdateFactors f{grad_scale, 0.0f};
  copy_to_rank<B>(&f, slot, 1);
  return slot;
}

}  // namespace mpar::optim
