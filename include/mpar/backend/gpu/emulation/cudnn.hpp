#pragma once
/**
 * @file cuDNN's backend API under the emulation (MPAR_CUDA_EMULATION): the descriptors, heuristics, execution plans
 * and variant packs that mpar's SDPA path builds (backend/gpu/cudnn_attention.hpp), and the SDPA forward and
 * backward operations they describe, run as naive attention in double.
 *
 * Descriptors keep their attributes as set and check them at finalize: a tensor needs its type, dimensions, strides
 * and uid; an SDPA operation needs finalized 4-d tensors whose shapes agree (Q, K, V, O, dO, dQ, dK, dV
 * `[n, h, s, d]`, stats `[n, h, s, 1]`, the scale a by-value scalar); the heuristics give one engine configuration;
 * a plan has no workspace. Execution reads every tensor through its own dimensions and strides from the variant
 * pack's pointers (device memory, each checked to hold its tensor; the scale a host float), so a wrong stride, uid
 * or pointer shows as a wrong result or an error. The operation's numerics are the textbook ones in double: stats
 * are the rows' log-sum-exp of the scaled scores, and backward uses the given stats (not recomputed ones), so a
 * forward and backward that disagree on their convention fail. What only a GPU can tell: which shapes cuDNN's
 * real heuristics accept, its kernels' rounding and speed.
 */
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "mpar/backend/gpu/emulation/graphs.hpp"
#include "mpar/backend/gpu/emulation/memory.hpp"
#include "mpar/core/dtype.hpp"

#define CUDNN_VERSION 91900

enum cudnnStatus_t : int {
  CUDNN_STATUS_SUCCESS = 0,
  CUDNN_STATUS_NOT_INITIALIZED = 1001,
  CUDNN_STATUS_BAD_PARAM = 2000,
  CUDNN_STATUS_NOT_SUPPORTED = 3000,
  CUDNN_STATUS_EXECUTION_FAILED = 5000,
};
enum cudnnDataType_t : int { CUDNN_DATA_FLOAT = 0, CUDNN_DATA_HALF = 2, CUDNN_DATA_BFLOAT16 = 9 };
enum cudnnBackendHeurMode_t : int { CUDNN_HEUR_MODE_A = 1 };
enum cudnnBackendDescriptorType_t : int {
  CUDNN_BACKEND_ENGINECFG_DESCRIPTOR,
  CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR,
  CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR,
  CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR,
  CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR,
  CUDNN_BACKEND_OPERATION_SDPA_BWD_DESCRIPTOR,
  CUDNN_BACKEND_TENSOR_DESCRIPTOR,
  CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR,
};
enum cudnnBackendAttributeType_t : int {
  CUDNN_TYPE_HANDLE,
  CUDNN_TYPE_DATA_TYPE,
  CUDNN_TYPE_BOOLEAN,
  CUDNN_TYPE_INT64,
  CUDNN_TYPE_VOID_PTR,
  CUDNN_TYPE_HEUR_MODE,
  CUDNN_TYPE_BACKEND_DESCRIPTOR,
};
enum cudnnBackendAttributeName_t : int {
  CUDNN_ATTR_TENSOR_DATA_TYPE,
  CUDNN_ATTR_TENSOR_DIMENSIONS,
  CUDNN_ATTR_TENSOR_STRIDES,
  CUDNN_ATTR_TENSOR_UNIQUE_ID,
  CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT,
  CUDNN_ATTR_TENSOR_IS_BY_VALUE,
  CUDNN_ATTR_OPERATION_SDPA_FWD_QDESC,
  CUDNN_ATTR_OPERATION_SDPA_FWD_KDESC,
  CUDNN_ATTR_OPERATION_SDPA_FWD_VDESC,
  CUDNN_ATTR_OPERATION_SDPA_FWD_ODESC,
  CUDNN_ATTR_OPERATION_SDPA_FWD_STATSDESC,
  CUDNN_ATTR_OPERATION_SDPA_FWD_SCALEDESC,
  CUDNN_ATTR_OPERATION_SDPA_BWD_QDESC,
  CUDNN_ATTR_OPERATION_SDPA_BWD_KDESC,
  CUDNN_ATTR_OPERATION_SDPA_BWD_VDESC,
  CUDNN_ATTR_OPERATION_SDPA_BWD_ODESC,
  CUDNN_ATTR_OPERATION_SDPA_BWD_DODDESC,
  CUDNN_ATTR_OPERATION_SDPA_BWD_STATSDESC,
  CUDNN_ATTR_OPERATION_SDPA_BWD_SCALEDESC,
  CUDNN_ATTR_OPERATION_SDPA_BWD_DQDESC,
  CUDNN_ATTR_OPERATION_SDPA_BWD_DKDESC,
  CUDNN_ATTR_OPERATION_SDPA_BWD_DVDESC,
  CUDNN_ATTR_OPERATIONGRAPH_HANDLE,
  CUDNN_ATTR_OPERATIONGRAPH_OPS,
  CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
  CUDNN_ATTR_ENGINEHEUR_MODE,
  CUDNN_ATTR_ENGINEHEUR_RESULTS,
  CUDNN_ATTR_EXECUTION_PLAN_HANDLE,
  CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
  CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
  CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS,
  CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
  CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
};

