#pragma once
/**
 * @file Scaled-dot-product attention through cuDNN 9's backend API (no cudnn-frontend): the dedicated
 * SDPA forward and backward operations (`CUDNN_BACKEND_OPERATION_SDPA_FWD/BWD_DESCRIPTOR`, cuDNN >= 9.13),
 * an execution plan from the heuristics, cached per shape, run with a variant pack on the rank's stream.
 *
 * Layout as in flash_attention.hpp: `q, k, v, o` `[batch_heads, s, d]` row-major, `lse` `[batch_heads, s]`
 * float (the rows' log-sum-exp of the scaled scores, cuDNN's "stats"). cuDNN sees them as
 * `[1, batch_heads, s, d]` and `[1, batch_heads, s, 1]`.
 *
 * What this covers: bf16 and f16 storage, no mask. The 9.x operation has no element-wise causal
 * attribute (only a tile-granular block mask), so causal attention, fp32 and shapes the heuristics give
 * no engine for are not built here: `plan_for` returns nullptr and the caller (gpu::sdpa_forward /
 * sdpa_backward in sdpa.hpp) runs our own kernel instead.
 *
 * Host code only (cudnn.h, the CUDA runtime): plain C++ may include it. Compiled when MPAR_HAVE_CUDNN
 * is defined (cmake/mparCuda.cmake finds cudnn.h and libcudnn).
 */
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "mpar/backend/gpu/context.hpp"
#include "mpar/backend/gpu/cuda_error.hpp"
#include "mpar/backend/gpu/memory.hpp"
#include "mpar/backend/gpu/runtime.hpp"  // the CUDA runtime and cuDNN, or their emulation
#include "mpar/core/dtype.hpp"

#if CUDNN_VERSION < 91300
#error "mpar/backend/gpu/cudnn_attention.hpp needs cuDNN >= 9.13 (the SDPA backend operations)"
#endif

namespace mpar::gpu::cudnn {

/** Throws cuda_error naming the cuDNN call and cuDNN's own message for the status. */
inline void check(cudnnStatus_t st, const char* what) {
  if (st != CUDNN_STATUS_SUCCESS)
    throw cuda_error(std::string(what) + " failed: " + cudnnGetErrorString(st) + " (cuDNN status " +
                     std::to_string(int(st)) + ")");
}

namespace detail {

/** One backend descriptor (RAII). */
class Desc {
 public:
  explicit Desc(cudnnBackendDescriptorType_t type) {
    check(cudnnBackendCreateDescriptor(type, &d_), "cudnnBackendCreateDescriptor");
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  ~Desc() {
    if (d_) (void)cudnnBackendDestroyDescriptor(d_);
  }
  [[nodiscard]] cudnnBackendDescriptor_t get() const { return d_; }
  /** Sets an attribute; a refusal throws naming it (a programming error in the graph below). */
  void set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, std::int64_t count, const void* value) {
    check(cudnnBackendSetAttribute(d_, name, type, count, value), "cudnnBackendSetAttribute");
  }
  void set_desc(cudnnBackendAttributeName_t name, const Desc& other) {
    cudnnBackendDescriptor_t o = other.get();
    set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &o);
  }
  void finalize() { check(cudnnBackendFinalize(d_), "cudnnBackendFinalize"); }
  /** Finalize that reports failure instead of throwing (an engine config that does not apply). */
  [[nodiscard]] bool try_finalize() { return cudnnBackendFinalize(d_) == CUDNN_STATUS_SUCCESS; }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

template <class T>
constexpr cudnnDataType_t data_type() {
  if constexpr (std::is_same_v<T, bf16>)
    return CUDNN_DATA_BFLOAT16;
  else if constexpr (std::is_same_v<T, f16>)
    return CUDNN_DATA_HALF;
  else
    return CUDNN_DATA_FLOAT;
}

/** A 4-d tensor descriptor `[1, bh, rows, cols]`, row-major; `by_value`: a host scalar in the variant pack. */
inline std::unique_ptr<Desc> tensor(std::int64_t uid, cudnnDataType_t type, std::int64_t bh, std::int64_t rows,
                                    std::int64_t cols, bool by_value = false) {
  auto t = std::make_unique<Desc>(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const std::array<std::int64_t, 4> dims{1, bh, rows, cols};
  const std::array<std::int64_t, 4> strides{bh * rows * cols, rows * cols, cols, 1};
  const std::int64_t align = 16;
  t->set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
  t->set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data());
  t->set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data());
  t->set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
  t->set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
  if (by_value) {
    const bool yes = true;
    t->set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &yes);
  }
  t->finalize();
  return t;
}

/** Tensor uids of the variant pack. */
enum Uid : std::int64_t { kQ = 1, kK, kV, kO, kStats, kScale, kDO, kDQ, kDK, kDV };

}  // namespace detail

/** @brief A finalized execution plan and the descriptors it references (kept alive with it). */
struct Plan {
  std::vector<std::unique_ptr<detail::Desc>> keep;  ///< tensors, operation, graph, heuristics, configs
  std::unique_ptr<detail::Desc> plan;
  std::int64_t workspace = 0;
};

