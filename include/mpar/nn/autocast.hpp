#pragma once
/**
 * @file `Autocast`: the element type the GEMM layers compute in, as a scope on the calling rank's thread
 * (the numerics of GPU AMP, `torch.autocast`).
 *
 * Inside an `Autocast(ComputeType::bf16)` (or `f16`) scope, Linear, ColumnParallel and RowParallel take
 * 16-bit GEMM operands: a 16-bit copy of the weight (the mixed-precision optimizer's, made once per step,
 * else one `B::convert` per layer and scope: `HalfWeight`) and the input converted by `B::convert` right
 * before the product; the products accumulate in fp32 and the outputs are fp32. The backward runs
 * `dx = dy Wᵀ` and `dW += xᵀ dy` the same way (dy converted once, the 16-bit input kept from the forward, so
 * the stash is half the size). Layer norm, softmax, GeLU, the loss and the optimizer's master weights stay
 * fp32.
 *
 * Why a thread-local scope rather than a layer template parameter: the precision is the trainer's policy
 * for a step (chosen at run time by `--precision`), not a property of a layer's type; a scope switches
 * every layer of a model without threading a type through every composition, exactly as torch's autocast
 * does. A rank's passes run on the rank's thread, so each rank's scope is its own. The layer reads the
 * scope once per call and records in what it keeps which type the forward used, so a backward always
 * matches its forward.
 */
#include <atomic>
#include <cstdint>
#include <string_view>

namespace mpar::nn {

/** @brief The element type of the GEMM operands (accumulation and outputs are always fp32). */
enum class ComputeType { fp32, bf16, f16 };

[[nodiscard]] constexpr std::string_view name_of(ComputeType t) {
  return t == ComputeType::fp32 ? "fp32" : t == ComputeType::bf16 ? "bf16" : "f16";
}

namespace detail {
struct AutocastState {
  ComputeType type = ComputeType::fp32;
  std::uint64_t generation = 0;  ///< distinct for every scope entered in the process (0: none)
};
inline thread_local AutocastState autocast_state;
inline std::atomic<std::uint64_t> autocast_generations{0};
}  // namespace detail

/**
 * @brief While alive, the GEMM layers called on this thread compute in `type`. Every scope starts a new
 * generation: a layer converts its weight to 16 bits once per generation, so the weights must not change
 * while a scope is open (the trainer opens one per step, around the forward and backward passes, after
 * the optimizer's update). Scopes nest; the destructor restores the enclosing one.
 */
class Autocast {
 public:
  explicit Autocast(ComputeType type) : saved_(detail::autocast_state) {
    detail::autocast_state = {type, detail::autocast_generations.fetch_add(1, std::memory_order_relaxed) + 1};
  }
  ~Autocast() { detail::autocast_state = saved_; }
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  detail::AutocastState saved_;
};

/** @brief The compute type of the innermost `Autocast` scope on this thread (fp32 outside any). */
[[nodiscard]] inline ComputeType autocast_type() { return detail::autocast_state.type; }
/** @brief The generation of the innermost scope on this thread (0 outside any). */
[[nodiscard]] inline std::uint64_t autocast_generation() { return detail::autocast_state.generation; }

}  // namespace mpar::nn