struct cudnnContext {
  cudaStream_t stream = nullptr;
};
using cudnnHandle_t = cudnnContext*;

/** An emulated backend descriptor: its type, its attributes as set, and whether it was finalized. */
struct cudnnBackendDescriptor {
  cudnnBackendDescriptorType_t type;
  bool finalized = false;
  std::map<int, std::vector<std::int64_t>> ints;              ///< INT64, BOOLEAN, DATA_TYPE, HEUR_MODE values
  std::map<int, std::vector<cudnnBackendDescriptor*>> descs;  ///< BACKEND_DESCRIPTOR values
  std::map<int, std::vector<void*>> pointers;                 ///< VOID_PTR and HANDLE values
};
using cudnnBackendDescriptor_t = cudnnBackendDescriptor*;

inline const char* cudnnGetErrorString(cudnnStatus_t s) {
  switch (s) {
    case CUDNN_STATUS_SUCCESS:
      return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_NOT_INITIALIZED:
      return "CUDNN_STATUS_NOT_INITIALIZED";
    case CUDNN_STATUS_BAD_PARAM:
      return "CUDNN_STATUS_BAD_PARAM";
    case CUDNN_STATUS_NOT_SUPPORTED:
      return "CUDNN_STATUS_NOT_SUPPORTED";
    case CUDNN_STATUS_EXECUTION_FAILED:
      return "CUDNN_STATUS_EXECUTION_FAILED";
  }
  return "CUDNN_STATUS_UNKNOWN";
}
inline cudnnStatus_t cudnnCreate(cudnnHandle_t* h) {
  if (h == nullptr) return CUDNN_STATUS_BAD_PARAM;
  *h = new cudnnContext;
  return CUDNN_STATUS_SUCCESS;
}
inline cudnnStatus_t cudnnDestroy(cudnnHandle_t h) {
  delete h;
  return CUDNN_STATUS_SUCCESS;
}
inline cudnnStatus_t cudnnSetStream(cudnnHandle_t h, cudaStream_t s) {
  if (h == nullptr) return CUDNN_STATUS_NOT_INITIALIZED;
  h->stream = s;
  return CUDNN_STATUS_SUCCESS;
}
inline cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t type, cudnnBackendDescriptor_t* d) {
  if (d == nullptr) return CUDNN_STATUS_BAD_PARAM;
  *d = new cudnnBackendDescriptor{type};
  return CUDNN_STATUS_SUCCESS;
}
inline cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t d) {
  delete d;
  return CUDNN_STATUS_SUCCESS;
}
/** Keeps the value as given; a finalized descriptor is read-only, as in cuDNN. */
inline cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                                              cudnnBackendAttributeType_t type, std::int64_t count, const void* value) {
  if (d == nullptr || d->finalized || count < 0 || (count > 0 && value == nullptr)) return CUDNN_STATUS_BAD_PARAM;
  const auto n = std::size_t(count);
  switch (type) {
    case CUDNN_TYPE_INT64: {
      const auto* v = static_cast<const std::int64_t*>(value);
      d->ints[name].assign(v, v + n);
      break;
    }
    case CUDNN_TYPE_BOOLEAN: {
      const auto* v = static_cast<const bool*>(value);
      d->ints[name].assign(v, v + n);
      break;
    }
    case CUDNN_TYPE_DATA_TYPE: {
      const auto* v = static_cast<const cudnnDataType_t*>(value);
      d->ints[name].assign(v, v + n);
      break;
    }
    case CUDNN_TYPE_HEUR_MODE: {
      const auto* v = static_cast<const cudnnBackendHeurMode_t*>(value);
      d->ints[name].assign(v, v + n);
      break;
    }
    case CUDNN_TYPE_BACKEND_DESCRIPTOR: {
      const auto* v = static_cast<const cudnnBackendDescriptor_t*>(value);
      d->descs[name].assign(v, v + n);
      break;
    }
    case CUDNN_TYPE_HANDLE:
    case CUDNN_TYPE_VOID_PTR: {
      void* const* v = static_cast<void* const*>(value);
      d->pointers[name].assign(v, v + n);
      break;
    }
  }
  return CUDNN_STATUS_SUCCESS;
}

