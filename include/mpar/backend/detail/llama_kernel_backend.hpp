#pragma once
/**
 * @file The `llama_kernel_backend` concept: a backend that runs the row operations of the Llama-class layers
 * (RMSNorm, the rotary position embedding, the SwiGLU gate; operation objects in backend/ops/), an optional family
 * of `backend`. Each layer requires only its own operations (`supports<B, ops::...>`); this conjunction is for code
 * that builds a whole Llama block or model.
 */
#include "mpar/backend/ops/operation.hpp"
#include "mpar/backend/ops/rmsnorm.hpp"
#include "mpar/backend/ops/rope.hpp"
#include "mpar/backend/ops/silu_gate.hpp"

namespace mpar::detail {

/** @brief `B` runs every Llama-class operation: `ops::rmsnorm_*`, `ops::rope_*` and `ops::silu_gate_*`. */
template <class B>
concept llama_kernel_backend =
    supports<B, ops::rmsnorm_forward> && supports<B, ops::rmsnorm_backward> && supports<B, ops::rope_forward> &&
    supports<B, ops::rope_backward> && supports<B, ops::silu_gate_forward> && supports<B, ops::silu_gate_backward>;

}  // namespace mpar::detail
