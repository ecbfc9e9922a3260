#pragma once
/**
 * @file cuBLAS and cuBLASLt under the emulation (cublas_v2.h, cublasLt.h): the handles, descriptors and GEMM
 * entry points mpar's backend/gpu/gemm.hpp calls, each a naive column-major reference that honours exactly the
 * arguments given — transposes, leading dimensions, strides, batch count, alpha and beta, the data types of A,
 * B and C (fp32, fp64, bf16, f16; fp32 or fp64 compute) and the Lt epilogues (bias, GeLU, GeLU with the
 * pre-activation stored to `aux`).
 *
 * Arguments cuBLAS would reject — a leading dimension below the rows it must cover, an unsupported type or
 * compute combination, a layout that does not match the transposes, a null or host pointer, an operand whose
 * extent (rows, columns, ld, stride, batch) leaves its `cudaMalloc` allocation — throw `emulation_error` naming
 * the call, instead of returning a status that a caller could ignore or computing from the wrong memory. The
 * operands are read and written through the readable view of device memory (`device_view`), as kernels are.
 * Like cuBLAS, C is not read when beta is zero (it may hold NaN). The work runs at once on the calling thread;
 * the stream set on a handle orders the call: a capturing stream records it (emulation/graphs.hpp), as for launches.
 *
 * The arithmetic is the one the compute type names: fp32 compute accumulates in float in index order, fp64 in
 * double; 16-bit results are rounded to nearest even. A GPU's tensor cores sum in another order (and cuBLASLt's
 * GeLU is its own approximation of tanh's), so results agree with cuBLAS to rounding, not bit for bit.
 */
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "mpar/backend/gpu/emulation/error.hpp"
#include "mpar/backend/gpu/emulation/graphs.hpp"
#include "mpar/backend/gpu/emulation/memory.hpp"
#include "mpar/backend/gpu/emulation/types.hpp"
#include "mpar/core/dtype.hpp"
#include "mpar/core/error.hpp"

// ---- cublas_v2.h ------------------------------------------------------------------------------------------

enum cublasStatus_t : int {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_ALLOC_FAILED = 3,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_ARCH_MISMATCH = 8,
  CUBLAS_STATUS_MAPPING_ERROR = 11,
  CUBLAS_STATUS_EXECUTION_FAILED = 13,
  CUBLAS_STATUS_INTERNAL_ERROR = 14,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
};
enum cublasOperation_t : int { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 };
enum cublasComputeType_t : int {
  CUBLAS_COMPUTE_16F = 64,
  CUBLAS_COMPUTE_32F = 68,
  CUBLAS_COMPUTE_32F_FAST_TF32 = 77,
  CUBLAS_COMPUTE_64F = 70,
};
enum cublasGemmAlgo_t : int { CUBLAS_GEMM_DEFAULT = -1, CUBLAS_GEMM_DEFAULT_TENSOR_OP = 99 };
enum cublasMath_t : int { CUBLAS_DEFAULT_MATH = 0, CUBLAS_TF32_TENSOR_OP_MATH = 3 };

/** A cuBLAS handle: the stream its calls are ordered on and its math mode. */
struct cublasContext {
  cudaStream_t stream = nullptr;
  cublasMath_t math = CUBLAS_DEFAULT_MATH;
};
using cublasHandle_t = cublasContext*;

// ---- cublasLt.h -------------------------------------------------------------------------------------------

struct cublasLtContext {};
using cublasLtHandle_t = cublasLtContext*;

enum cublasLtEpilogue_t : int {
  CUBLASLT_EPILOGUE_DEFAULT = 1,
  CUBLASLT_EPILOGUE_BIAS = 4,
  CUBLASLT_EPILOGUE_GELU = 32,
  CUBLASLT_EPILOGUE_GELU_AUX = 32 | 128,
  CUBLASLT_EPILOGUE_GELU_BIAS = 32 | 4,
  CUBLASLT_EPILOGUE_GELU_AUX_BIAS = 32 | 128 | 4,
};
enum cublasLtMatmulDescAttributes_t : int {
  CUBLASLT_MATMUL_DESC_COMPUTE_TYPE = 0,
  CUBLASLT_MATMUL_DESC_SCALE_TYPE = 1,
  CUBLASLT_MATMUL_DESC_TRANSA = 3,
  CUBLASLT_MATMUL_DESC_TRANSB = 4,
  CUBLASLT_MATMUL_DESC_EPILOGUE = 7,
  CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8,
  CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER = 11,
  CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD = 12,
  CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE = 26,
};
enum cublasLtMatmulPreferenceAttributes_t : int { CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1 };

