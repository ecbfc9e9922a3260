#pragma once
/**
 * @file `same_group(c)`: another communicator over the same group as `c`.
 */
#include <concepts>

#include "mpar/comm/communicator.hpp"

namespace mpar {

/**
 * @brief Another communicator over the same group as `c`: a copy when `C` is copyable (a shared
 * handle, like ThreadsCommunicator or MpiCommunicator), otherwise `c.split(0, c.rank())` — collective
 * over the group, same ranks in the same order — for move-only communicators such as NCCL's.
 */
template <communicator C>
[[nodiscard]] C same_group(C& c) {
  if constexpr (std::copy_constructible<C>)
    return c;
  else
    return c.split(0, c.rank());
}

}  // namespace mpar
