#pragma once
// Helpers for the tensor-parallel equivalence tests: deterministic inputs, slicing a global activation
// into a rank's block, re-assembling parameters from their shards, and the norm-relative error.
#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include <mpar/nn.hpp>

namespace mpar::testing {

using nn::Activation;

/** The tolerance every equivalence test states: ||a - b||_2 <= 1e-5 * ||b||_2 (fp32). */
inline constexpr double rel_tol = 1e-5;

inline double rel_err(std::span<const float> a, std::span<const float> b) {
  if (a.size() != b.size()) return 1e30;
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

inline Activation random_activation(std::size_t rows, std::size_t cols, std::uint64_t stream, double scale = 1.0) {
  Activation a({rows, cols});
  const CounterRng rng{12345, stream};
  for (std::size_t i = 0; i < a.size(); ++i) a.data()[i] = float(scale * rng.normal(i));
  return a;
}

/** Rank `r`'s block of a global activation in layout `L` over `p` ranks (even splits). */
template <class L>
Activation local_block(const Activation& g, std::size_t p, std::size_t r) {
  if constexpr (std::is_same_v<L, nn::TokenShard>)
    return nn::local_tokens(g, p, r);
  else if constexpr (std::is_same_v<L, nn::FeatureShard>)
    return nn::local_features<HostBackend>(g, p, r);
  else
    return g;
}

/** Writes rank `r`'s block back into the global activation (caller serialises). */
template <class L>
void put_block(Activation& g, const Activation& local, std::size_t p, std::size_t r) {
  std::size_t r0 = 0, c0 = 0;
  if constexpr (std::is_same_v<L, nn::TokenShard>) r0 = r * (g.extent(0) / p);
  if constexpr (std::is_same_v<L, nn::FeatureShard>) c0 = r * (g.extent(1) / p);
  for (std::size_t i = 0; i < local.extent(0); ++i)
    for (std::size_t j = 0; j < local.extent(1); ++j) g(r0 + i, c0 + j) = local(i, j);
}

/**
 * Parameters re-assembled from every rank's shard. Replicated copies must agree: the largest
 * difference between two copies of the same element is kept in `replica_mismatch`.
 */
struct Assembled {
  std::map<std::string, std::vector<float>> value, grad;
  std::map<std::string, std::vector<char>> seen;
  double replica_mismatch = 0;
  std::mutex m;

  void add(const std::vector<nn::Parameter*>& ps) {
    std::lock_guard lock(m);
    for (const nn::Parameter* p : ps) {
      const std::size_t n = p->global_size(), rank = p->global_shape.size();
      auto& v = value[p->name];
      auto& g = grad[p->name];
      auto& s = seen[p->name];
      v.resize(n), g.resize(n), s.resize(n, 0);
      std::vector<std::size_t> idx(rank);
      for (std::size_t k = 0; k < p->local_size(); ++k) {
        std::size_t rem = k, gi = 0;
        for (std::size_t d = rank; d-- > 0;) {
          idx[d] = rem % p->local_box[d].extent;
          rem /= p->local_box[d].extent;
        }
        for (std::size_t d = 0; d < rank; ++d) gi = gi * p->global_shape[d] + p->local_box[d].offset + idx[d];
        if (s[gi]) {
          replica_mismatch =
              std::max({replica_mismatch, double(std::abs(v[gi] - p->value[k])), double(std::abs(g[gi] - p->grad[k]))});
        }
        v[gi] = p->value[k], g[gi] = p->grad[k], s[gi] = 1;
      }
    }
  }
};

}  // namespace mpar::testing
