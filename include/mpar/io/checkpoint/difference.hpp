#pragma once
/**
 * @file `largest_difference`: how far apart two checkpoints are, tensor by tensor, whatever layouts saved them — the
 * check that a parallel run trained the model the single rank trains. Part of `mpar/io/checkpoint.hpp`.
 */
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "mpar/io/checkpoint/reader.hpp"
#include "mpar/io/io_error.hpp"

namespace mpar::io {

/** @brief Where two checkpoints differ most. */
struct CheckpointDifference {
  std::string tensor;  ///< the tensor holding the largest difference (empty when no element differs)
  double largest =
      0;  ///< the largest absolute elementwise difference over the compared tensors (infinite where either holds a NaN)
};

/**
 * @brief Reads every tensor of checkpoint `a` and the same tensor of `b` as whole tensors (each checkpoint in any
 * layout; rank-local, no communicator) and returns the largest absolute elementwise difference and where it lies.
 * Optimizer states (`<parameter>/<state>`) are compared only with `with_states`. Throws naming the tensor when the
 * two hold different tensors (one lacks a tensor of the other, or its shape differs). A NaN on either side counts as
 * an infinite difference.
 */
[[nodiscard]] inline CheckpointDifference largest_difference(const std::filesystem::path& a,
                                                             const std::filesystem::path& b, bool with_states = false) {
  CheckpointReader ra(a), rb(b);
  auto compared = [&](const std::string& name) { return with_states || name.find('/') == std::string::npos; };
  auto check_holds = [&](CheckpointReader& from, CheckpointReader& in) {
    for (const auto& t : from.manifest().tensors) {
      if (!compared(t.name)) continue;
      const TensorRecord* other = in.manifest().find(t.name);
      detail::check(other != nullptr && other->shape == t.shape, "largest_difference: tensor '", t.name, "' of ",
                    from.path().string(), other ? " has another shape in " : " is missing from ", in.path().string());
    }
  };
  check_holds(ra, rb);
  check_holds(rb, ra);
  CheckpointDifference out;
  for (const auto& t : ra.manifest().tensors) {
    if (!compared(t.name)) continue;
    const std::vector<float> va = ra.read_whole(t.name), vb = rb.read_whole(t.name);
    for (std::size_t i = 0; i < va.size(); ++i) {
      const double d = std::isnan(va[i]) || std::isnan(vb[i]) ? INFINITY : std::abs(double(va[i]) - double(vb[i]));
      if (d > out.largest) out = {t.name, d};
    }
  }
  return out;
}

}  // namespace mpar::io