namespace mpar::gpu::emulation::cudnn {

/** The roles of an SDPA operation's tensors, forward then backward attribute names. */
struct Roles {
  cudnnBackendAttributeName_t q, k, v, o, stats, scale;
};
inline constexpr Roles forward_roles{CUDNN_ATTR_OPERATION_SDPA_FWD_QDESC,     CUDNN_ATTR_OPERATION_SDPA_FWD_KDESC,
                                     CUDNN_ATTR_OPERATION_SDPA_FWD_VDESC,     CUDNN_ATTR_OPERATION_SDPA_FWD_ODESC,
                                     CUDNN_ATTR_OPERATION_SDPA_FWD_STATSDESC, CUDNN_ATTR_OPERATION_SDPA_FWD_SCALEDESC};
inline constexpr Roles backward_roles{CUDNN_ATTR_OPERATION_SDPA_BWD_QDESC,     CUDNN_ATTR_OPERATION_SDPA_BWD_KDESC,
                                      CUDNN_ATTR_OPERATION_SDPA_BWD_VDESC,     CUDNN_ATTR_OPERATION_SDPA_BWD_ODESC,
                                      CUDNN_ATTR_OPERATION_SDPA_BWD_STATSDESC, CUDNN_ATTR_OPERATION_SDPA_BWD_SCALEDESC};

/** The single descriptor set for `name`, or null. */
inline cudnnBackendDescriptor_t one(cudnnBackendDescriptor_t d, int name) {
  auto it = d->descs.find(name);
  return it == d->descs.end() || it->second.size() != 1 ? nullptr : it->second[0];
}
/** A finalized 4-d tensor's dimensions (empty when `t` is none). */
inline std::vector<std::int64_t> dims_of(cudnnBackendDescriptor_t t) {
  return t && t->type == CUDNN_BACKEND_TENSOR_DESCRIPTOR && t->finalized ? t->ints[CUDNN_ATTR_TENSOR_DIMENSIONS]
                                                                         : std::vector<std::int64_t>{};
}

/** Whether an SDPA operation's tensors are all there, finalized, 4-d and of agreeing shapes. */
inline bool sdpa_well_formed(cudnnBackendDescriptor_t op) {
  const bool backward = op->type == CUDNN_BACKEND_OPERATION_SDPA_BWD_DESCRIPTOR;
  const Roles& r = backward ? backward_roles : forward_roles;
  const auto q = dims_of(one(op, r.q));
  if (q.size() != 4) return false;
  std::vector<int> same{r.k, r.v, r.o};
  if (backward)
    same.insert(same.end(), {CUDNN_ATTR_OPERATION_SDPA_BWD_DODDESC, CUDNN_ATTR_OPERATION_SDPA_BWD_DQDESC,
                             CUDNN_ATTR_OPERATION_SDPA_BWD_DKDESC, CUDNN_ATTR_OPERATION_SDPA_BWD_DVDESC});
  for (int role : same)
    if (dims_of(one(op, role)) != q) return false;
  if (dims_of(one(op, r.stats)) != std::vector<std::int64_t>{q[0], q[1], q[2], 1}) return false;
  const cudnnBackendDescriptor_t scale = one(op, r.scale);
  return dims_of(scale).size() == 4 && !scale->ints[CUDNN_ATTR_TENSOR_IS_BY_VALUE].empty() &&
         scale->ints[CUDNN_ATTR_TENSOR_IS_BY_VALUE][0] != 0;
}

/** A tensor of the variant pack: where its elements are and how they are laid out. */
struct Bound {
  unsigned char* base = nullptr;  ///< the readable view of its device memory
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  std::vector<std::int64_t> dims, strides;
  [[nodiscard]] std::size_t at(std::int64_t n, std::int64_t h, std::int64_t i, std::int64_t j) const {
    return std::size_t(n * strides[0] + h * strides[1] + i * strides[2] + j * strides[3]);
  }
  [[nodiscard]] double get(std::size_t e) const {
    switch (type) {
      case CUDNN_DATA_HALF:
        return double(float(f16::from_bits(reinterpret_cast<const std::uint16_t*>(base)[e])));
      case CUDNN_DATA_BFLOAT16:
        return double(float(bf16::from_bits(reinterpret_cast<const std::uint16_t*>(base)[e])));
      case CUDNN_DATA_FLOAT:
        break;
    }
    return double(reinterpret_cast<const float*>(base)[e]);
  }
  void put(std::size_t e, double v) const {
    switch (type) {
      case CUDNN_DATA_HALF:
        reinterpret_cast<std::uint16_t*>(base)[e] = f16(float(v)).bits;
        return;
      case CUDNN_DATA_BFLOAT16:
        reinterpret_cast<std::uint16_t*>(base)[e] = bf16(float(v)).bits;
        return;
      case CUDNN_DATA_FLOAT:
        break;
    }
    reinterpret_cast<float*>(base)[e] = float(v);
  }
};

/** Binds the tensor `t` to its pointer in the pack; false when the pointer is missing or does not hold it. */
inline bool bind(cudnnBackendDescriptor_t t, const std::map<std::int64_t, void*>& pack, Bound* out) {
  auto it = pack.find(t->ints[CUDNN_ATTR_TENSOR_UNIQUE_ID].at(0));
  if (it == pack.end()) return false;
  out->type = cudnnDataType_t(t->ints[CUDNN_ATTR_TENSOR_DATA_TYPE].at(0));
  out->dims = t->ints[CUDNN_ATTR_TENSOR_DIMENSIONS];
  out->strides = t->ints[CUDNN_ATTR_TENSOR_STRIDES];
  if (out->strides.size() != 4) return false;
  std::size_t last = 0;  // the farthest element, in elements
  for (std::size_t a = 0; a < 4; ++a) last += std::size_t((out->dims[a] - 1) * out->strides[a]);
  const std::size_t bytes = (last + 1) * (out->type == CUDNN_DATA_FLOAT ? 4 : 2);
  if (!DeviceAllocations::instance().covers(it->second, bytes)) return false;
  out->base = static_cast<unsigned char*>(device_view(it->second));
  return true;
}

/** softmax(scale · q kᵀ) v per (n, h) in double; `stats` the rows' log-sum-exp of the scaled scores. */
inline void sdpa_forward(const Bound& q, const Bound& k, const Bound& v, const Bound& o, const Bound& stats,
                         double scale) {
  const std::int64_t s = q.dims[2], d = q.dims[3];
  std::vector<double> p(static_cast<std::size_t>(s));
  for (std::int64_t n = 0; n < q.dims[0]; ++n)
    for (std::int64_t h = 0; h < q.dims[1]; ++h)
      for (std::int64_t i = 0; i < s; ++i) {
        double mx = -INFINITY;
        for (std::int64_t j = 0; j < s; ++j) {
          double x = 0;
          for (std::int64_t c = 0; c < d; ++c) x += q.get(q.at(n, h, i, c)) * k.get(k.at(n, h, j, c));
          mx = std::max(mx, p[std::size_t(j)] = scale * x);
        }
        double sum = 0;
        for (std::int64_t j = 0; j < s; ++j) sum += std::exp(p[std::size_t(j)] - mx);
        const double lse = mx + std::log(sum);
        stats.put(stats.at(n, h, i, 0), lse);
        for (std::int64_t c = 0; c < d; ++c) {
          double acc = 0;
          for (std::int64_t j = 0; j < s; ++j) acc += std::exp(p[std::size_t(j)] - lse) * v.get(v.at(n, h, j, c));
          o.put(o.at(n, h, i, c), acc);
        }
      }
}

/** The textbook backward with the probabilities from the given stats: P = exp(scale · q kᵀ − stats). */
inline void sdpa_backward(const Bound& q, const Bound& k, const Bound& v, const Bound& o, const Bound& dout,
                          const Bound& stats, const Bound& dq, const Bound& dk, const Bound& dv, double scale) {
  const std::int64_t s = q.dims[2], d = q.dims[3];
  const auto us = std::size_t(s), ud = std::size_t(d);
  std::vector<double> p(us * us), ds(us * us);
  for (std::int64_t n = 0; n < q.dims[0]; ++n)
    for (std::int64_t h = 0; h < q.dims[1]; ++h) {
      for (std::int64_t i = 0; i < s; ++i) {
        double delta = 0;  // rowsum(dO ∘ O)
        for (std::int64_t c = 0; c < d; ++c) delta += dout.get(dout.at(n, h, i, c)) * o.get(o.at(n, h, i, c));
        const double lse = stats.get(stats.at(n, h, i, 0));
        for (std::int64_t j = 0; j < s; ++j) {
          double x = 0, dp = 0;
          for (std::int64_t c = 0; c < d; ++c) {
            x += q.get(q.at(n, h, i, c)) * k.get(k.at(n, h, j, c));
            dp += dout.get(dout.at(n, h, i, c)) * v.get(v.at(n, h, j, c));
          }
          const double pij = std::exp(scale * x - lse);
          p[std::size_t(i) * us + std::size_t(j)] = pij;
          ds[std::size_t(i) * us + std::size_t(j)] = pij * (dp - delta);
        }
      }
      std::vector<double> gq(us * ud, 0.0), gk(us * ud, 0.0), gv(us * ud, 0.0);
      for (std::size_t i = 0; i < us; ++i)
        for (std::size_t j = 0; j < us; ++j)
          for (std::size_t c = 0; c < ud; ++c) {
            const auto si = std::int64_t(i), sj = std::int64_t(j), sc = std::int64_t(c);
            gq[i * ud + c] += scale * ds[i * us + j] * k.get(k.at(n, h, sj, sc));
            gk[j * ud + c] += scale * ds[i * us + j] * q.get(q.at(n, h, si, sc));
            gv[j * ud + c] += p[i * us + j] * dout.get(dout.at(n, h, si, sc));
          }
      for (std::size_t i = 0; i < us; ++i)
        for (std::size_t c = 0; c < ud; ++c) {
          const auto si = std::int64_t(i), sc = std::int64_t(c);
          dq.put(dq.at(n, h, si, sc), gq[i * ud + c]);
          dk.put(dk.at(n, h, si, sc), gk[i * ud + c]);
          dv.put(dv.at(n, h, si, sc), gv[i * ud + c]);
        }
    }
}

}  // namespace mpar::gpu::emulation::cudnn

