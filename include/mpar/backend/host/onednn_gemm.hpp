#pragma once
/**
 * @file Host GEMM through oneDNN's matmul primitive, whose kernels (AMX, AVX-512 bf16/fp16, AVX2, ...)
 * oneDNN picks at run time for the CPU it runs on. Included by `gemm.hpp` when mpar was configured
 * with MPAR_HOST_GEMM=onednn (the macro MPAR_HAVE_ONEDNN).
 *
 * Why a per-thread cache: creating a matmul primitive (descriptor, implementation search, JIT code)
 * costs far more than a small GEMM, and even oneDNN's own primitive cache hashes a full descriptor per
 * call. Each thread (each rank) therefore keeps its own map from a call's signature (sizes, leading
 * dimensions, transposes, types, alpha, beta) to the primitive and its memory objects, so a repeated
 * GEMM costs one hash lookup and three pointer updates; being per thread, the map needs no lock.
 *
 * Why one thread: every rank runs its GEMMs single-threaded, so that ranks sharing a machine do not
 * oversubscribe its cores. oneDNN built with OpenMP (as Debian's libdnnl is) takes its thread count
 * from the calling thread's OpenMP setting, which libgomp keeps per thread: each call sets it to 1
 * around the primitive's creation and execution and restores the caller's value afterwards. The two
 * OpenMP functions are looked up in the running process (libdnnl brings libgomp) instead of being
 * linked, so programs that use mpar are not compiled or linked with OpenMP themselves.
 *
 * Why the C API (dnnl.h): nvcc 13's front end crashes on oneDNN's C++ header in C++20 mode, and CUDA
 * translation units include this header through HostBackend; the C API compiles everywhere. It is
 * oneDNN 2.x's (cmake/mparFindOneDNN.cmake accepts only 2.x, so a 3.x installation builds with CBLAS).
 */
#include <dlfcn.h>

#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <type_traits>
#include <unordered_map>
#include <utility>

#include "mpar/backend/types.hpp"  // BatchStrides, BatchExtents
#include "mpar/core/dtype.hpp"
#include "mpar/core/error.hpp"

#include "mpar/backend/host/detail/matmul_types.hpp"  // the operand types, a concept of its own

namespace mpar::host::onednn {

namespace detail {

template <class T>
inline constexpr dnnl_data_type_t data_type_v = std::is_same_v<T, float>  ? dnnl_f32
                                                : std::is_same_v<T, bf16> ? dnnl_bf16
                                                                          : dnnl_f16;

/** Owns one oneDNN C handle (engine, stream, primitive, memory, ...) and destroys it with `Destroy`. */
template <class H, dnnl_status_t (*Destroy)(H)>
class Handle {
 public:
  Handle() = default;
  explicit Handle(H h) : h_(h) {}
  Handle(Handle&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) reset(std::exchange(o.h_, nullptr));
    return *this;
  }
  ~Handle() { reset(nullptr); }
  [[nodiscard]] H get() const { return h_; }
  void reset(H h) {
    if (h_) (void)Destroy(h_);
    h_ = h;
  }

 private:
  H h_ = nullptr;
};

/** Throws naming the call and oneDNN's status unless `st` is success. */
inline void check(dnnl_status_t st, const char* what) {
  if (st != dnnl_success)
    throw config_error(mpar::detail::cat("host gemm (oneDNN): ", what, " failed: ", dnnl_status2str(st)));
}

/** The OpenMP thread-count functions of the running process, or null where oneDNN does not use OpenMP. */
struct OpenMpThreads {
  int (*get)() = nullptr;
  void (*set)(int) = nullptr;
  static const OpenMpThreads& instance() {
    static const OpenMpThreads api = [] {
      OpenMpThreads a;
#if DNNL_CPU_RUNTIME == DNNL_RUNTIME_OMP
      a.get = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "omp_get_max_threads"));
      a.set = reinterpret_cast<void (*)(int)>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
      if (!a.get || !a.set) a = OpenMpThreads{};
#endif
      return a;
    }();
    return api;
  }
};

/** Runs the calling thread's oneDNN work on one thread for its lifetime, then restores the caller's setting. */
class OneThread {
 public:
  OneThread() {
    const auto& omp = OpenMpThreads::instance();
    if (omp.set && (saved_ = omp.get()) != 1) omp.set(1);
  }
  ~OneThread() {
    if (saved_ != 1) OpenMpThreads::instance().set(saved_);
  }
  OneThread(const OneThread&) = delete;
  OneThread& operator=(const OneThread&) = delete;

 private:
  int saved_ = 1;
};

