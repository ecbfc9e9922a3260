#pragma once
/**
 * @file `check_layout`: does a layout train the model the single rank trains? Trains the first steps of a
 * configuration in its layout and in a reference configuration (by default the same run on one rank,
 * `single_rank_of`) from the same seeds and data, and compares every step's loss and, gathered to whole tensors
 * through the checkpoints both runs save, every parameter after the last step (`train_gpt --check-layout`,
 * docs/train_gpt.md). The most frequent complaint in the trackers of large-model trainers is a layout that silently
 * trains another model; this is the check a user runs for their own configuration.
 */
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <filesystem>
#include <string>
#include <system_error>
#include <tuple>
#include <vector>

#include "mpar/backend/host/host_backend.hpp"
#include "mpar/comm/threads.hpp"
#include "mpar/core/error.hpp"
#include "mpar/io/checkpoint.hpp"
#include "mpar/models/gpt_trainer.hpp"
#include "mpar/pipeline/schedules.hpp"

namespace mpar::models {

/**
 * @brief The same run on one rank: tp = pp = dp = cp = ep = 1, no ZeRO, no sequence parallelism, one model chunk,
 * the 1F1B schedule — the model (its vocabulary padded as the layout pads it), its seeds, the data and its seed, the
 * global batch and its micro-batches, the optimizer and its settings, the precision, dropout, the clipping and the
 * learning-rate schedule unchanged.
 * PipeDream-2BW is kept (at one stage): its weights lag one step by design, so the run it is checked against lags too.
 */
[[nodiscard]] inline GptTrainConfig single_rank_of(GptTrainConfig c) {
  c.pad_vocab_for_mesh();  // the layout's padded vocabulary: the same tensors, the padding never in the loss
  c.tp = c.pp = c.dp = c.cp = c.ep = 1;
  c.zero = parallel::ZeroStage::none;
  c.chunks = 1;
  c.stage_layers.clear();      // one stage holds every block
  c.recompute_stages.clear();  // recomputation repeats the forward's arithmetic: the reference needs none
  c.recompute_blocks.clear();
  c.model.sequence_parallel = false;
  c.model.expert_tp = 1;    // one rank keeps whole experts
  c.grad_topk_density = 0;  // compression changes the update by design: the reference is the dense run
  c.graph = false;
  if (c.schedule != pipeline::ScheduleKind::two_bw) c.schedule = pipeline::ScheduleKind::one_f_one_b;
  return c;
}

/** @brief How far a layout's run may be from the reference before `check_layout` fails it, and why. */
struct LayoutTolerance {
  double loss = 0;  ///< largest relative difference of one step's loss
  /// Largest absolute difference of one parameter element after the last step; infinite: reported, not judged.
  double parameter = 0;
  std::string reason;  ///< the sentence train_gpt prints beside the numbers
};

/**
 * @brief The tolerance for a configuration's precision (docs/train_gpt.md, "Checking a layout"). No layout is bound to
 * be equal bit for bit: each may sum the same products in another order (tensor-parallel partial sums, the data-parallel
 * average, micro-batch accumulation). fp32: 1e-5 relative for a loss (measured up to 6e-8 in 50 steps of tp, pp, dp,
 * cp, sequence parallelism and ZeRO-3) and 1e-4 for a parameter element (measured up to 1.4e-5 in 10 steps at
 * learning rate 3e-3: AdamW divides each gradient by its own running magnitude, which raises the rounding of a tiny
 * gradient to a visible update). bf16 and f16: 2e-3 relative for a loss (measured up to 3e-5); the parameters are
 * reported, not judged: where an order difference flips a 16-bit rounding, a GEMM operand moves by 2^-8 (bf16) or
 * 2^-11 (f16) relative, and AdamW turns the gradient's change into an element update that differs by up to the
 * learning rate (measured 6e-3 in 5 steps at 3e-3), as large as a real error would make it. A wrong layout — other
 * samples, a missed gradient sum, weights a step old — moves the losses by 1e-3 and more.
 */
[[nodiscard]] inline LayoutTolerance layout_tolerance(const GptTrainConfig& c) {
  if (c.precision == parallel::Precision::fp32)
    return {1e-5, 1e-4,
            "fp32, not bit for bit in general: a layout may sum in another order, and AdamW's per-element scaling "
            "raises the rounding of a tiny gradient to a visible update"};
  return {2e-3, INFINITY,
          std::string(parallel::name_of(c.precision)) +
              ": a summation order that flips a 16-bit rounding moves a GEMM operand by " +
              (c.precision == parallel::Precision::bf16 ? "2^-8" : "2^-11") +
              " relative, and AdamW turns that into element updates as large as an error's: the losses are judged, "
              "the parameters reported"};
}

/** @brief What `check_layout` found. */
struct LayoutCheck {
  std::vector<double> losses, reference_losses;          ///< each step's loss, in the layout and in the reference
  std::vector<double> grad_norms, reference_grad_norms;  ///< each step's gradient norm (reported, not judged)
  double loss_difference = 0;  ///< the largest relative difference of a step's loss (infinite where one is NaN)
  std::size_t loss_step = 0;   ///< the step (from 0) where it lies
  /// The largest absolute difference of a parameter element after the last step, and its tensor: every parameter
  /// gathered to its whole tensor from the checkpoints both runs saved (`io::CheckpointReader::read_whole`), the
  /// attention key bias aside.
  io::CheckpointDifference parameter_difference;
  /// The same for the attention key bias (row 1 of each `attn.qkv.bias`), reported but not judged: softmax ignores a
  /// constant added to a row of scores, so the key bias does not change what the model computes and its gradient is
  /// zero in exact arithmetic; AdamW turns the rounding noise it receives instead into updates of any size up to the
  /// learning rate, different under each summation order.
  io::CheckpointDifference key_bias_difference;
  LayoutTolerance tolerance;
  [[nodiscard]] bool losses_pass() const { return loss_difference <= tolerance.loss; }  // false for NaN
  [[nodiscard]] bool parameters_pass() const { return parameter_difference.largest <= tolerance.parameter; }
  [[nodiscard]] bool passed() const { return losses_pass() && parameters_pass(); }
};

namespace detail {
/** Trains `c` for `steps` steps on its thread ranks, records the reports in `losses` and `norms`, saves under `dir`. */
template <backend B>
std::filesystem::path train_for_check(const GptTrainConfig& c, data::SourceRef data, std::size_t steps,
                                      const std::filesystem::path& dir, std::vector<double>& losses,
                                      std::vector<double>& norms) {
  std::filesystem::path saved;
  run_threads(int(c.world_size()), [&](ThreadsCommunicator& world) {
    GptTrainer<ThreadsCommunicator, B> trainer(world, c, data);
    std::vector<double> l, n;
    for (std::size_t s = 0; s < steps; ++s) {
      const StepReport r = trainer.train_step();
      l.push_back(r.loss);
      n.push_back(r.grad_norm);
    }
    const io::SaveResult res = trainer.save(dir);
    if (world.rank() == 0) losses = std::move(l), norms = std::move(n), saved = res.path;
  });
  return saved;
}

/**
 * Every parameter of checkpoint `a` against the same of `b`, each read as its whole tensor; the key bias (row 1 of the
 * fused [3, hidden] QKV bias) apart. Throws `config_error` naming a tensor only one holds or holds in another shape.
 */
inline void compare_parameters(const std::filesystem::path& a, const std::filesystem::path& b, LayoutCheck& out) {
  io::CheckpointReader ra(a), rb(b);
  auto is_parameter = [](const std::string& name) { return name.find('/') == std::string::npos; };
  for (auto [from, in, what] : {std::tuple(&ra, &rb, "the layout's run"), std::tuple(&rb, &ra, "the reference run")})
    for (const auto& t : from->manifest().tensors) {
      if (!is_parameter(t.name)) continue;
      const io::TensorRecord* other = in->manifest().find(t.name);
      require(other != nullptr && other->shape == t.shape, "check_layout: parameter '", t.name, "' of ", what,
              other ? " has another shape in the other run" : " is missing from the other run",
              ": the two configurations are different models; compare a layout of one model with the same model");
    }
  for (const auto& t : ra.manifest().tensors) {
    if (!is_parameter(t.name)) continue;
    const std::vector<float> va = ra.read_whole(t.name), vb = rb.read_whole(t.name);
    const bool qkv_bias = t.name.ends_with(".attn.qkv.bias") && t.shape.size() == 2 && t.shape[0] == 3;
    for (std::size_t i = 0; i < va.size(); ++i) {
      const double d = std::isnan(va[i]) || std::isnan(vb[i]) ? INFINITY : std::abs(double(va[i]) - double(vb[i]));
      auto& worst = qkv_bias && i / t.shape[1] == 1 ? out.key_bias_difference : out.parameter_difference;
      if (d > worst.largest) worst = {t.name, d};
    }
  }
}
}  // namespace detail

/**
 * @brief Trains the first `steps` steps of `layout` on its thread ranks and of `reference` (usually
 * `single_rank_of(layout)`) on its own, each from its seeds on `data`, and compares them: every step's loss, and every
 * parameter after the last step as a whole tensor (each run saves a checkpoint under `scratch`, read back whole
 * whatever layout wrote it; both are removed afterwards). Judged against `layout_tolerance(layout)`. The learning-rate
 * schedule is the configurations' own (`steps` of their `GptTrainConfig::steps`), so the steps checked are the first
 * steps of the run configured. Throws `config_error` when a configuration is invalid, `steps` is 0 or beyond either's
 * `steps`, or the two are different models (a tensor one of them lacks, or of another shape).
 */
template <backend B = HostBackend>
LayoutCheck check_layout(const GptTrainConfig& layout, const GptTrainConfig& reference, data::SourceRef data,
                         std::size_t steps, const std::filesystem::path& scratch) {
  require(steps >= 1 && steps <= layout.steps && steps <= reference.steps, "check_layout: ", steps,
          " steps to compare, but the runs have ", layout.steps, " (layout) and ", reference.steps,
          " (reference); compare between 1 and ", std::min(layout.steps, reference.steps), " steps (--check-steps)");
  const std::filesystem::path layout_dir = scratch / "layout", reference_dir = scratch / "reference";
  struct Remove {  // the scratch checkpoints go, whether the check passes, fails or throws
    std::filesystem::path a, b;
    ~Remove() {
      std::error_code ec;
      std::filesystem::remove_all(a, ec);
      std::filesystem::remove_all(b, ec);
    }
  } remove{layout_dir, reference_dir};
  LayoutCheck out;
  out.tolerance = layout_tolerance(layout);
  const auto a = detail::train_for_check<B>(layout, data, steps, layout_dir, out.losses, out.grad_norms);
  const auto b =
      detail::train_for_check<B>(reference, data, steps, reference_dir, out.reference_losses, out.reference_grad_norms);
  for (std::size_t s = 0; s < steps; ++s) {
    const double x = out.losses[s], y = out.reference_losses[s];
    const double d = std::isnan(x) || std::isnan(y) ? INFINITY : std::abs(x - y) / std::max(std::abs(y), 1e-30);
    if (d > out.loss_difference) out.loss_difference = d, out.loss_step = s;
  }
  detail::compare_parameters(a, b, out);
  return out;
}

}  // namespace mpar::models
