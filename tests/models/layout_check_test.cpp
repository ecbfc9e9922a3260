// models::check_layout: layouts that train the single-rank model pass; configurations that train another model —
// weights a step old, a learning rate a tenth off — fail, by the losses or by the parameters; different models are
// refused, naming the tensor.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <mpar/models/layout_check.hpp>
#include <mpar/mpar.hpp>
#include <string>

#include "gpt_test_config.hpp"

using namespace mpar;

namespace layout_check_test {

/** This process's scratch directory: ctest runs the test cases as processes side by side. */
std::filesystem::path scratch() {
  return std::filesystem::temp_directory_path() / ("mpar-layout-check-test-" + std::to_string(::getpid()));
}

models::LayoutCheck check(const models::GptTrainConfig& layout, const models::GptTrainConfig& reference,
                          std::size_t steps = 3) {
  return models::check_layout(layout, reference, testing::gpt_dataset(), steps, scratch());
}

}  // namespace layout_check_test

TEST_CASE("check_layout passes layouts that train the single-rank model: tp 2 x pp 2, dp 2 with ZeRO-3, 2bw",
          "[models][gpt][layout_check]") {
  using layout_check_test::check;
  auto zero3 = testing::small_gpt(1, 1, 2);
  zero3.zero = parallel::ZeroStage::parameters;
  auto two_bw = testing::small_gpt(1, 2, 1, "2bw");  // checked against one rank whose weights lag alike
  for (const auto& [what, c] : {std::pair<std::string, models::GptTrainConfig>{"tp2 pp2", testing::small_gpt(2, 2, 1)},
                                {"dp2 ZeRO-3", zero3},
                                {"pp2 2bw", two_bw}}) {
    INFO(what);
    const models::LayoutCheck r = check(c, models::single_rank_of(c));
    REQUIRE(r.losses.size() == 3);
    REQUIRE(r.reference_losses.size() == 3);
    CHECK(r.loss_difference <= r.tolerance.loss);
    CHECK(r.parameter_difference.largest <= r.tolerance.parameter);
    REQUIRE(r.passed());
    REQUIRE(r.tolerance.loss == 1e-5);  // fp32
    REQUIRE(!std::filesystem::exists(layout_check_test::scratch() / "layout"));
    REQUIRE(!std::filesystem::exists(layout_check_test::scratch() / "reference"));
  }
  // The reference is one rank: the layout's mesh, ZeRO stage and schedule go, the model's padded vocabulary stays.
  auto tp3 = testing::small_gpt(1, 1, 1);
  tp3.tp = 3;
  tp3.model.heads = 3;
  tp3.model.hidden = 48;
  const auto one = models::single_rank_of(tp3);
  auto padded = tp3;
  padded.pad_vocab_for_mesh();  // as the tp = 3 trainer pads it: the tensors its checkpoint holds
  REQUIRE(one.world_size() == 1);
  REQUIRE(parallel::stage_number(one.zero) == 0);
  REQUIRE(one.model.vocab_multiple == padded.model.vocab_multiple);
  REQUIRE(one.model.padded_vocab() == padded.model.padded_vocab());
}

TEST_CASE("check_layout fails configurations that train another model", "[models][gpt][layout_check]") {
  using layout_check_test::check;
  // PipeDream-2BW's passes use the weights of the step before: against the synchronous one-rank run the first step's
  // loss agrees (no older weights yet) and the next ones do not.
  const auto lagged = check(testing::small_gpt(1, 2, 1, "2bw"), models::single_rank_of(testing::small_gpt(1, 2, 1)));
  CHECK(lagged.losses[0] == Approx(lagged.reference_losses[0]).epsilon(1e-6));
  CHECK(lagged.loss_step >= 1);
  CHECK(!lagged.losses_pass());
  REQUIRE(!lagged.passed());
  // A learning rate a tenth higher on one side: one step, whose loss comes from the same initial weights, agrees;
  // the parameters after it are apart by a tenth of AdamW's first update (the learning rate, per element).
  auto layout = testing::small_gpt(2, 1, 1);
  layout.warmup = 0;
  auto faster = models::single_rank_of(layout);
  faster.lr *= 1.1;
  const auto apart = check(layout, faster, 1);
  CHECK(apart.losses_pass());
  CHECK(apart.parameter_difference.largest > 1e-4);
  REQUIRE(!apart.parameters_pass());
  REQUIRE(!apart.passed());
  // Two different models are refused, naming a tensor only one of them has.
  auto shallower = models::single_rank_of(layout);
  shallower.model.layers = 2;
  REQUIRE_THROWS_WITH(check(layout, shallower, 1), Catch::Contains("the two configurations are different models"));
  // So are more steps than a run has.
  REQUIRE_THROWS_WITH(check(layout, models::single_rank_of(layout), 21), Catch::Contains("21 steps to compare"));
}

TEST_CASE("check_layout's tolerance: fp32 judges losses and parameters, bf16 and f16 the losses",
          "[models][gpt][layout_check]") {
  auto c = testing::small_gpt(1, 1, 1);
  CHECK(models::layout_tolerance(c).parameter == 1e-4);
  for (const char* p : {"bf16", "f16"}) {
    c.precision = parallel::parse_precision(p);
    const auto t = models::layout_tolerance(c);
    CHECK(t.loss == 2e-3);
    CHECK(std::isinf(t.parameter));
    CHECK(t.reason.find(p) == 0);
  }
  // A bf16 layout passes against its one-rank bf16 run.
  auto bf16 = testing::small_gpt(2, 2, 1);
  bf16.precision = parallel::Precision::bf16;
  REQUIRE(layout_check_test::check(bf16, models::single_rank_of(bf16)).passed());
}