/** @brief Which attention, for the plan cache. */
struct PlanKey {
  bool backward;
  cudnnDataType_t type;
  std::int64_t bh, s, d;
  friend bool operator<(const PlanKey& a, const PlanKey& b) {
    return std::tie(a.backward, a.type, a.bh, a.s, a.d) < std::tie(b.backward, b.type, b.bh, b.s, b.d);
  }
};

/**
 * @brief The thread's cuDNN state: a handle on its device (set to the call's stream before each run)
 * and its plans by shape. A shape the heuristics give no engine for is cached as nullptr, so it is
 * looked up once.
 */
class Context {
 public:
  Context() = default;
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  ~Context() {
    plans_.clear();
    if (handle_) (void)cudnnDestroy(handle_);
  }
  [[nodiscard]] cudnnHandle_t handle() {
    if (!handle_) {
      (void)this_thread().stream();  // binds the thread's device first
      check(cudnnCreate(&handle_), "cudnnCreate");
    }
    return handle_;
  }
  /** The plan for `key`, built on first use; nullptr when cuDNN has no engine for it. */
  const Plan* plan_for(const PlanKey& key) {
    auto it = plans_.find(key);
    if (it == plans_.end()) it = plans_.emplace(key, build(key)).first;
    return it->second.get();
  }

 private:
  std::unique_ptr<Plan> build(const PlanKey& k) {
    using namespace detail;
    auto p = std::make_unique<Plan>();
    auto add = [&](std::unique_ptr<Desc> d) -> Desc& {
      p->keep.push_back(std::move(d));
      return *p->keep.back();
    };
    Desc& q = add(tensor(kQ, k.type, k.bh, k.s, k.d));
    Desc& kk = add(tensor(kK, k.type, k.bh, k.s, k.d));
    Desc& v = add(tensor(kV, k.type, k.bh, k.s, k.d));
    Desc& o = add(tensor(kO, k.type, k.bh, k.s, k.d));
    Desc& stats = add(tensor(kStats, CUDNN_DATA_FLOAT, k.bh, k.s, 1));
    Desc& scale = add(tensor(kScale, CUDNN_DATA_FLOAT, 1, 1, 1, /*by_value=*/true));
    Desc& op = add(std::make_unique<Desc>(k.backward ? CUDNN_BACKEND_OPERATION_SDPA_BWD_DESCRIPTOR
                                                     : CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR));
    if (!k.backward) {
      op.set_desc(CUDNN_ATTR_OPERATION_SDPA_FWD_QDESC, q);
      op.set_desc(CUDNN_ATTR_OPERATION_SDPA_FWD_KDESC, kk);
      op.set_desc(CUDNN_ATTR_OPERATION_SDPA_FWD_VDESC, v);
      op.set_desc(CUDNN_ATTR_OPERATION_SDPA_FWD_ODESC, o);
      op.set_desc(CUDNN_ATTR_OPERATION_SDPA_FWD_STATSDESC, stats);
      op.set_desc(CUDNN_ATTR_OPERATION_SDPA_FWD_SCALEDESC, scale);
    } else {
      Desc& dout = add(tensor(kDO, k.type, k.bh, k.s, k.d));
      Desc& dq = add(tensor(kDQ, k.type, k.bh, k.s, k.d));
      Desc& dk = add(tensor(kDK, k.type, k.bh, k.s, k.d));
      Desc& dv = add(tensor(kDV, k.type, k.bh, k.s, k.d));
      op.set_desc(CUDNN_ATTR_OPERATION_SDPA_BWD_QDESC, q);
      op.set_desc(CUDNN_ATTR_OPERATION_SDPA_BWD_KDESC, kk);
      op.set_desc(CUDNN_ATTR_OPERATION_SDPA_BWD_VDESC, v);
      op.set_desc(CUDNN_ATTR_OPERATION_SDPA_BWD_ODESC, o);
      op.set_desc(CUDNN_ATTR_OPERATION_SDPA_BWD_DODDESC, dout);
      op.set_desc(CUDNN_ATTR_OPERATION_SDPA_BWD_STATSDESC, stats);
      op.set_desc(CUDNN_ATTR_OPERATION_SDPA_BWD_SCALEDESC, scale);
      op.set_desc(CUDNN_ATTR_OPERATION_SDPA_BWD_DQDESC, dq);
      op.set_desc(CUDNN_ATTR_OPERATION_SDPA_BWD_DKDESC, dk);
      op.set_desc(CUDNN_ATTR_OPERATION_SDPA_BWD_DVDESC, dv);
    }
    // An operation this cuDNN build or this device cannot express is "no engine", not an error.
    if (!op.try_finalize()) return nullptr;

    Desc& graph = add(std::make_unique<Desc>(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR));
    cudnnHandle_t h = handle();
    graph.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
    graph.set_desc(CUDNN_ATTR_OPERATIONGRAPH_OPS, op);
    if (!graph.try_finalize()) return nullptr;

    Desc& heur = add(std::make_unique<Desc>(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR));
    heur.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
    const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    heur.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    if (!heur.try_finalize()) return nullptr;

    // The heuristics fill engine configs we create; try them best first until one finalizes as a plan.
    constexpr std::int64_t max_configs = 8;
    std::vector<std::unique_ptr<Desc>> cfgs;
    std::vector<cudnnBackendDescriptor_t> raw;
    for (std::int64_t i = 0; i < max_configs; ++i) {
      cfgs.push_back(std::make_unique<Desc>(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
      raw.push_back(cfgs.back()->get());
    }
    std::int64_t found = 0;
    if (cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, max_configs,
                                 &found, raw.data()) != CUDNN_STATUS_SUCCESS)
      return nullptr;
    for (std::int64_t i = 0; i < found && i < max_configs; ++i) {
      auto plan = std::make_unique<Desc>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      plan->set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
      plan->set_desc(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, *cfgs[std::size_t(i)]);
      if (!plan->try_finalize()) continue;
      std::int64_t count = 0;
      check(cudnnBackendGetAttribute(plan->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &count,
                                     &p->workspace),
            "cudnnBackendGetAttribute(EXECUTION_PLAN_WORKSPACE_SIZE)");
      p->plan = std::move(plan);
      for (auto& c : cfgs) p->keep.push_back(std::move(c));
      return p;
    }
    return nullptr;
  }

  cudnnHandle_t handle_ = nullptr;
  std::map<PlanKey, std::unique_ptr<Plan>> plans_;
};

/** The calling thread's cuDNN context (handle and plan cache), created on first use. */
[[nodiscard]] inline Context& this_thread_context() {
  thread_local Context ctx;
  return ctx;
}

/**
 * Runs `plan` with the given (uid, pointer) pairs on `stream`; the workspace is device memory allocated
 * and freed in stream order (no wait).
 */
inline void execute(const Plan& plan, std::vector<std::int64_t> uids, std::vector<void*> ptrs, cudaStream_t stream) {
  Context& ctx = this_thread_context();
  check(cudnnSetStream(ctx.handle(), stream), "cudnnSetStream");
  DeviceBuffer<std::byte> ws(std::size_t(plan.workspace), stream);
  detail::Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, std::int64_t(uids.size()), uids.data());
  pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, std::int64_t(ptrs.size()), ptrs.data());
  void* w = plan.workspace > 0 ? static_cast<void*>(ws.data()) : nullptr;
  pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &w);
  pack.finalize();
  check(cudnnBackendExecute(ctx.handle(), plan.plan->get(), pack.get()), "cudnnBackendExecute(SDPA)");
}

