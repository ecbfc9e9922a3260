#pragma once
/** @file One (local) batch of token ids and their next-token targets. */
#include <cstddef>
#include <cstdint>
#include <vector>

namespace mpar::data {

/** @brief Token ids and next-token targets of one (local) batch, each `batch x seq` row-major. */
struct TokenBatch {
  std::size_t batch = 0, seq = 0;
  std::vector<std::int32_t> tokens, targets;
};

}  // namespace mpar::data