/** Checks what each descriptor type needs, as cuDNN does before a descriptor can be used. */
inline cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t d) {
  namespace e = ::mpar::gpu::emulation::cudnn;
  if (d == nullptr || d->finalized) return CUDNN_STATUS_BAD_PARAM;
  bool ok = true;
  switch (d->type) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR: {
      const auto& dims = d->ints[CUDNN_ATTR_TENSOR_DIMENSIONS];
      ok = d->ints[CUDNN_ATTR_TENSOR_DATA_TYPE].size() == 1 && d->ints[CUDNN_ATTR_TENSOR_UNIQUE_ID].size() == 1 &&
           !dims.empty() && d->ints[CUDNN_ATTR_TENSOR_STRIDES].size() == dims.size();
      for (std::int64_t x : dims) ok = ok && x > 0;
      break;
    }
    case CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_SDPA_BWD_DESCRIPTOR:
      ok = e::sdpa_well_formed(d);
      break;
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR: {
      const auto& ops = d->descs[CUDNN_ATTR_OPERATIONGRAPH_OPS];
      ok = d->pointers[CUDNN_ATTR_OPERATIONGRAPH_HANDLE].size() == 1 && ops.size() == 1 && ops[0]->finalized;
      break;
    }
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR: {
      const cudnnBackendDescriptor_t g = e::one(d, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH);
      ok = g && g->finalized && d->ints[CUDNN_ATTR_ENGINEHEUR_MODE].size() == 1;
      break;
    }
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR:
      ok = e::one(d, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH) != nullptr;  // filled by the heuristics
      break;
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR: {
      const cudnnBackendDescriptor_t cfg = e::one(d, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG);
      ok = cfg && cfg->finalized && d->pointers[CUDNN_ATTR_EXECUTION_PLAN_HANDLE].size() == 1;
      break;
    }
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR:
      ok = d->ints[CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS].size() ==
           d->pointers[CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS].size();
      break;
  }
  if (!ok) return CUDNN_STATUS_BAD_PARAM;
  d->finalized = true;
  return CUDNN_STATUS_SUCCESS;
}

