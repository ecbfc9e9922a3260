#pragma once
/**
 * @file Schedules whose P, M and V are compile-time constants: built, checked and verified by the
 * compiler. An invalid configuration is a `static_assert` that says what to change; a program that
 * would deadlock does not compile.
 *
 * ```
 * using S = StaticSchedule<OneFOneB, 4, 8>;     // verified at compile time
 * static_assert(S::peak_activations[0] == 4);
 * Programs p = S::programs();                    // for the executor / simulator
 * ```
 */
#include <algorithm>
#include <array>
#include <cstddef>
#include <type_traits>

#include "mpar/pipeline/schedules.hpp"
#include "mpar/pipeline/verifier.hpp"

namespace mpar::pipeline {

/** @brief Schedule `S` for compile-time P, M, V (and steps, for asynchronous schedules), verified by the compiler. */
template <pipeline_schedule S, int P, int M, int V = 1, int Steps = 1>
struct StaticSchedule {
  static_assert(P >= 1, "StaticSchedule: P (pipeline stages) must be at least 1");
  static_assert(M >= 1, "StaticSchedule: M (micro-batches) must be at least 1");
  static_assert(V >= 1, "StaticSchedule: V (chunks per rank) must be at least 1");
  static_assert(
      S::supports_chunks || V == 1,
      "StaticSchedule: this schedule runs one chunk per rank; use V = 1 or Interleaved1F1B for virtual stages");
  static_assert(!std::is_same_v<S, Interleaved1F1B> || M % P == 0,
                "StaticSchedule<Interleaved1F1B, P, M, V>: M (micro-batches) must be a multiple of P (stages); "
                "round M up to the next multiple of P");
  static_assert(
      !S::asynchronous || M >= P,
      "StaticSchedule<PipeDream2BW, P, M>: M must be at least P, or more than two weight versions would be alive");

  static constexpr ScheduleConfig config{P, M, V, Steps};
  /** @brief The causes above, together; later checks only run on a valid configuration (one message per cause). */
  static constexpr bool well_formed = P >= 1 && M >= 1 && V >= 1 && (S::supports_chunks || V == 1) &&
                                      (!std::is_same_v<S, Interleaved1F1B> || M % P == 0) &&
                                      (!S::asynchronous || M >= P);
  static_assert(!well_formed || S::check(config).empty(),
                "StaticSchedule: the schedule rejects this configuration (S::check(config) says why)");

  /** @brief True: the verifier replayed every rank's program at compile time (a failure stops compilation). */
  static constexpr bool verified = well_formed && S::check(config).empty() && verify(S::build(config)).ok;
  static_assert(!well_formed || verified,
                "StaticSchedule: the programs fail verification (deadlock or broken dependency); "
                "call verify(S::build(config)).error at run time for the ranks and actions");

  /** @brief The longest program, the static capacity of each rank's array. */
  static constexpr std::size_t capacity = [] {
    std::size_t n = 0;
    if constexpr (verified)
      for (const auto& r : S::build(config).ranks) n = std::max(n, r.size());
    return n;
  }();
  /** @brief Each rank's program length. */
  static constexpr std::array<std::size_t, P> lengths = [] {
    std::array<std::size_t, P> out{};
    if constexpr (verified) {
      const auto b = S::build(config);
      for (int r = 0; r < P; ++r) out[std::size_t(r)] = b.ranks[std::size_t(r)].size();
    }
    return out;
  }();
  /** @brief Each rank's program, padded to `capacity`. */
  static constexpr std::array<std::array<Action, capacity>, P> program = [] {
    std::array<std::array<Action, capacity>, P> out{};
    if constexpr (verified) {
      const auto b = S::build(config);
      for (int r = 0; r < P; ++r)
        for (std::size_t i = 0; i < b.ranks[std::size_t(r)].size(); ++i)
          out[std::size_t(r)][i] = b.ranks[std::size_t(r)][i];
    }
    return out;
  }();
  /** @brief Peak activations per rank, as the verifier counted them. */
  static constexpr std::array<int, P> peak_activations = [] {
    std::array<int, P> out{};
    if constexpr (verified) {
      const auto rep = verify(S::build(config));
      for (int r = 0; r < P; ++r) out[std::size_t(r)] = rep.peak_activations[std::size_t(r)];
    }
    return out;
  }();

  /** @brief The programs as the run-time type the executor and simulator take. */
  [[nodiscard]] static Programs programs() {
    Programs p{S::name, config, S::split_backward, S::asynchronous, {}};
    for (int r = 0; r < P; ++r)
      p.ranks.emplace_back(program[std::size_t(r)].begin(),
                           program[std::size_t(r)].begin() + std::ptrdiff_t(lengths[std::size_t(r)]));
    return p;
  }
};

}  // namespace mpar::pipeline
