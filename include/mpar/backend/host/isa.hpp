#pragma once
/**
 * @file Run-time choice of the instruction set the host's element-wise kernels run with.
 *
 * Why: mpar sets no `-march` (one binary must run on every x86-64 machine), so ordinary code is
 * compiled for SSE2 and the vectorized kernels (GeLU, softmax, layer norm, cross-entropy, see
 * `fast_math.hpp`) would run 4 floats wide even on a CPU with AVX-512. `with_isa(body)` compiles `body`
 * once per level below, each inside a function with the `target` attribute of that level and
 * `flatten` (so `body` and everything it calls, fast_exp included, are inlined and vectorized for that
 * level), and calls the copy for the calling thread's active level:
 * - `Isa::baseline`: what the compiler targets anyway (x86-64: SSE2);
 * - `Isa::avx2`: AVX2 + FMA (x86-64-v3), 8 floats wide;
 * - `Isa::avx512`: AVX-512 F/CD/BW/DQ/VL (x86-64-v4), 16 floats wide.
 * The CPU (and the OS's saving of its registers) is asked once, through __builtin_cpu_supports; a
 * thread may pin a lower level with `ScopedIsa`, which is how the tests run every level explicitly.
 * Levels may differ in the last bits (FMA contracts a multiply and an add into one rounding); each
 * meets the accuracy documented in `fast_math.hpp`. On other architectures and compilers only
 * `Isa::baseline` exists.
 */
#include <optional>
#include <vector>

#include "mpar/core/error.hpp"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define MPAR_HOST_MULTIVERSION 1
#else
#define MPAR_HOST_MULTIVERSION 0
#endif

namespace mpar::host {

/** @brief Instruction-set levels of the host kernels, lowest first. */
enum class Isa { baseline, avx2, avx512 };

/** @brief The level's name: "baseline", "avx2" or "avx512". */
[[nodiscard]] inline const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::baseline:
      return "baseline";
    case Isa::avx2:
      return "avx2";
    case Isa::avx512:
      return "avx512";
  }
  return "?";
}

/** @brief The best level this CPU runs (asked once per process). */
[[nodiscard]] inline Isa detected_isa() {
  static const Isa best = [] {
#if MPAR_HOST_MULTIVERSION
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx2") &&
        __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi2"))
      return Isa::avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi2"))
      return Isa::avx2;
#endif
    return Isa::baseline;
  }();
  return best;
}

/** @brief Every level this CPU runs, lowest first (the tests run each). */
[[nodiscard]] inline std::vector<Isa> supported_isas() {
  std::vector<Isa> levels;
  for (Isa l : {Isa::baseline, Isa::avx2, Isa::avx512})
    if (int(l) <= int(detected_isa())) levels.push_back(l);
  return levels;
}

namespace detail {
inline thread_local std::optional<Isa> pinned_isa;
}  // namespace detail

/** @brief The level the calling thread's kernels run with: the pinned one (ScopedIsa), else the detected one. */
[[nodiscard]] inline Isa active_isa() { return detail::pinned_isa.value_or(detected_isa()); }

/** @brief Whether this CPU has avx512_bf16 besides the host's AVX-512 level (the bf16 GEMM kernel and the
 * conversions' `vcvtne2ps2bf16` need both). */
[[nodiscard]] inline bool cpu_has_avx512_bf16() {
#if MPAR_HOST_MULTIVERSION
  static const bool has = [] {
    __builtin_cpu_init();
    return detected_isa() == Isa::avx512 && __builtin_cpu_supports("avx512bf16") != 0;
  }();
  return has;
#else
  return false;
#endif
}

/**
 * @brief Pins the calling thread's kernels to `isa` for the object's lifetime (then restores the previous
 * choice). Throws, naming both levels, when the CPU does not support `isa`.
 */
class ScopedIsa {
 public:
  explicit ScopedIsa(Isa isa) : previous_(detail::pinned_isa) {
    require(int(isa) <= int(detected_isa()), "host kernels: instruction set ", isa_name(isa),
            " is not supported by this CPU, whose best is ", isa_name(detected_isa()), "; pin one of supported_isas()");
    detail::pinned_isa = isa;
  }
  ~ScopedIsa() { detail::pinned_isa = previous_; }
  ScopedIsa(const ScopedIsa&) = delete;
  ScopedIsa& operator=(const ScopedIsa&) = delete;

 private:
  std::optional<Isa> previous_;
};

namespace detail {
#if MPAR_HOST_MULTIVERSION
// The target strings name features, not an `arch=`: GCC inlines a callee only into a caller of the same
// arch, and `flatten` must inline the (default-arch) kernel bodies here.
template <class F>
[[gnu::target("avx512f,avx512cd,avx512bw,avx512dq,avx512vl,avx2,fma,bmi,bmi2,lzcnt,popcnt,f16c,movbe"),
  gnu::flatten]] void
run_avx512(F& body) {
  body();
}
template <class F>
[[gnu::target("avx2,fma,bmi,bmi2,lzcnt,popcnt,f16c,movbe"), gnu::flatten]] void run_avx2(F& body) {
  body();
}
#endif
}  // namespace detail

/**
 * @brief Calls `body()` compiled for the calling thread's active level. `body` must be an inlinable
 * callable (a lambda over the kernel's loops); it runs once, on the calling thread.
 */
template <class F>
inline void with_isa(F&& body) {
#if MPAR_HOST_MULTIVERSION
  switch (active_isa()) {
    case Isa::avx512:
      detail::run_avx512(body);
      return;
    case Isa::avx2:
      detail::run_avx2(body);
      return;
    case Isa::baseline:
      break;
  }
#endif
  body();
}

}  // namespace mpar::host
