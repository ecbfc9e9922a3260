#pragma once
/**
 * @file A training checkpoint of a `parallel::DistributedOptimizer`: the parameters it updates, its update rule's
 * states and its update count, saved and loaded in one call each, in any layout.
 *
 * ```
 * io::save_training_checkpoint("ckpt", optimizer, world);        // collective over the world
 * io::load_training_checkpoint("ckpt", fresh_optimizer, world);  // any other tp x pp x dp layout
 * ```
 * See docs/checkpoints.md ("A training checkpoint of your own model").
 */
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "mpar/backend/rank_transfer.hpp"
#include "mpar/comm/detail/collective_communicator.hpp"
#include "mpar/io/blocks.hpp"
#include "mpar/io/checkpoint.hpp"
#include "mpar/parallel/distributed_optimizer.hpp"

namespace mpar::io {

namespace detail {
/** Refuses what the host-side checkpoint cannot reach: ZeRO-3's released weights (rank memory is static_asserted). */
template <class Optimizer>
void check_training_checkpoint(Optimizer& opt, const char* op) {
  for (auto* z : opt.zeros())
    check(z->stage() != parallel::ZeroStage::parameters, op,
          ": ZeRO-3 holds only weight shards between steps; gather them first (as "
          "models::GptTrainer::save does) or checkpoint with ZeRO-1/2, whose checkpoints load into ZeRO-3");
}
/** The manifest entry holding the update count of `opt`'s rule ("adamw.steps", "sgd.steps"). */
template <class Optimizer>
std::string steps_key(const Optimizer& opt) {
  return std::string(parallel::name_of(opt.config().rule)) + ".steps";
}
}  // namespace detail

/**
 * @brief This rank's blocks of a training checkpoint of `opt`: every parameter it updates, as its block of the
 * global tensor, and with `with_states` the states of its update rule laid out like it (`<name>/adamw.m`,
 * `<name>/adamw.v`, `<name>/sgd.momentum`; ZeRO-1/2's flat moment ranges as boxes), so the checkpoint loads into any
 * layout. The views are of rank memory: over a backend whose memory the host cannot read, stage them through
 * `io::StagedBlocks` before the writer or reader touches them (`training_blocks` refuses such a backend).
 * `T` is `const float` to save, `float` to load.
 */
template <class T, communicator Comm, backend B, communicator TensorComm>
[[nodiscard]] std::vector<BlockView<T>> optimizer_blocks(parallel::DistributedOptimizer<Comm, B, TensorComm>& opt,
                                                         bool with_states = true) {
  using Span = std::span<T>;
  std::vector<BlockView<T>> out;
  const auto& params = opt.params();
  for (std::size_t i = 0; i < params.size(); ++i) {
    nn::Parameter& p = *params[i];
    out.push_back(block_like(p, p.name, Span(p.value)));
    if (!with_states) continue;
    if (auto* adamw = opt.adamw()) {
      out.push_back(state_block(p, "adamw.m", Span(adamw->first_moment_mut(i))));
      out.push_back(state_block(p, "adamw.v", Span(adamw->second_moment_mut(i))));
    }
    // Without the momentum the first step after a resume would differ from the uninterrupted run's.
    if (auto* sgd = opt.sgd(); sgd && !sgd->momentum_buffer_mut(i).empty())
      out.push_back(state_block(p, "sgd.momentum", Span(sgd->momentum_buffer_mut(i))));
  }
  if (with_states)
    for (auto* zero : opt.zeros())  // with experts two: the replicated parameters' and the experts'
      for (const auto& piece : zero->state_pieces()) {
        for (auto& b : flat_state_blocks(*piece.param, "adamw.m", piece.param_offset, Span(piece.m))) out.push_back(b);
        for (auto& b : flat_state_blocks(*piece.param, "adamw.v", piece.param_offset, Span(piece.v))) out.push_back(b);
      }
  return out;
}

/** @brief `optimizer_blocks` with every state, for the host-readable memory the writer and reader use directly. */
template <class T, communicator Comm, backend B, communicator TensorComm>
[[nodiscard]] std::vector<BlockView<T>> training_blocks(parallel::DistributedOptimizer<Comm, B, TensorComm>& opt) {
  static_assert(mpar::host_reads_rank_memory<B>,
                "io::training_blocks: the checkpoint writer reads the blocks on the host; over a backend whose "
                "memory the host cannot read, stage them through io::StagedBlocks (models::GptTrainer::save does)");
  return optimizer_blocks<T>(opt);
}

/**
 * @brief Saves a training checkpoint of `opt` under `root` (collective over `world`, every rank of the run):
 * `training_blocks`, `state` with the update rule's name ("optimizer"), its update count ("adamw.steps" or
 * "sgd.steps") and the f16 loss scale added, and `state.step` set to the update count when left 0. Each block is
 * written once, by the lowest rank holding it. ZeRO-3 is refused (its weights are released between steps).
 */
template <mpar::detail::collective_communicator World, communicator Comm, backend B, communicator TensorComm>
SaveResult save_training_checkpoint(const std::filesystem::path& root,
                                    parallel::DistributedOptimizer<Comm, B, TensorComm>& opt, World& world,
                                    TrainingState state = {}, const SaveOptions& options = {}) {
  detail::check_training_checkpoint(opt, "save_training_checkpoint");
  const std::vector<SaveBlock> blocks = training_blocks<const float>(opt);
  if (state.step == 0) state.step = opt.steps();
  state.user["optimizer"] = std::string(parallel::name_of(opt.config().rule));
  state.user[detail::steps_key(opt)] = std::to_string(opt.steps());
  if (const auto* scaler = opt.scaler())
    state.loss_scale = LossScaleState{scaler->scale(), std::uint64_t(scaler->good_steps_in_a_row()),
                                      std::uint64_t(scaler->skipped_steps())};
  return save_checkpoint(root, std::span<const SaveBlock>(blocks), state, world, options);
}

/**
 * @brief Loads a training checkpoint saved by `save_training_checkpoint` from any layout into `opt`'s parameters and
 * states (collective over `world`), and restores its update count and loss scale, so the next `opt.step` is the one
 * the saved run would have taken. `path` is a checkpoint directory or a root holding `latest`. A checkpoint of
 * another update rule is refused, naming both, before anything is read.
 */
template <mpar::detail::collective_communicator World, communicator Comm, backend B, communicator TensorComm>
LoadResult load_training_checkpoint(const std::filesystem::path& path,
                                    parallel::DistributedOptimizer<Comm, B, TensorComm>& opt, World& world) {
  detail::check_training_checkpoint(opt, "load_training_checkpoint");
  const std::string rule(parallel::name_of(opt.config().rule));
  Manifest saved;
  detail::agree(world, detail::capture([&] { saved = read_manifest(resolve_checkpoint(path)); }),
                "load_training_checkpoint (reading the manifest)");
  const auto it = saved.state.user.find("optimizer");
  detail::check(it != saved.state.user.end() && it->second == rule, "load_training_checkpoint: checkpoint ",
                path.string(), " holds the states of optimizer '",
                it == saved.state.user.end() ? std::string("(not recorded)") : it->second,
                "' but this optimizer's update rule is '", rule, "'; build the optimizer with that rule");
  const std::vector<LoadBlock> blocks = training_blocks<float>(opt);
  LoadResult res = load_checkpoint(path, std::span<const LoadBlock>(blocks), world);
  const auto steps = res.state.user.find(detail::steps_key(opt));
  detail::check(steps != res.state.user.end(), "load_training_checkpoint: checkpoint ", res.path.string(), " has no '",
                detail::steps_key(opt), "' entry (not saved by save_training_checkpoint?)");
  opt.set_steps(std::size_t(std::stoull(steps->second)));
  if (auto* scaler = opt.scaler(); scaler && res.state.loss_scale)
    scaler->restore(res.state.loss_scale->scale, std::size_t(res.state.loss_scale->good_steps),
                    std::size_t(res.state.loss_scale->skipped));
  return res;
}

}  // namespace mpar::io
