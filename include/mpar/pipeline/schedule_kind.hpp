#pragma once
/**
 * @file `ScheduleKind`: the pipeline schedules as a value, for configurations (the trainer's, the planner's) that
 * choose one at run time; each names one schedule type of `schedules.hpp`.
 */
#include <optional>
#include <string_view>

namespace mpar::pipeline {

/** @brief One per schedule type: `GPipe`, `OneFOneB`, `Interleaved1F1B`, `ZBH1`, `ZBH2`, `PipeDream2BW`. */
enum class ScheduleKind { gpipe, one_f_one_b, interleaved, zb_h1, zb_h2, two_bw };

inline constexpr ScheduleKind all_schedules[] = {ScheduleKind::gpipe,       ScheduleKind::one_f_one_b,
                                                 ScheduleKind::interleaved, ScheduleKind::zb_h1,
                                                 ScheduleKind::zb_h2,       ScheduleKind::two_bw};

/** The schedule type's `name` (schedules.hpp checks that they agree): what `--schedule` takes. */
[[nodiscard]] constexpr std::string_view schedule_name(ScheduleKind s) {
  switch (s) {
    case ScheduleKind::gpipe:
      return "gpipe";
    case ScheduleKind::one_f_one_b:
      return "1f1b";
    case ScheduleKind::interleaved:
      return "interleaved_1f1b";
    case ScheduleKind::zb_h1:
      return "zb_h1";
    case ScheduleKind::zb_h2:
      return "zb_h2";
    case ScheduleKind::two_bw:
      return "2bw";
  }
  return "?";
}

/** The schedule named `s` (or "interleaved", the common short spelling); nullopt for any other name. */
[[nodiscard]] constexpr std::optional<ScheduleKind> parse_schedule(std::string_view s) {
  if (s == "interleaved") return ScheduleKind::interleaved;
  for (auto k : all_schedules)
    if (schedule_name(k) == s) return k;
  return std::nullopt;
}

/** Zero-bubble schedules run the weight-gradient half of backward as its own action. */
[[nodiscard]] constexpr bool splits_backward(ScheduleKind s) {
  return s == ScheduleKind::zb_h1 || s == ScheduleKind::zb_h2;
}

}  // namespace mpar::pipeline