/** Everything that selects a distinct primitive. */
struct MatmulKey {
  std::size_t m, n, k, lda, ldb, ldc;
  bool ta, tb;
  dnnl_data_type_t in;
  float alpha, beta;
  bool bias = false;  ///< an fp32 row vector added to every row of C by the kernel (the matmul's bias operand)
  /// A two-level batch (gemm_batched): its extents and each operand's strides; a level of extent 1 has stride 0.
  BatchExtents batch{};
  BatchStrides sa{}, sb{}, sc{};
  bool operator==(const MatmulKey&) const = default;
};
struct MatmulKeyHash {
  std::size_t operator()(const MatmulKey& key) const noexcept {
    std::size_t h = 0;
    auto mix = [&h](std::uint64_t v) {
      h ^= std::hash<std::uint64_t>{}(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    };
    for (std::size_t v : {key.m, key.n, key.k, key.lda, key.ldb, key.ldc}) mix(v);
    for (std::size_t v : {key.batch.outer, key.batch.inner, key.sa.outer, key.sa.inner, key.sb.outer, key.sb.inner,
                          key.sc.outer, key.sc.inner})
      mix(v);
    mix((std::uint64_t(key.bias) << 2) | (std::uint64_t(key.ta) << 1) | std::uint64_t(key.tb));
    mix(std::uint64_t(key.in));
    mix((std::uint64_t(std::bit_cast<std::uint32_t>(key.alpha)) << 32) | std::bit_cast<std::uint32_t>(key.beta));
    return h;
  }
};

/** A created primitive with its memory objects (their data pointers are set per call), or a note that oneDNN has none. */
struct CachedMatmul {
  bool implemented = false;
  Handle<dnnl_primitive_t, dnnl_primitive_destroy> primitive;
  Handle<dnnl_memory_t, dnnl_memory_destroy> a, b, c, bias;
};

/** The calling thread's CPU engine, stream and primitives. */
class ThreadMatmuls {
 public:
  ThreadMatmuls() {
    dnnl_engine_t e = nullptr;
    check(dnnl_engine_create(&e, dnnl_cpu, 0), "creating the CPU engine");
    engine_.reset(e);
    dnnl_stream_t st = nullptr;
    check(dnnl_stream_create(&st, engine_.get(), dnnl_stream_default_flags), "creating a stream");
    stream_.reset(st);
  }
  ThreadMatmuls(const ThreadMatmuls&) = delete;
  ThreadMatmuls& operator=(const ThreadMatmuls&) = delete;
  ~ThreadMatmuls() { cache_.clear(); }  // primitives and memories before the stream and engine they use

  [[nodiscard]] dnnl_stream_t stream() const { return stream_.get(); }

  /** The cached entry for `key`, creating it (on one thread, see OneThread) on first use. */
  CachedMatmul& get(const MatmulKey& key) {
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
    return cache_.emplace(key, create(key)).first->second;
  }
  [[nodiscard]] std::size_t size() const { return cache_.size(); }

