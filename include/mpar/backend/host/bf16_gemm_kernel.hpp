#pragma once
/**
 * @file Which code runs the host's bf16 x bf16 -> fp32 GEMMs: the GEMM library, or mpar's avx512_bf16 kernel
 * (`avx512_bf16_gemm.hpp`), chosen at run time.
 *
 * Why a header of its own: the kernel's intrinsics (<immintrin.h>) cost about 0.4 s of compile time per
 * translation unit, a quarter of the umbrella header's. The GEMM entry points include only this choice; the
 * kernel registers itself (`detail::avx512_bf16_gemm_entry`) in a program that includes its header in some
 * source file. `gemm.hpp` includes it in CBLAS builds, whose library has no bf16 kernels, where it is the
 * default; in a oneDNN build the library is the default, and in a build with no BLAS (portable loops) the
 * kernel is left out so that the bare umbrella header stays cheap: there a program that wants the kernel
 * (tests, benchmarks, or a portable build on an AVX-512-BF16 CPU) includes `avx512_bf16_gemm.hpp` once.
 *
 * Choice (`bf16_gemm_kernel()`): the kernel where the CPU has avx512_bf16 (and the AVX-512 level of
 * isa.hpp), the library has no bf16 kernels (`library_has_bf16_kernels`), the kernel is in the program and
 * the calling thread has not pinned a lower `Isa`; otherwise the library (oneDNN, or fp32 after widening).
 * `MPAR_HOST_BF16_GEMM=avx512_bf16|onednn|auto` in the environment, read once, or a `ScopedBf16GemmKernel`
 * on the calling thread forces either.
 */
#include <cstddef>
#include <cstdlib>
#include <optional>
#include <string_view>

#include "mpar/backend/host/isa.hpp"
#include "mpar/core/dtype.hpp"
#include "mpar/core/error.hpp"