/** The heuristics' results (one engine configuration, filled into the caller's first descriptor) and plan sizes. */
inline cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                                              cudnnBackendAttributeType_t type, std::int64_t requested,
                                              std::int64_t* count, void* out) {
  if (d == nullptr || !d->finalized || count == nullptr || out == nullptr) return CUDNN_STATUS_BAD_PARAM;
  if (d->type == CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR && name == CUDNN_ATTR_ENGINEHEUR_RESULTS &&
      type == CUDNN_TYPE_BACKEND_DESCRIPTOR) {
    if (requested < 1) return CUDNN_STATUS_BAD_PARAM;
    cudnnBackendDescriptor_t cfg = static_cast<cudnnBackendDescriptor_t*>(out)[0];
    if (cfg == nullptr || cfg->type != CUDNN_BACKEND_ENGINECFG_DESCRIPTOR) return CUDNN_STATUS_BAD_PARAM;
    cfg->descs[CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH] = {
        ::mpar::gpu::emulation::cudnn::one(d, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH)};
    cfg->finalized = true;
    *count = 1;
    return CUDNN_STATUS_SUCCESS;
  }
  if (d->type == CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR && name == CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE &&
      type == CUDNN_TYPE_INT64 && requested >= 1) {
    *static_cast<std::int64_t*>(out) = 0;
    *count = 1;
    return CUDNN_STATUS_SUCCESS;
  }
  return CUDNN_STATUS_NOT_SUPPORTED;
}