/** An operation: compute and scale types, transposes, epilogue and its pointers (what SetAttribute set). */
struct cublasLtMatmulDescOpaque_t {
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cudaDataType_t scale = CUDA_R_32F;
  cublasOperation_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  cudaDataType_t bias_type = cudaDataType_t(-1);  // unset: the type of D, as in cuBLASLt
  void* aux = nullptr;
  std::int64_t aux_ld = 0;
};
using cublasLtMatmulDesc_t = cublasLtMatmulDescOpaque_t*;
/** A column-major matrix: element type, rows, columns and leading dimension. */
struct cublasLtMatrixLayoutOpaque_t {
  cudaDataType_t type = CUDA_R_32F;
  std::uint64_t rows = 0, cols = 0;
  std::int64_t ld = 0;
};
using cublasLtMatrixLayout_t = cublasLtMatrixLayoutOpaque_t*;
struct cublasLtMatmulPreferenceOpaque_t {
  std::size_t max_workspace = 0;
};
using cublasLtMatmulPreference_t = cublasLtMatmulPreferenceOpaque_t*;
struct cublasLtMatmulAlgo_t {
  std::uint64_t data[8];
};
struct cublasLtMatmulHeuristicResult_t {
  cublasLtMatmulAlgo_t algo;
  std::size_t workspaceSize;
  cublasStatus_t state;
  float wavesCount;
  int reserved[4];
};