namespace mpar::host {

/** @brief Which code computes the host's bf16 x bf16 -> fp32 GEMMs. */
enum class Bf16GemmKernel {
  library,      ///< oneDNN's matmul (its AMX or AVX-512 kernels), else fp32 after widening the operands
  avx512_bf16,  ///< mpar's packed `vdpbf16ps` kernel (avx512_bf16_gemm.hpp)
};

/** @brief The kernel's name: "library" or "avx512_bf16". */
[[nodiscard]] inline const char* bf16_gemm_kernel_name(Bf16GemmKernel kernel) {
  return kernel == Bf16GemmKernel::avx512_bf16 ? "avx512_bf16" : "library";
}

/**
 * @brief Whether the configured GEMM library has bf16 kernels of its own: oneDNN (MPAR_HOST_GEMM=onednn) runs
 * bf16 on `vdpbf16ps` (AVX-512-BF16) or AMX tiles; CBLAS and the portable kernel widen bf16 to fp32.
 */
inline constexpr bool library_has_bf16_kernels =
#if defined(MPAR_HAVE_ONEDNN)
    true;
#else
    false;
#endif

namespace detail {
/// The avx512_bf16 kernel's entry point (op(A) transposed, op(B) transposed, m, n, k, alpha, A, lda, B, ldb,
/// beta, C, ldc, bias or null), set by `avx512_bf16_gemm.hpp` in a program that includes it; null otherwise.
using Bf16GemmEntry = void (*)(bool, bool, std::size_t, std::size_t, std::size_t, float, const bf16*, std::size_t,
                               const bf16*, std::size_t, float, float*, std::size_t, const float*);
inline Bf16GemmEntry avx512_bf16_gemm_entry = nullptr;
}  // namespace detail

/** @brief Whether this program can run the avx512_bf16 kernel: the CPU has it and the kernel is compiled in. */
[[nodiscard]] inline bool avx512_bf16_gemm_available() {
  return cpu_has_avx512_bf16() && detail::avx512_bf16_gemm_entry != nullptr;
}

/** Throws, naming `what` and the fix, unless the avx512_bf16 kernel can run in this program. */
inline void require_avx512_bf16_gemm(const char* what) {
  require(cpu_has_avx512_bf16(), "host bf16 GEMM: ", what, " needs avx512_bf16 and AVX-512 F/BW/DQ/VL, which this ",
          "CPU lacks (best ", isa_name(detected_isa()), "); use the library kernel (MPAR_HOST_BF16_GEMM=onednn)");
  require(detail::avx512_bf16_gemm_entry != nullptr, "host bf16 GEMM: ", what,
          " needs the avx512_bf16 kernel, which this program does not contain; include "
          "<mpar/backend/host/avx512_bf16_gemm.hpp> in one of its source files");
}

namespace detail {
inline thread_local std::optional<Bf16GemmKernel> pinned_bf16_gemm_kernel;

/**
 * The kernel a value of MPAR_HOST_BF16_GEMM selects. "" and "auto": avx512_bf16 where the CPU has it and the
 * library has no bf16 kernels of its own (a CBLAS or portable build), else the library: oneDNN 2.6's bf16
 * matmul (brgemm on `vdpbf16ps`, or AMX tiles where present) measured slightly faster than this kernel on a
 * CPU without AMX (docs/performance.md). Throws naming the value and the choices for anything else, or for
 * avx512_bf16 on a CPU without it.
 */
inline Bf16GemmKernel parse_bf16_gemm_kernel(std::string_view want) {
  if (want == "onednn" || want == "library") return Bf16GemmKernel::library;
  if (want == "avx512_bf16") {
    require_avx512_bf16_gemm("MPAR_HOST_BF16_GEMM=avx512_bf16");
    return Bf16GemmKernel::avx512_bf16;
  }
  require(want.empty() || want == "auto", "host bf16 GEMM: MPAR_HOST_BF16_GEMM=", want,
          " is not a kernel; use avx512_bf16, onednn (or library) or auto, or unset it");
  return avx512_bf16_gemm_available() && !library_has_bf16_kernels ? Bf16GemmKernel::avx512_bf16
                                                                   : Bf16GemmKernel::library;
}

/** The process-wide choice: MPAR_HOST_BF16_GEMM, read once. */
inline Bf16GemmKernel default_bf16_gemm_kernel() {
  static const Bf16GemmKernel choice = [] {
    const char* env = std::getenv("MPAR_HOST_BF16_GEMM");
    return parse_bf16_gemm_kernel(env ? env : "");
  }();
  return choice;
}
}  // namespace detail

/**
 * @brief The kernel the calling thread's bf16 GEMMs run on: the pinned one (ScopedBf16GemmKernel), else the
 * process's choice; the library whenever the thread pinned an `Isa` below avx512 (ScopedIsa).
 */
[[nodiscard]] inline Bf16GemmKernel bf16_gemm_kernel() {
  if (active_isa() != Isa::avx512) return Bf16GemmKernel::library;
  return detail::pinned_bf16_gemm_kernel.value_or(detail::default_bf16_gemm_kernel());
}

/**
 * @brief Pins the calling thread's bf16 GEMMs to `kernel` for the object's lifetime (then restores the
 * previous choice). Throws, naming the fix, when the CPU cannot run it or the program does not contain it.
 */
class ScopedBf16GemmKernel {
 public:
  explicit ScopedBf16GemmKernel(Bf16GemmKernel kernel) : previous_(detail::pinned_bf16_gemm_kernel) {
    if (kernel == Bf16GemmKernel::avx512_bf16) require_avx512_bf16_gemm("pinning the avx512_bf16 kernel");
    detail::pinned_bf16_gemm_kernel = kernel;
  }
  ~ScopedBf16GemmKernel() { detail::pinned_bf16_gemm_kernel = previous_; }
  ScopedBf16GemmKernel(const ScopedBf16GemmKernel&) = delete;
  ScopedBf16GemmKernel& operator=(const ScopedBf16GemmKernel&) = delete;

 private:
  std::optional<Bf16GemmKernel> previous_;
};

}  // namespace mpar::host