/** Runs the plan's SDPA operation on the handle's stream with the pack's tensors (stream-ordered, capturable). */
inline cudnnStatus_t cudnnBackendExecute(cudnnHandle_t h, cudnnBackendDescriptor_t plan,
                                         cudnnBackendDescriptor_t pack) {
  namespace e = ::mpar::gpu::emulation::cudnn;
  if (h == nullptr || plan == nullptr || pack == nullptr || !plan->finalized || !pack->finalized)
    return CUDNN_STATUS_BAD_PARAM;
  const cudnnBackendDescriptor_t cfg = e::one(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG);
  const cudnnBackendDescriptor_t graph = e::one(cfg, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH);
  const cudnnBackendDescriptor_t op = graph->descs[CUDNN_ATTR_OPERATIONGRAPH_OPS][0];
  std::map<std::int64_t, void*> ptrs;
  const auto& uids = pack->ints[CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS];
  for (std::size_t i = 0; i < uids.size(); ++i)
    ptrs[uids[i]] = pack->pointers[CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS][i];
  const bool backward = op->type == CUDNN_BACKEND_OPERATION_SDPA_BWD_DESCRIPTOR;
  const e::Roles& r = backward ? e::backward_roles : e::forward_roles;
  // The scale is a by-value host scalar, read now (cuDNN copies it at execute).
  const cudnnBackendDescriptor_t scale_desc = e::one(op, r.scale);
  auto sp = ptrs.find(scale_desc->ints[CUDNN_ATTR_TENSOR_UNIQUE_ID].at(0));
  if (sp == ptrs.end() || sp->second == nullptr || ::mpar::gpu::emulation::device_view(sp->second))
    return CUDNN_STATUS_BAD_PARAM;
  const double scale = double(*static_cast<const float*>(sp->second));
  e::Bound q, k, v, o, stats, dout, dq, dk, dv;
  bool bound = e::bind(e::one(op, r.q), ptrs, &q) && e::bind(e::one(op, r.k), ptrs, &k) &&
               e::bind(e::one(op, r.v), ptrs, &v) && e::bind(e::one(op, r.o), ptrs, &o) &&
               e::bind(e::one(op, r.stats), ptrs, &stats);
  if (backward)
    bound = bound && e::bind(e::one(op, CUDNN_ATTR_OPERATION_SDPA_BWD_DODDESC), ptrs, &dout) &&
            e::bind(e::one(op, CUDNN_ATTR_OPERATION_SDPA_BWD_DQDESC), ptrs, &dq) &&
            e::bind(e::one(op, CUDNN_ATTR_OPERATION_SDPA_BWD_DKDESC), ptrs, &dk) &&
            e::bind(e::one(op, CUDNN_ATTR_OPERATION_SDPA_BWD_DVDESC), ptrs, &dv);
  if (!bound) return CUDNN_STATUS_BAD_PARAM;
  (void)::mpar::gpu::emulation::run_or_record(h->stream, [=] {
    if (backward)
      e::sdpa_backward(q, k, v, o, dout, stats, dq, dk, dv, scale);
    else
      e::sdpa_forward(q, k, v, o, stats, scale);
  });
  return CUDNN_STATUS_SUCCESS;
}