 private:
  CachedMatmul create(const MatmulKey& key) const {
    const auto m = dnnl_dim_t(key.m), n = dnnl_dim_t(key.n), k = dnnl_dim_t(key.k);
    const auto lda = dnnl_dim_t(key.lda), ldb = dnnl_dim_t(key.ldb), ldc = dnnl_dim_t(key.ldc);
    // Row-major operands; a transposed operand is the same memory read with swapped strides. A batched
    // product puts its batch levels of more than one entry in front (oneDNN's matmul takes up to 12
    // dimensions with arbitrary strides), so the whole batch is one primitive execution.
    dnnl_memory_desc_t a_md, b_md, c_md;
    dnnl_dims_t a_dims = {}, b_dims = {}, c_dims = {}, a_str = {}, b_str = {}, c_str = {};
    int nd = 0;
    auto level = [&](std::size_t extent, std::size_t sa, std::size_t sb, std::size_t sc) {
      if (extent <= 1) return;
      a_dims[nd] = b_dims[nd] = c_dims[nd] = dnnl_dim_t(extent);
      a_str[nd] = dnnl_dim_t(sa);
      b_str[nd] = dnnl_dim_t(sb);
      c_str[nd] = dnnl_dim_t(sc);
      ++nd;
    };
    level(key.batch.outer, key.sa.outer, key.sb.outer, key.sc.outer);
    level(key.batch.inner, key.sa.inner, key.sb.inner, key.sc.inner);
    auto matrix = [&](dnnl_dims_t dims, dnnl_dims_t str, dnnl_dim_t rows, dnnl_dim_t cols, bool t, dnnl_dim_t ld) {
      dims[nd] = rows;
      dims[nd + 1] = cols;
      str[nd] = t ? 1 : ld;
      str[nd + 1] = t ? ld : 1;
    };
    matrix(a_dims, a_str, m, k, key.ta, lda);
    matrix(b_dims, b_str, k, n, key.tb, ldb);
    matrix(c_dims, c_str, m, n, false, ldc);
    nd += 2;
    check(dnnl_memory_desc_init_by_strides(&a_md, nd, a_dims, key.in, a_str), "describing A");
    check(dnnl_memory_desc_init_by_strides(&b_md, nd, b_dims, key.in, b_str), "describing B");
    check(dnnl_memory_desc_init_by_strides(&c_md, nd, c_dims, dnnl_f32, c_str), "describing C");
    // The bias ([1, n], broadcast over the rows) is applied by the kernel to the fp32 accumulator before C is
    // written: one pass over C less than a separate bias addition, and the same fp32 sum acc + b.
    dnnl_memory_desc_t bias_md;
    const dnnl_dims_t bias_dims = {1, n}, bias_str = {n, 1};
    if (key.bias)
      check(dnnl_memory_desc_init_by_strides(&bias_md, 2, bias_dims, dnnl_f32, bias_str), "describing the bias");
    dnnl_matmul_desc_t desc;
    check(dnnl_matmul_desc_init(&desc, &a_md, &b_md, key.bias ? &bias_md : nullptr, &c_md), "describing the matmul");
    // C = alpha A B + beta C: alpha as the output scale (a linear eltwise post-op instead makes 2.6 fall
    // back to its reference kernel once a sum follows), beta as a sum post-op reading the old C.
    dnnl_primitive_attr_t attr_raw = nullptr;
    check(dnnl_primitive_attr_create(&attr_raw), "creating attributes");
    Handle<dnnl_primitive_attr_t, dnnl_primitive_attr_destroy> attr(attr_raw);
    if (key.alpha != 1.0f) check(dnnl_primitive_attr_set_output_scales(attr.get(), 1, 0, &key.alpha), "setting alpha");
    if (key.beta != 0.0f) {
      dnnl_post_ops_t ops_raw = nullptr;
      check(dnnl_post_ops_create(&ops_raw), "creating post-ops");
      Handle<dnnl_post_ops_t, dnnl_post_ops_destroy> ops(ops_raw);
      check(dnnl_post_ops_append_sum(ops.get(), key.beta), "setting beta");
      check(dnnl_primitive_attr_set_post_ops(attr.get(), ops.get()), "setting post-ops");
    }
    CachedMatmul entry;
    dnnl_primitive_desc_t pd_raw = nullptr;
    const dnnl_status_t st = dnnl_primitive_desc_create(&pd_raw, &desc, attr.get(), engine_.get(), nullptr);
    // No kernel for these types on this CPU (e.g. bf16 without AVX-512): the caller computes in fp32.
    if (st == dnnl_unimplemented) return entry;
    if (st != dnnl_success)
      throw config_error(mpar::detail::cat("host gemm (oneDNN): creating the matmul m=", key.m, " n=", key.n,
                                           " k=", key.k, " lda=", key.lda, " ldb=", key.ldb, " ldc=", key.ldc,
                                           " batch=", key.batch.outer, "x", key.batch.inner,
                                           " failed: ", dnnl_status2str(st)));
    Handle<dnnl_primitive_desc_t, dnnl_primitive_desc_destroy> pd(pd_raw);
    dnnl_primitive_t prim = nullptr;
    check(dnnl_primitive_create(&prim, pd.get()), "creating the matmul primitive");
    entry.primitive.reset(prim);
    for (auto [md, mem] : {std::pair{&a_md, &entry.a}, {&b_md, &entry.b}, {&c_md, &entry.c}}) {
      dnnl_memory_t raw = nullptr;
      check(dnnl_memory_create(&raw, md, engine_.get(), DNNL_MEMORY_NONE), "creating a memory object");
      mem->reset(raw);
    }
    if (key.bias) {
      dnnl_memory_t raw = nullptr;
      check(dnnl_memory_create(&raw, &bias_md, engine_.get(), DNNL_MEMORY_NONE), "creating the bias memory object");
      entry.bias.reset(raw);
    }
    entry.implemented = true;
    return entry;
  }

  Handle<dnnl_engine_t, dnnl_engine_destroy> engine_;
  Handle<dnnl_stream_t, dnnl_stream_destroy> stream_;
  std::unordered_map<MatmulKey, CachedMatmul, MatmulKeyHash> cache_;
};

inline ThreadMatmuls& this_thread_matmuls() {
  thread_local ThreadMatmuls matmuls;
  return matmuls;
}

}  // namespace detail

/**
 * @brief `C = alpha op(A) op(B) + bias + beta C` with `bias` an fp32 row vector of `n` values added to every
 * row by the matmul kernel itself (no separate pass over C); `bias == nullptr` is `gemm`. Returns false,
 * touching nothing, where oneDNN has no kernel for these types on this CPU.
 */
