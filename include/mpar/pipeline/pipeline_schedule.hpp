#pragma once
/**
 * @file The `pipeline_schedule` concept: what a schedule type (GPipe, 1F1B, ...) provides.
 */
#include <concepts>
#include <string>
#include <string_view>

#include "mpar/pipeline/action.hpp"

namespace mpar::pipeline {

/**
 * @brief A schedule type. Requirements: `S::name` (string_view); `S::build(ScheduleConfig) -> Programs`
 * (constexpr); `S::check(ScheduleConfig) -> std::string` (constexpr; empty when the configuration is
 * valid, otherwise a sentence saying what to change); static facts `S::split_backward`,
 * `S::asynchronous`, `S::supports_chunks`.
 */
template <class S>
concept pipeline_schedule = requires(const ScheduleConfig& c) {
  { S::name } -> std::convertible_to<std::string_view>;
  { S::build(c) } -> std::same_as<Programs>;
  { S::check(c) } -> std::same_as<std::string>;
  { S::split_backward } -> std::convertible_to<bool>;
  { S::asynchronous } -> std::convertible_to<bool>;
  { S::supports_chunks } -> std::convertible_to<bool>;
};

}  // namespace mpar::pipeline
