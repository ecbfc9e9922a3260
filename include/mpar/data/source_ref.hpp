#pragma once
/**
 * @file `SourceRef`: a non-owning reference to any `token_source`.
 */
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>

#include "mpar/data/fingerprint.hpp"
#include "mpar/data/token_batch.hpp"
#include "mpar/data/token_source.hpp"

namespace mpar::data {

/**
 * @brief A non-owning reference to any `token_source` (the referenced object must outlive it).
 * Copyable; models the concept itself.
 */
class SourceRef {
 public:
  template <token_source D>
    requires(!std::same_as<D, SourceRef>)
  SourceRef(const D& d)  // NOLINT(google-explicit-constructor): a reference converts implicitly, like std::span
      : obj_(&d), vocab_([](const void* o) { return std::size_t(static_cast<const D*>(o)->vocab_size()); }),
        batch_([](const void* o, std::uint64_t seed, std::uint64_t step, std::size_t g, std::size_t n, std::size_t r) {
          return static_cast<const D*>(o)->batch(seed, step, g, n, r);
        }),
        fp_([](const void* o) { return static_cast<const D*>(o)->fingerprint(); }),
        describe_([](const void* o) { return std::string(static_cast<const D*>(o)->describe()); }) {}

  [[nodiscard]] std::size_t vocab_size() const { return vocab_(obj_); }
  [[nodiscard]] TokenBatch batch(std::uint64_t seed, std::uint64_t step, std::size_t global_batch,
                                 std::size_t dp_size = 1, std::size_t dp_rank = 0) const {
    return batch_(obj_, seed, step, global_batch, dp_size, dp_rank);
  }
  [[nodiscard]] DataFingerprint fingerprint() const { return fp_(obj_); }
  [[nodiscard]] std::string describe() const { return describe_(obj_); }

 private:
  const void* obj_;
  std::size_t (*vocab_)(const void*);
  TokenBatch (*batch_)(const void*, std::uint64_t, std::uint64_t, std::size_t, std::size_t, std::size_t);
  DataFingerprint (*fp_)(const void*);
  std::string (*describe_)(const void*);
};

}  // namespace mpar::data
