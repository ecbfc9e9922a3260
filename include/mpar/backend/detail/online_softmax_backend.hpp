#pragma once
/**
 * @file The `online_softmax_backend` concept: a backend that runs the per-block steps of an attention computed one
 * key block at a time (flash-style online softmax; operation objects in backend/ops/online_softmax.hpp), so ring
 * attention (nn/ring_attention.hpp) runs on it with no host step between its GEMMs.
 */
#include "mpar/backend/ops/online_softmax.hpp"
#include "mpar/backend/ops/operation.hpp"

namespace mpar::detail {

/** @brief `B` runs the four online-softmax operations: `ops::online_softmax_update`, `_finish`, `_delta`, `_backward`. */
template <class B>
concept online_softmax_backend = supports<B, ops::online_softmax_update> && supports<B, ops::online_softmax_finish> &&
    supports<B, ops::online_softmax_delta> && supports<B, ops::online_softmax_backward>;

}  // namespace mpar::detail