template <class TIn>
  requires mpar::host::onednn::detail::matmul_types<TIn, float>
bool gemm_bias(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, float alpha, const TIn* a,
               std::size_t lda, const TIn* b, std::size_t ldb, float beta, const float* bias, float* c,
               std::size_t ldc) {
  detail::OneThread one_thread;
  auto& matmuls = detail::this_thread_matmuls();
  auto& entry = matmuls.get({m, n, k, lda, ldb, ldc, ta, tb, detail::data_type_v<TIn>, alpha, beta, bias != nullptr});
  if (!entry.implemented) return false;
  // oneDNN only reads its source operands; the handles are non-const in its interface.
  detail::check(dnnl_memory_set_data_handle(entry.a.get(), const_cast<TIn*>(a)), "setting A");
  detail::check(dnnl_memory_set_data_handle(entry.b.get(), const_cast<TIn*>(b)), "setting B");
  detail::check(dnnl_memory_set_data_handle(entry.c.get(), c), "setting C");
  if (bias) detail::check(dnnl_memory_set_data_handle(entry.bias.get(), const_cast<float*>(bias)), "setting the bias");
  const dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, entry.a.get()},
                                  {DNNL_ARG_WEIGHTS, entry.b.get()},
                                  {DNNL_ARG_DST, entry.c.get()},
                                  {DNNL_ARG_BIAS, entry.bias.get()}};
  detail::check(dnnl_primitive_execute(entry.primitive.get(), matmuls.stream(), bias ? 4 : 3, args),
                "executing the matmul");
  detail::check(dnnl_stream_wait(matmuls.stream()), "waiting for the stream");
  return true;
}

/**
 * @brief Row-major `C[m x n] = alpha op(A) op(B) + beta C` (fp32 C) through the calling thread's cached
 * oneDNN matmul, on one thread. Returns false, touching nothing, when oneDNN has no kernel for these
 * types on this CPU (the caller then computes in fp32); `beta == 0` overwrites C without reading it.
 */
template <class TIn>
  requires mpar::host::onednn::detail::matmul_types<TIn, float>
bool gemm(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, float alpha, const TIn* a, std::size_t lda,
          const TIn* b, std::size_t ldb, float beta, float* c, std::size_t ldc) {
  return gemm_bias(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, static_cast<const float*>(nullptr), c, ldc);
}

/**
 * @brief A two-level batch of row-major GEMMs in ONE matmul execution: for every (i, j) of `batch`,
 * `C_ij = alpha op(A_ij) op(B_ij) + beta C_ij` with `X_ij = x + i * sx.outer + j * sx.inner` (fp32 C).
 * Returns false, touching nothing, where oneDNN has no kernel for these types on this CPU.
 */
template <class TIn>
  requires mpar::host::onednn::detail::matmul_types<TIn, float>
bool gemm_batched(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, float alpha, const TIn* a,
                  std::size_t lda, BatchStrides sa, const TIn* b, std::size_t ldb, BatchStrides sb, float beta,
                  float* c, std::size_t ldc, BatchStrides sc, BatchExtents batch) {
  // A level of one entry has no stride: the same primitive serves whatever the caller passed there.
  if (batch.outer <= 1) sa.outer = sb.outer = sc.outer = 0;
  if (batch.inner <= 1) sa.inner = sb.inner = sc.inner = 0;
  detail::OneThread one_thread;
  auto& matmuls = detail::this_thread_matmuls();
  auto& entry =
      matmuls.get({m, n, k, lda, ldb, ldc, ta, tb, detail::data_type_v<TIn>, alpha, beta, false, batch, sa, sb, sc});
  if (!entry.implemented) return false;
  detail::check(dnnl_memory_set_data_handle(entry.a.get(), const_cast<TIn*>(a)), "setting A");
  detail::check(dnnl_memory_set_data_handle(entry.b.get(), const_cast<TIn*>(b)), "setting B");
  detail::check(dnnl_memory_set_data_handle(entry.c.get(), c), "setting C");
  const dnnl_exec_arg_t args[] = {
      {DNNL_ARG_SRC, entry.a.get()}, {DNNL_ARG_WEIGHTS, entry.b.get()}, {DNNL_ARG_DST, entry.c.get()}};
  detail::check(dnnl_primitive_execute(entry.primitive.get(), matmuls.stream(), 3, args),
                "executing the batched matmul");
  detail::check(dnnl_stream_wait(matmuls.stream()), "waiting for the stream");
  return true;
}

/** @brief How many matmul primitives the calling thread has created (each distinct GEMM signature once). */
inline std::size_t cached_primitives() { return detail::this_thread_matmuls().size(); }

}  // namespace mpar::host::onednn