/** True when cuDNN's SDPA can take this call: 16-bit storage, no causal mask, 16-byte aligned rows. */
template <class T>
[[nodiscard]] bool applicable(std::size_t d, bool causal, std::initializer_list<const void*> ptrs) {
  if constexpr (!(std::is_same_v<T, bf16> || std::is_same_v<T, f16>)) {
    (void)d, (void)causal, (void)ptrs;
    return false;
  } else {
    if (causal || d % 8 != 0) return false;
    for (const void* p : ptrs)
      if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0) return false;
    return true;
  }
}

/**
 * @brief cuDNN's fused SDPA forward: `o` and `lse` as gpu::flash_attention_forward writes them. Returns
 * false (nothing enqueued) when cuDNN cannot take the call; the caller then runs our kernel.
 */
template <class T>
bool sdpa_forward(std::size_t bh, std::size_t s, std::size_t d, const T* q, const T* k, const T* v, T* o, float* lse,
                  float scale, bool causal, cudaStream_t stream) {
  if (!applicable<T>(d, causal, {q, k, v, o, lse})) return false;
  const Plan* plan = this_thread_context().plan_for(
      {false, detail::data_type<T>(), std::int64_t(bh), std::int64_t(s), std::int64_t(d)});
  if (!plan) return false;
  using namespace detail;
  execute(*plan, {kQ, kK, kV, kO, kStats, kScale},
          {const_cast<T*>(q), const_cast<T*>(k), const_cast<T*>(v), o, lse, &scale}, stream);
  return true;
}

/** @brief cuDNN's fused SDPA backward (dq, dk, dv overwritten); false when it cannot take the call. */
template <class T>
bool sdpa_backward(std::size_t bh, std::size_t s, std::size_t d, const T* q, const T* k, const T* v, const T* o,
                   const float* lse, const T* dout, T* dq, T* dk, T* dv, float scale, bool causal,
                   cudaStream_t stream) {
  if (!applicable<T>(d, causal, {q, k, v, o, lse, dout, dq, dk, dv})) return false;
  const Plan* plan = this_thread_context().plan_for(
      {true, detail::data_type<T>(), std::int64_t(bh), std::int64_t(s), std::int64_t(d)});
  if (!plan) return false;
  using namespace detail;
  execute(*plan, {kQ, kK, kV, kO, kDO, kStats, kScale, kDQ, kDK, kDV},
          {const_cast<T*>(q), const_cast<T*>(k), const_cast<T*>(v), const_cast<T*>(o), const_cast<T*>(dout),
           const_cast<float*>(lse), &scale, dq, dk, dv},
          stream);
  return true;
}

}  // namespace mpar::gpu::cudnn
