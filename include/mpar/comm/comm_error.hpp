#pragma once
/**
 * @file `comm_error`: what every communicator throws when a collective or point-to-point operation fails.
 */
#include <stdexcept>

namespace mpar {

/** @brief A collective or point-to-point failure: a peer threw, timed out, or called with mismatched arguments. */
class comm_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace mpar