namespace mpar::gpu::emulation::blas {

/** Throws emulation_error naming `call` unless `ok`. */
template <class... A>
void require_arg(bool ok, const char* call, const A&... what) {
  if (!ok) throw emulation_error(mpar::detail::cat(call, ": ", what...));
}

inline std::size_t type_bytes(cudaDataType_t t) {
  switch (t) {
    case CUDA_R_32F:
      return 4;
    case CUDA_R_64F:
      return 8;
    case CUDA_R_16F:
    case CUDA_R_16BF:
      return 2;
  }
  return 0;
}
inline const char* type_name(cudaDataType_t t) {
  switch (t) {
    case CUDA_R_32F:
      return "CUDA_R_32F";
    case CUDA_R_64F:
      return "CUDA_R_64F";
    case CUDA_R_16F:
      return "CUDA_R_16F";
    case CUDA_R_16BF:
      return "CUDA_R_16BF";
  }
  return "an unknown cudaDataType_t";
}

/** Element `i` of an array of type `t`, widened to double (exact for every supported type). */
inline double load(const void* p, cudaDataType_t t, std::size_t i) {
  switch (t) {
    case CUDA_R_32F:
      return static_cast<const float*>(p)[i];
    case CUDA_R_64F:
      return static_cast<const double*>(p)[i];
    case CUDA_R_16F:
      return float(f16::from_bits(static_cast<const std::uint16_t*>(p)[i]));
    case CUDA_R_16BF:
      return float(bf16::from_bits(static_cast<const std::uint16_t*>(p)[i]));
  }
  return NAN;
}
/** Stores `v` as element `i` of an array of type `t`, rounding to nearest even. */
inline void store(void* p, cudaDataType_t t, std::size_t i, double v) {
  switch (t) {
    case CUDA_R_32F:
      static_cast<float*>(p)[i] = float(v);
      return;
    case CUDA_R_64F:
      static_cast<double*>(p)[i] = v;
      return;
    case CUDA_R_16F:
      static_cast<std::uint16_t*>(p)[i] = f16(float(v)).bits;
      return;
    case CUDA_R_16BF:
      static_cast<std::uint16_t*>(p)[i] = bf16(float(v)).bits;
      return;
  }
}

/**
 * The types cuBLAS's GemmEx (and cuBLASLt) take with fp32 or fp64 compute: A and B of one type; fp32 in and
 * out; fp64 in and out (fp64 compute only); 16-bit in with the same 16-bit or fp32 out.
 */
inline bool supported(cudaDataType_t ab, cudaDataType_t c, cublasComputeType_t compute) {
  if (compute == CUBLAS_COMPUTE_64F) return ab == CUDA_R_64F && c == CUDA_R_64F;
  if (compute != CUBLAS_COMPUTE_32F) return false;
  if (ab == CUDA_R_32F) return c == CUDA_R_32F;
  return (ab == CUDA_R_16F || ab == CUDA_R_16BF) && (c == ab || c == CUDA_R_32F);
}

/**
 * The readable view of a column-major operand of `rows x cols` (leading dimension `ld`) repeated `batch` times
 * `stride` elements apart: every element the call may touch must lie in one live device allocation.
 */
inline void* operand(const char* call, const char* name, const void* p, cudaDataType_t t, std::int64_t rows,
                     std::int64_t cols, std::int64_t ld, std::int64_t stride = 0, std::int64_t batch = 1) {
  require_arg(p != nullptr, call, name, " is null");
  require_arg(device_view(p) != nullptr, call, name, " (", p, ") is not device memory (cudaMalloc)");
  require_arg(stride >= 0, call, name, ": negative stride ", stride);
  const std::int64_t last = (batch - 1) * stride + (cols - 1) * ld + rows;  // elements up to the last one touched
  require_arg(DeviceAllocations::instance().covers(p, std::size_t(last) * type_bytes(t)), call, name, " of ", rows,
              " x ", cols, " (ld ", ld, ", stride ", stride, ", batch ", batch, ", ", type_name(t), ") reaches ",
              std::size_t(last) * type_bytes(t), " bytes past its start, beyond its device allocation");
  return device_view(p);
}

/** One column-major operand as a call sees it: where it is, its type, leading dimension and batch stride. */
struct Matrix {
  const void* p;
  cudaDataType_t type;
  std::int64_t ld, stride;
  [[nodiscard]] double at(std::int64_t batch, std::int64_t row, std::int64_t col) const {
    return load(p, type, std::size_t(batch * stride + col * ld + row));
  }
};

/** The epilogue applied to each result of an Lt matmul before D is stored. */
struct Epilogue {
  bool gelu = false;
  const void* bias = nullptr;  // readable view, one element per row of D
  cudaDataType_t bias_type = CUDA_R_32F;
  void* aux = nullptr;  // readable view, the pre-GeLU values, column-major with ld aux_ld
  cudaDataType_t aux_type = CUDA_R_32F;
  std::int64_t aux_ld = 0;
};

/** GeLU's tanh approximation (GPT-2's), which cuBLASLt's GELU epilogues compute. */
inline double gelu(double x) { return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }

/**
 * `C_b = alpha op(A_b) op(B_b) + beta C_b` (then the epilogue) for each batch b, column-major, `C` being
 * `m x n`; the sum over k runs in index order in float (fp32 compute) or double (fp64 compute).
 */
inline void reference_gemm(cublasOperation_t ta, cublasOperation_t tb, std::int64_t m, std::int64_t n, std::int64_t k,
                           double alpha, const Matrix& a, const Matrix& b, double beta, Matrix c, std::int64_t batch,
                           cublasComputeType_t compute, const Epilogue& ep = {}) {
  const bool fp64 = compute == CUBLAS_COMPUTE_64F;
  for (std::int64_t l = 0; l < batch; ++l)
    for (std::int64_t j = 0; j < n; ++j)
      for (std::int64_t i = 0; i < m; ++i) {
        float sf = 0;
        double sd = 0;
        for (std::int64_t p = 0; p < k; ++p) {
          const double x = ta == CUBLAS_OP_N ? a.at(l, i, p) : a.at(l, p, i);
          const double y = tb == CUBLAS_OP_N ? b.at(l, p, j) : b.at(l, j, p);
          if (fp64)
            sd += x * y;
          else
            sf += float(x) * float(y);
        }
        double v;
        if (fp64) {
          v = alpha * sd + (beta != 0 ? beta * c.at(l, i, j) : 0.0);
        } else {
          float r = float(alpha) * sf;
          if (beta != 0) r += float(beta) * float(c.at(l, i, j));
          v = r;
        }
        if (ep.bias) v = float(v) + float(load(ep.bias, ep.bias_type, std::size_t(i)));
        if (ep.aux) store(ep.aux, ep.aux_type, std::size_t(j * ep.aux_ld + i), v);
        if (ep.gelu) v = float(gelu(v));
        store(const_cast<void*>(c.p), c.type, std::size_t(l * c.stride + j * c.ld + i), v);
      }
}

/** The checks and the run shared by cublasGemmEx and cublasGemmStridedBatchedEx. */
inline cublasStatus_t gemm_ex(const char* call, cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                              int n, int k, const void* alpha, const void* a, cudaDataType_t at, int lda,
                              std::int64_t stride_a, const void* b, cudaDataType_t bt, int ldb, std::int64_t stride_b,
                              const void* beta, void* c, cudaDataType_t ct, int ldc, std::int64_t stride_c, int batch,
                              cublasComputeType_t compute) {
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  require_arg(ta == CUBLAS_OP_N || ta == CUBLAS_OP_T, call, "transa must be CUBLAS_OP_N or CUBLAS_OP_T (real types)");
  require_arg(tb == CUBLAS_OP_N || tb == CUBLAS_OP_T, call, "transb must be CUBLAS_OP_N or CUBLAS_OP_T (real types)");
  require_arg(m >= 0 && n >= 0 && k >= 0 && batch >= 0, call, "negative size m=", m, " n=", n, " k=", k,
              " batch=", batch);
  const int a_rows = ta == CUBLAS_OP_N ? m : k, a_cols = ta == CUBLAS_OP_N ? k : m;
  const int b_rows = tb == CUBLAS_OP_N ? k : n, b_cols = tb == CUBLAS_OP_N ? n : k;
  require_arg(lda >= (a_rows > 1 ? a_rows : 1), call, "lda=", lda, " is below the ", a_rows, " rows of op(A)'s ",
              ta == CUBLAS_OP_N ? "A" : "A^T", " (m=", m, " k=", k, ")");
  require_arg(ldb >= (b_rows > 1 ? b_rows : 1), call, "ldb=", ldb, " is below the ", b_rows, " rows of B (k=", k,
              " n=", n, ")");
  require_arg(ldc >= (m > 1 ? m : 1), call, "ldc=", ldc, " is below the ", m, " rows of C");
  require_arg(at == bt, call, "A and B must have one type, got ", type_name(at), " and ", type_name(bt));
  require_arg(supported(at, ct, compute), call, "unsupported combination A/B ", type_name(at), ", C ", type_name(ct),
              ", compute type ", int(compute));
  require_arg(alpha != nullptr && beta != nullptr, call, "alpha and beta must be host pointers, got null");
  if (m == 0 || n == 0 || batch == 0) return CUBLAS_STATUS_SUCCESS;
  const bool fp64 = compute == CUBLAS_COMPUTE_64F;
  const double al = fp64 ? *static_cast<const double*>(alpha) : *static_cast<const float*>(alpha);
  const double be = fp64 ? *static_cast<const double*>(beta) : *static_cast<const float*>(beta);
  const bool reads_ab = k > 0 && al != 0;
  const Matrix ma{reads_ab ? operand(call, "A", a, at, a_rows, a_cols, lda, stride_a, batch) : nullptr, at, lda,
                  stride_a};
  const Matrix mb{reads_ab ? operand(call, "B", b, bt, b_rows, b_cols, ldb, stride_b, batch) : nullptr, bt, ldb,
                  stride_b};
  const Matrix mc{operand(call, "C", c, ct, m, n, ldc, stride_c, batch), ct, ldc, stride_c};
  // Checked above; run now, or recorded on a capturing stream (emulation/graphs.hpp).
  const int kk = reads_ab ? k : 0;
  if (run_or_record(h->stream, [=] { reference_gemm(ta, tb, m, n, kk, al, ma, mb, be, mc, batch, compute); }) !=
      cudaSuccess)
    return CUBLAS_STATUS_EXECUTION_FAILED;
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace mpar::gpu::emulation::blas

// ---- cuBLAS entry points ----------------------------------------------------------------------------------

inline cublasStatus_t cublasCreate(cublasHandle_t* h) {
  if (h == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *h = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasDestroy(cublasHandle_t h) {
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) {
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  h->stream = s;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasGetStream(cublasHandle_t h, cudaStream_t* s) {
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (s == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *s = h->stream;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t mode) {
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  h->math = mode;
  return CUBLAS_STATUS_SUCCESS;
}

/** `C = alpha op(A) op(B) + beta C`, column-major, C `m x n` (cuBLAS's GemmEx). */
inline cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                   const void* alpha, const void* a, cudaDataType_t at, int lda, const void* b,
                                   cudaDataType_t bt, int ldb, const void* beta, void* c, cudaDataType_t ct, int ldc,
                                   cublasComputeType_t compute, cublasGemmAlgo_t) {
  return ::mpar::gpu::emulation::blas::gemm_ex("cublasGemmEx", h, ta, tb, m, n, k, alpha, a, at, lda, 0, b, bt, ldb, 0,
                                               beta, c, ct, ldc, 0, 1, compute);
}
/** `batch` GemmEx's whose A, B and C start `stride_*` elements apart. */
inline cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                                                 int n, int k, const void* alpha, const void* a, cudaDataType_t at,
                                                 int lda, long long stride_a, const void* b, cudaDataType_t bt, int ldb,
                                                 long long stride_b, const void* beta, void* c, cudaDataType_t ct,
                                                 int ldc, long long stride_c, int batch, cublasComputeType_t compute,
                                                 cublasGemmAlgo_t) {
  return ::mpar::gpu::emulation::blas::gemm_ex("cublasGemmStridedBatchedEx", h, ta, tb, m, n, k, alpha, a, at, lda,
                                               stride_a, b, bt, ldb, stride_b, beta, c, ct, ldc, stride_c, batch,
                                               compute);
}

inline const char* cublasGetStatusName(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}
inline const char* cublasGetStatusString(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS:
      return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "the library was not initialized";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "the functionality requested is not supported";
    default:
      return "emulated cuBLAS error";
  }
}

// ---- cuBLASLt entry points --------------------------------------------------------------------------------

inline cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) {
  if (h == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *h = new cublasLtContext;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t compute,
                                               cudaDataType_t scale) {
  if (d == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *d = new cublasLtMatmulDescOpaque_t{};
  (*d)->compute = compute;
  (*d)->scale = scale;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  delete d;
  return CUBLAS_STATUS_SUCCESS;
}
/** Sets one attribute; the size must be the attribute's own, as cuBLASLt checks. */
inline cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                                     const void* buf, std::size_t bytes) {
  if (d == nullptr || buf == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  auto set = [&](auto& field) {
    if (bytes != sizeof field) return CUBLAS_STATUS_INVALID_VALUE;
    std::memcpy(&field, buf, bytes);
    return CUBLAS_STATUS_SUCCESS;
  };
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE:
      return set(d->compute);
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE:
      return set(d->scale);
    case CUBLASLT_MATMUL_DESC_TRANSA:
      return set(d->transa);
    case CUBLASLT_MATMUL_DESC_TRANSB:
      return set(d->transb);
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
      return set(d->epilogue);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
      return set(d->bias);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
      return set(d->bias_type);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER:
      return set(d->aux);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD:
      return set(d->aux_ld);
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}
inline cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType_t type, std::uint64_t rows,
                                                 std::uint64_t cols, std::int64_t ld) {
  if (l == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *l = new cublasLtMatrixLayoutOpaque_t{type, rows, cols, ld};
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
  delete l;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) {
  if (p == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *p = new cublasLtMatmulPreferenceOpaque_t{};
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
  delete p;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                           cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                           std::size_t bytes) {
  if (p == nullptr || buf == nullptr || attr != CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES ||
      bytes != sizeof p->max_workspace)
    return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(&p->max_workspace, buf, bytes);
  return CUBLAS_STATUS_SUCCESS;
}

namespace mpar::gpu::emulation::blas {
/** Whether the emulation (like cuBLASLt) has a kernel for these types and this epilogue. */
inline bool lt_supported(const cublasLtMatmulDescOpaque_t& d, const cublasLtMatrixLayoutOpaque_t& a,
                         const cublasLtMatrixLayoutOpaque_t& b, const cublasLtMatrixLayoutOpaque_t& c) {
  const cudaDataType_t bias = d.bias_type == cudaDataType_t(-1) ? c.type : d.bias_type;
  const bool epilogue_ok = d.epilogue == CUBLASLT_EPILOGUE_DEFAULT || d.epilogue == CUBLASLT_EPILOGUE_BIAS ||
                           d.epilogue == CUBLASLT_EPILOGUE_GELU || d.epilogue == CUBLASLT_EPILOGUE_GELU_AUX ||
                           d.epilogue == CUBLASLT_EPILOGUE_GELU_BIAS || d.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  return epilogue_ok && a.type == b.type && d.compute == CUBLAS_COMPUTE_32F && d.scale == CUDA_R_32F &&
         supported(a.type, c.type, d.compute) && (bias == c.type || bias == CUDA_R_32F);
}
}  // namespace mpar::gpu::emulation::blas

/** One algorithm for every combination the emulation supports (a naive one); none, NOT_SUPPORTED, otherwise. */
inline cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d,
                                                     cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                                     cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dl,
                                                     cublasLtMatmulPreference_t, int requested,
                                                     cublasLtMatmulHeuristicResult_t* results, int* found) {
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!d || !a || !b || !c || !dl || requested < 1 || !results || !found) return CUBLAS_STATUS_INVALID_VALUE;
  *found = 0;
  if (!::mpar::gpu::emulation::blas::lt_supported(*d, *a, *b, *dl) || c->type != dl->type)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  results[0] = {};
  results[0].state = CUBLAS_STATUS_SUCCESS;
  results[0].wavesCount = 1.0f;
  *found = 1;
  return CUBLAS_STATUS_SUCCESS;
}

/** `D = epilogue(alpha op(A) op(B) + beta C)`, column-major, with the layouts and attributes given. */
inline cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void* alpha, const void* a,
                                     cublasLtMatrixLayout_t al, const void* b, cublasLtMatrixLayout_t bl,
                                     const void* beta, const void* c, cublasLtMatrixLayout_t cl, void* dp,
                                     cublasLtMatrixLayout_t dl, const cublasLtMatmulAlgo_t* algo, void* workspace,
                                     std::size_t workspace_bytes, cudaStream_t stream) {
  namespace blas = ::mpar::gpu::emulation::blas;
  using blas::require_arg;
  const char* call = "cublasLtMatmul";
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  require_arg(d && al && bl && cl && dl, call, "a descriptor or layout is null");
  require_arg(alpha != nullptr && beta != nullptr, call, "alpha and beta must be host pointers, got null");
  require_arg(algo != nullptr, call, "no algorithm (take one from cublasLtMatmulAlgoGetHeuristic)");
  require_arg(blas::lt_supported(*d, *al, *bl, *dl), call, "unsupported combination A ", blas::type_name(al->type),
              ", B ", blas::type_name(bl->type), ", D ", blas::type_name(dl->type), ", compute ", int(d->compute),
              ", scale ", blas::type_name(d->scale), ", epilogue ", int(d->epilogue));
  require_arg(cl->type == dl->type && cl->rows == dl->rows && cl->cols == dl->cols, call,
              "C and D layouts differ in type or shape");
  require_arg(d->transa == CUBLAS_OP_N || d->transa == CUBLAS_OP_T, call, "TRANSA must be N or T");
  require_arg(d->transb == CUBLAS_OP_N || d->transb == CUBLAS_OP_T, call, "TRANSB must be N or T");
  const auto m = std::int64_t(dl->rows), n = std::int64_t(dl->cols);
  const std::int64_t k = std::int64_t(d->transa == CUBLAS_OP_N ? al->cols : al->rows);
  const auto [ar, ac] = d->transa == CUBLAS_OP_N ? std::pair{m, k} : std::pair{k, m};
  const auto [br, bc] = d->transb == CUBLAS_OP_N ? std::pair{k, n} : std::pair{n, k};
  require_arg(std::int64_t(al->rows) == ar && std::int64_t(al->cols) == ac, call, "A's layout is ", al->rows, " x ",
              al->cols, ", op(A) must be ", m, " x ", k, " for D of ", m, " x ", n);
  require_arg(std::int64_t(bl->rows) == br && std::int64_t(bl->cols) == bc, call, "B's layout is ", bl->rows, " x ",
              bl->cols, ", op(B) must be ", k, " x ", n, " for D of ", m, " x ", n);
  for (auto [name, l] : {std::pair{"A", al}, std::pair{"B", bl}, std::pair{"C", cl}, std::pair{"D", dl}})
    require_arg(l->ld >= std::int64_t(l->rows > 1 ? l->rows : 1), call, name, "'s leading dimension ", l->ld,
                " is below its ", l->rows, " rows");
  require_arg(
      workspace_bytes == 0 || ::mpar::gpu::emulation::DeviceAllocations::instance().covers(workspace, workspace_bytes),
      call, "the workspace of ", workspace_bytes, " bytes is not inside one device allocation");
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  const double alpha_v = *static_cast<const float*>(alpha), beta_v = *static_cast<const float*>(beta);

  blas::Epilogue ep;
  const bool has_bias = d->epilogue & CUBLASLT_EPILOGUE_BIAS, has_aux = d->epilogue & 128;
  ep.gelu = d->epilogue & CUBLASLT_EPILOGUE_GELU;
  if (has_bias) {
    ep.bias_type = d->bias_type == cudaDataType_t(-1) ? dl->type : d->bias_type;
    ep.bias = blas::operand(call, "the bias", d->bias, ep.bias_type, m, 1, m);
  }
  if (has_aux) {
    require_arg(d->aux_ld >= m && d->aux_ld % 8 == 0, call, "EPILOGUE_AUX_LD ", d->aux_ld, " must be >= ", m,
                " rows and a multiple of 8");
    ep.aux_type = dl->type;
    ep.aux_ld = d->aux_ld;
    ep.aux = blas::operand(call, "the aux buffer", d->aux, ep.aux_type, m, n, d->aux_ld);
  }
  const bool reads_ab = k > 0 && alpha_v != 0;
  const blas::Matrix ma{reads_ab ? blas::operand(call, "A", a, al->type, ar, ac, al->ld) : nullptr, al->type, al->ld,
                        0};
  const blas::Matrix mb{reads_ab ? blas::operand(call, "B", b, bl->type, br, bc, bl->ld) : nullptr, bl->type, bl->ld,
                        0};
  // C is read through its own layout, D written through its own: they may be one buffer (mpar passes C twice).
  void* dv = blas::operand(call, "D", dp, dl->type, m, n, dl->ld);
  if (beta_v != 0) {
    const blas::Matrix mc{blas::operand(call, "C", c, cl->type, m, n, cl->ld), cl->type, cl->ld, 0};
    require_arg(mc.p == dv && cl->ld == dl->ld, call,
                "C and D must be one buffer with one layout when beta != 0 "
                "(the emulation computes in place)");
  }
  const blas::Matrix md{dv, dl->type, dl->ld, 0};
  const cublasOperation_t ta = d->transa, tb = d->transb;
  const cublasComputeType_t compute = d->compute;
  const std::int64_t kk = reads_ab ? k : 0;
  if (::mpar::gpu::emulation::run_or_record(stream, [=] {
        blas::reference_gemm(ta, tb, m, n, kk, alpha_v, ma, mb, beta_v, md, 1, compute, ep);
      }) != cudaSuccess)
    return CUBLAS_STATUS_EXECUTION_FAILED;
  return CUBLAS_STATUS_SUCCESS;
}
