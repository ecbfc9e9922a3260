#pragma once
/**
 * @file The fingerprint of a block's identity (name, shape, box) by which a save finds replicas held by several ranks.
 * Part of `mpar/io/checkpoint.hpp` (docs/checkpoints.md).
 */
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "mpar/io/box.hpp"

namespace mpar::io {

namespace detail {

/** A 64-bit FNV-1a fingerprint of a block's identity (name, shape, box) to find replicas. */
inline std::uint64_t block_key(const std::string& name, const std::vector<std::size_t>& shape, const BoxN& box) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  auto mix = [&](const void* p, std::size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  };
  mix(name.data(), name.size());
  const std::uint64_t sep = ~0ull;
  mix(&sep, 8);
  for (std::uint64_t e : shape) mix(&e, 8);
  mix(&sep, 8);
  for (const auto& b : box) {
    std::uint64_t o = b.offset, x = b.extent;
    mix(&o, 8);
    mix(&x, 8);
  }
  return h;
}

}  // namespace detail

}  // namespace mpar::io
