#pragma once
/**
 * @file CUDA kernels for the layers' forward and backward passes: the device twins of
 * mpar/backend/host/kernels.hpp, with the same argument order and the same semantics.
 *
 * Include from a translation unit compiled by nvcc, or by g++ with MPAR_CUDA_EMULATION (the kernels then run in
 * the emulated runtime: backend/gpu/runtime.hpp). Activations are row-major `[rows, cols]` device
 * arrays of `T` (float, bf16, f16; double where noted) and arithmetic runs in `compute_type_t<T>`.
 * Per-row statistics (layer-norm mean/rstd, cross-entropy partials) and parameter gradients of
 * 16-bit activations are kept in float, because accumulating gradients in 16 bits loses updates.
 * Every launcher takes an optional stream (the thread's compute stream by default), never
 * synchronises, and checks the launch.
 */
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "mpar/backend/gpu/context.hpp"
#include "mpar/backend/gpu/cuda_error.hpp"
#include "mpar/backend/gpu/element_types.hpp"
#include "mpar/backend/gpu/runtime.hpp"
#include "mpar/backend/host/kernels.hpp"  // host::DropoutMask: the device applies the same mask
#include "mpar/core/init.hpp"

namespace mpar::gpu {

namespace detail {

inline constexpr unsigned block_threads = 256;

/** Enough blocks to cover `n` with a grid-stride loop, capped so huge tensors reuse threads. */
inline unsigned grid_for(std::size_t n) {
  const std::size_t blocks = (n + block_threads - 1) / block_threads;
  return unsigned(blocks < 65536 ? (blocks ? blocks : 1) : 65536);
}
inline cudaStream_t pick(cudaStream_t s) { return s ? s : current_stream(); }

struct SumOp {
  template <class V>
  __device__ V operator()(V a, V b) const {
    return a + b;
  }
};
struct MaxOp {
  template <class V>
  __device__ V operator()(V a, V b) const {
    return a > b ? a : b;
  }
};

/** Reduces `v` over the 32 lanes of a full warp (butterfly shuffles): every lane returns the total. */
template <class V, class Op>
__device__ V warp_reduce(V v, Op op) {
  for (int offset = 16; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

/**
 * Reduces `v` over the block and returns the result to every thread. Every launcher in this header uses
 * `block_threads` threads per block, so the warp count is a compile-time constant: each warp reduces its lanes,
 * lane 0 writes the warp's partial, and after the barrier every warp reduces the partials itself (no broadcast
 * step). The trailing barrier lets callers reduce again at once (no warp overwrites a partial still being read).
 */
template <class V, class Op>
__device__ V block_reduce(V v, Op op) {
  constexpr unsigned warps = block_threads / 32;
  static_assert(block_threads % 32 == 0 && (warps & (warps - 1)) == 0 && warps <= 32,
                "block_reduce needs whole warps, a power-of-two count of them");
  __shared__ V partial[warps];
  const unsigned lane = threadIdx.x % 32;
  v = warp_reduce(v, op);
  if (lane == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  v = partial[lane % warps];  // each group of `warps` lanes holds every partial once
  for (unsigned offset = warps / 2; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, int(offset)));
  __syncthreads();
  return v;
}

template <class C>
__device__ C gelu_k() {
  return C(0.7978845608028654);
}
template <class C>
__device__ C gelu_c() {
  return C(0.044715);
}

// ---- kernels (templates, so the header can be included by several translation units) ----------

template <class T>
__global__ void gelu_forward_kernel(std::size_t n, const T* x, T* y) {
  using C = compute_type_t<T>;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    const C v = to_compute(x[i]);
    y[i] = from_compute<T>(C(0.5) * v * (C(1) + std::tanh(gelu_k<C>() * (v + gelu_c<C>() * v * v * v))));
  }
}
template <class T>
__global__ void gelu_backward_kernel(std::size_t n, const T* x, const T* dy, T* dx) {
  using C = compute_type_t<T>;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    const C v = to_compute(x[i]);
    const C t = std::tanh(gelu_k<C>() * (v + gelu_c<C>() * v * v * v));
    const C dt = gelu_k<C>() * (C(1) + C(3) * gelu_c<C>() * v * v) * (C(1) - t * t);
    dx[i] = from_compute<T>(to_compute(dy[i]) * (C(0.5) * (C(1) + t) + C(0.5) * v * dt));
  }
}

template <class T>
__global__ void add_kernel(std::size_t n, const T* x, const T* z, T* y) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x)
    y[i] = from_compute<T>(to_compute(x[i]) + to_compute(z[i]));
}
template <class T>
__global__ void scale_kernel(std::size_t n, compute_type_t<T> a, T* x) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x)
    x[i] = from_compute<T>(a * to_compute(x[i]));
}
template <class From, class To>
__global__ void convert_kernel(std::size_t n, const From* x, To* y) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x)
    y[i] = from_compute<To>(compute_type_t<To>(to_compute(x[i])));
}
template <class T>
__global__ void bias_add_forward_kernel(std::size_t rows, std::size_t cols, const T* bias, T* y) {
  const std::size_t n = rows * cols;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x)
    y[i] = from_compute<T>(to_compute(y[i]) + to_compute(bias[i % cols]));
}
/** Column sums: each thread owns one column and a chunk of rows, so reads are coalesced across the warp. */
template <class T>
__global__ void column_sum_kernel(std::size_t rows, std::size_t cols, std::size_t rows_per_chunk, const T* dy,
                                  compute_type_t<T>* out) {
  const std::size_t c = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x;
  if (c >= cols) return;
  const std::size_t r0 = blockIdx.y * rows_per_chunk, r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  compute_type_t<T> acc = 0;
  for (std::size_t r = r0; r < r1; ++r) acc += to_compute(dy[r * cols + c]);
  atomicAdd(out + c, acc);
}

/** One block per row; `causal` masks column c > (row % cols) (self-attention scores `[.., s, s]`). */
template <class T>
__global__ void softmax_forward_kernel(std::size_t cols, const T* x, T* y, bool causal, float scale) {
  const std::size_t r = blockIdx.x;
  const T* xr = x + r * cols;
  T* yr = y + r * cols;
  const std::size_t valid = causal ? (r % cols) + 1 : cols;
  float mx = -INFINITY;
  for (std::size_t c = threadIdx.x; c < valid; c += blockDim.x) mx = fmaxf(mx, scale * float(to_compute(xr[c])));
  mx = block_reduce(mx, MaxOp{});
  float sum = 0;
  for (std::size_t c = threadIdx.x; c < valid; c += blockDim.x) sum += expf(scale * float(to_compute(xr[c])) - mx);
  sum = block_reduce(sum, SumOp{});
  const float inv = 1.0f / sum;
  for (std::size_t c = threadIdx.x; c < cols; c += blockDim.x)
    yr[c] = from_compute<T>(compute_type_t<T>(c < valid ? expf(scale * float(to_compute(xr[c])) - mx) * inv : 0.0f));
}
/** dx = scale * y * (dy - sum(dy * y)); masked entries have y = 0 and so get dx = 0. */
template <class T>
__global__ void softmax_backward_kernel(std::size_t cols, const T* y, const T* dy, T* dx, float scale) {
  const std::size_t r = blockIdx.x;
  const T *yr = y + r * cols, *dyr = dy + r * cols;
  float dot = 0;
  for (std::size_t c = threadIdx.x; c < cols; c += blockDim.x)
    dot += float(to_compute(yr[c])) * float(to_compute(dyr[c]));
  dot = block_reduce(dot, SumOp{});
  for (std::size_t c = threadIdx.x; c < cols; c += blockDim.x)
    dx[r * cols + c] =
        from_compute<T>(compute_type_t<T>(scale * float(to_compute(yr[c])) * (float(to_compute(dyr[c])) - dot)));
}

/** One block per row, two passes as on the host (mean, then the variance about it). */
template <class T>
__global__ void layernorm_forward_kernel(std::size_t cols, const T* x, const T* gamma, const T* beta, T* y, float* mean,
                                         float* rstd, float eps) {
  const std::size_t r = blockIdx.x;
  const T* xr = x + r * cols;
  float s = 0;
  for (std::size_t c = threadIdx.x; c < cols; c += blockDim.x) s += float(to_compute(xr[c]));
  const float m = block_reduce(s, SumOp{}) / float(cols);
  float v = 0;
  for (std::size_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float d = float(to_compute(xr[c])) - m;
    v += d * d;
  }
  const float rs = rsqrtf(block_reduce(v, SumOp{}) / float(cols) + eps);
  if (threadIdx.x == 0) {
    mean[r] = m;
    rstd[r] = rs;
  }
  for (std::size_t c = threadIdx.x; c < cols; c += blockDim.x)
    y[r * cols + c] = from_compute<T>(compute_type_t<T>(
        (float(to_compute(xr[c])) - m) * rs * float(to_compute(gamma[c])) + float(to_compute(beta[c]))));
}
template <class T>
__global__ void layernorm_backward_dx_kernel(std::size_t cols, const T* x, const float* mean, const float* rstd,
                                             const T* gamma, const T* dy, T* dx) {
  const std::size_t r = blockIdx.x;
  const T *xr = x + r * cols, *dyr = dy + r * cols;
  const float m = mean[r], rs = rstd[r];
  float sg = 0, sgx = 0;
  for (std::size_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float g = float(to_compute(dyr[c])) * float(to_compute(gamma[c]));
    sg += g;
    sgx += g * (float(to_compute(xr[c])) - m) * rs;
  }
  sg = block_reduce(sg, SumOp{});
  sgx = block_reduce(sgx, SumOp{});
  const float inv_n = 1.0f / float(cols);
  for (std::size_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float xhat = (float(to_compute(xr[c])) - m) * rs;
    dx[r * cols + c] = from_compute<T>(
        compute_type_t<T>(rs * (float(to_compute(dyr[c])) * float(to_compute(gamma[c])) - inv_n * (sg + xhat * sgx))));
  }
}
template <class T>
__global__ void layernorm_backward_params_kernel(std::size_t rows, std::size_t cols, std::size_t rows_per_chunk,
                                                 const T* x, const float* mean, const float* rstd, const T* dy,
                                                 float* dgamma, float* dbeta) {
  const std::size_t c = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x;
  if (c >= cols) return;
  const std::size_t r0 = blockIdx.y * rows_per_chunk, r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  float dg = 0, db = 0;
  for (std::size_t r = r0; r < r1; ++r) {
    const float g = float(to_compute(dy[r * cols + c]));
    dg += g * (float(to_compute(x[r * cols + c])) - mean[r]) * rstd[r];
    db += g;
  }
  atomicAdd(dgamma + c, dg);
  atomicAdd(dbeta + c, db);
}

/** Per row: softmax into `probs` and -log p[target] / rows added to `*loss` (NaN for a target outside [0, cols)). */
template <class T>
__global__ void cross_entropy_forward_kernel(std::size_t rows, std::size_t cols, const T* logits,
                                             const std::int32_t* targets, T* probs, float* loss) {
  const std::size_t r = blockIdx.x;
  const T* xr = logits + r * cols;
  float mx = -INFINITY;
  for (std::size_t c = threadIdx.x; c < cols; c += blockDim.x) mx = fmaxf(mx, float(to_compute(xr[c])));
  mx = block_reduce(mx, MaxOp{});
  float sum = 0;
  for (std::size_t c = threadIdx.x; c < cols; c += blockDim.x) sum += expf(float(to_compute(xr[c])) - mx);
  sum = block_reduce(sum, SumOp{});
  const float inv = 1.0f / sum;
  for (std::size_t c = threadIdx.x; c < cols; c += blockDim.x)
    probs[r * cols + c] = from_compute<T>(compute_type_t<T>(expf(float(to_compute(xr[c])) - mx) * inv));
  if (threadIdx.x == 0) {
    const std::int32_t t = targets[r];
    // log p = (x_t - max) - log(sum): exact even where p underflows to zero.
    const float lp = (t >= 0 && std::size_t(t) < cols) ? float(to_compute(xr[t])) - mx - logf(sum) : NAN;
    atomicAdd(loss, -lp / float(rows));
  }
}
template <class T>
__global__ void cross_entropy_backward_kernel(std::size_t rows, std::size_t cols, const T* probs,
                                              const std::int32_t* targets, T* dlogits, float scale) {
  const std::size_t n = rows * cols;
  const float s = scale / float(rows);
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    const std::size_t r = i / cols, c = i % cols;
    const float onehot = std::int32_t(c) == targets[r] ? 1.0f : 0.0f;
    dlogits[i] = from_compute<T>(compute_type_t<T>(s * (float(to_compute(probs[i])) - onehot)));
  }
}

template <class T>
__global__ void vocab_row_max_kernel(std::size_t cols, const T* logits, float* row_max) {
  const std::size_t r = blockIdx.x;
  float mx = -INFINITY;
  for (std::size_t c = threadIdx.x; c < cols; c += blockDim.x) mx = fmaxf(mx, float(to_compute(logits[r * cols + c])));
  mx = block_reduce(mx, MaxOp{});
  if (threadIdx.x == 0) row_max[r] = mx;
}
template <class T>
__global__ void vocab_sumexp_kernel(std::size_t cols, std::size_t col_offset, const T* logits,
                                    const std::int32_t* targets, const float* row_max, float* sumexp,
                                    float* target_logit) {
  const std::size_t r = blockIdx.x;
  const float mx = row_max[r];
  float s = 0;
  for (std::size_t c = threadIdx.x; c < cols; c += blockDim.x) s += expf(float(to_compute(logits[r * cols + c])) - mx);
  s = block_reduce(s, SumOp{});
  if (threadIdx.x == 0) {
    sumexp[r] = s;
    const std::int64_t t = std::int64_t(targets[r]) - std::int64_t(col_offset);
    target_logit[r] = (t >= 0 && t < std::int64_t(cols)) ? float(to_compute(logits[r * cols + std::size_t(t)])) : 0.0f;
  }
}
template <class = void>
__global__ void vocab_loss_kernel(std::size_t rows, const float* row_max, const float* sumexp,
                                  const float* target_logit, float* loss) {
  for (std::size_t r = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; r < rows;
       r += std::size_t(gridDim.x) * blockDim.x)
    atomicAdd(loss, (logf(sumexp[r]) + row_max[r] - target_logit[r]) / float(rows));
}
template <class T>
__global__ void vocab_backward_kernel(std::size_t rows, std::size_t cols, std::size_t col_offset, const T* logits,
                                      const std::int32_t* targets, const float* row_max, const float* sumexp,
                                      T* dlogits, float scale) {
  const std::size_t n = rows * cols;
  const float s = scale / float(rows);
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    const std::size_t r = i / cols, c = i % cols;
    const float p = expf(float(to_compute(logits[i])) - row_max[r]) / sumexp[r];
    const float onehot = std::int64_t(targets[r]) == std::int64_t(col_offset + c) ? 1.0f : 0.0f;
    dlogits[i] = from_compute<T>(compute_type_t<T>(s * (p - onehot)));
  }
}

/** The element's keep decision is CounterRng{seed, stream}.uniform(global index) >= p, as in host::DropoutMask. */
template <class T>
__global__ void dropout_kernel(std::size_t rows, std::size_t cols, std::uint64_t seed, std::uint64_t stream, double p,
                               std::size_t global_cols, std::size_t row_offset, std::size_t col_offset,
                               compute_type_t<T> keep_scale, const T* x, T* y) {
  const std::size_t n = rows * cols;
  const CounterRng rng{seed, stream};
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    const std::size_t r = i / cols, c = i % cols;
    const std::uint64_t g = std::uint64_t(row_offset + r) * global_cols + col_offset + c;
    y[i] = rng.uniform(g) >= p ? from_compute<T>(to_compute(x[i]) * keep_scale) : from_compute<T>(0);
  }
}

template <class T>
__global__ void embedding_forward_kernel(std::size_t tokens, std::size_t dim, std::size_t vocab_offset,
                                         std::size_t vocab_local, const std::int32_t* ids, const T* table, T* out) {
  const std::size_t n = tokens * dim;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    const std::size_t t = i / dim, d = i % dim;
    const std::int64_t row = std::int64_t(ids[t]) - std::int64_t(vocab_offset);
    out[i] = (row >= 0 && row < std::int64_t(vocab_local)) ? table[std::size_t(row) * dim + d] : from_compute<T>(0);
  }
}
template <class T>
__global__ void embedding_backward_kernel(std::size_t tokens, std::size_t dim, std::size_t vocab_offset,
                                          std::size_t vocab_local, const std::int32_t* ids, const T* dout,
                                          float* dtable) {
  const std::size_t n = tokens * dim;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    const std::size_t t = i / dim, d = i % dim;
    const std::int64_t row = std::int64_t(ids[t]) - std::int64_t(vocab_offset);
    if (row >= 0 && row < std::int64_t(vocab_local))
      atomicAdd(dtable + std::size_t(row) * dim + d, float(to_compute(dout[i])));
  }
}

/**
 * One element of AdamW in the direct form of host::adamw_update, operation for operation: `decay` is this
 * element's weight factor (1 - lr wd, or 1). The explicitly rounded intrinsics keep nvcc from contracting a
 * multiply and an add into one FMA (the host rounds each product), so a device step equals the host step bit
 * for bit. Both AdamW kernels call it, so the update is written once.
 */
template <class G>
__device__ inline void adamw_element(std::size_t i, float* w, const G* grad, float* m, float* v, float beta1,
                                     float beta2, float one_b1, float one_b2, float eps, float lr, float decay,
                                     float bias1, float bias2, float grad_scale) {
  const float g = __fmul_rn(float(to_compute(grad[i])), grad_scale);
  const float mi = __fadd_rn(__fmul_rn(beta1, m[i]), __fmul_rn(one_b1, g));
  const float vi = __fadd_rn(__fmul_rn(beta2, v[i]), __fmul_rn(__fmul_rn(one_b2, g), g));
  m[i] = mi;
  v[i] = vi;
  const float mhat = __fdiv_rn(mi, bias1), vhat = __fdiv_rn(vi, bias2);
  w[i] = __fsub_rn(__fmul_rn(w[i], decay), __fdiv_rn(__fmul_rn(lr, mhat), __fadd_rn(__fsqrt_rn(vhat), eps)));
}

/** AdamW with one weight-decay factor for the whole range (adamw_element on every element). */
template <class G>
__global__ void adamw_kernel(std::size_t n, float* w, const G* grad, float* m, float* v, float beta1, float beta2,
                             float eps, float lr, float decay, float bias1, float bias2, float grad_scale,
                             const UpdateFactors* factors, const AdamWScalars* scalars = nullptr,
                             float weight_decay = 0.0f) {
  if (factors) {  // the step's factors in rank memory (host::adamw_update): skip, or the scale to use
    if (factors->skip != 0.0f) return;
    grad_scale = factors->grad_scale;
  }
  if (scalars) {  // the step's scalars in rank memory (host::adamw_update with AdamWScalars)
    lr = scalars->lr;
    bias1 = scalars->bias_correction1;
    bias2 = scalars->bias_correction2;
    decay = __fsub_rn(1.0f, __fmul_rn(lr, weight_decay));  // rounded as the host rounds 1 - lr wd
  }
  const float one_b1 = 1.0f - beta1, one_b2 = 1.0f - beta2;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x)
    adamw_element(i, w, grad, m, v, beta1, beta2, one_b1, one_b2, eps, lr, decay, bias1, bias2, grad_scale);
}

/**
 * AdamW over a flat range whose weight decay applies per run (host::adamw_update with `DecayRun`s): each element
 * finds its run by a binary search of the run ends (a few hundred runs: the table stays in cache) and takes
 * `decay` (1 - lr wd, rounded on the host) or 1 into adamw_element, the update adamw_kernel makes.
 */
template <class G>
__global__ void adamw_runs_kernel(std::size_t n, float* w, const G* grad, float* m, float* v, float beta1, float beta2,
                                  float eps, float lr, float decay, float bias1, float bias2,
                                  const UpdateFactors* factors, const DecayRun* runs, std::size_t nruns,
                                  const AdamWScalars* scalars = nullptr, float weight_decay = 0.0f) {
  if (factors->skip != 0.0f) return;
  const float grad_scale = factors->grad_scale;
  if (scalars) {  // as in adamw_kernel
    lr = scalars->lr;
    bias1 = scalars->bias_correction1;
    bias2 = scalars->bias_correction2;
    decay = __fsub_rn(1.0f, __fmul_rn(lr, weight_decay));
  }
  const float one_b1 = 1.0f - beta1, one_b2 = 1.0f - beta2;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    std::size_t lo = 0, hi = nruns;  // the first run whose end lies past i
    while (lo < hi) {
      const std::size_t mid = (lo + hi) / 2;
      if (runs[mid].end <= i)
        lo = mid + 1;
      else
        hi = mid;
    }
    if (lo == nruns) continue;  // past the last run: not part of the update (host::adamw_update does the same)
    const float di = runs[lo].decays != 0 ? decay : 1.0f;
    adamw_element(i, w, grad, m, v, beta1, beta2, one_b1, one_b2, eps, lr, di, bias1, bias2, grad_scale);
  }
}

/** SGD in the form of host::sgd_update, rounded like the host (see adamw_kernel). `buf` is null without momentum. */
template <class G>
__global__ void sgd_kernel(std::size_t n, float* w, const G* grad, float* buf, float momentum, float dampening,
                           bool nesterov, float lr, float weight_decay, bool first, float grad_scale,
                           const UpdateFactors* factors) {
  if (factors) {  // as in adamw_kernel
    if (factors->skip != 0.0f) return;
    grad_scale = factors->grad_scale;
  }
  const float keep = 1.0f - dampening;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    float d = __fadd_rn(__fmul_rn(float(to_compute(grad[i])), grad_scale), __fmul_rn(weight_decay, w[i]));
    if (momentum != 0.0f) {
      const float b = first ? d : __fadd_rn(__fmul_rn(momentum, buf[i]), __fmul_rn(keep, d));
      buf[i] = b;
      d = nesterov ? __fadd_rn(d, __fmul_rn(momentum, b)) : b;
    }
    w[i] = __fsub_rn(w[i], __fmul_rn(lr, d));
  }
}

template <class T>
__global__ void sum_squares_kernel(std::size_t n, const T* x, float* acc) {
  float s = 0;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    const float v = float(to_compute(x[i]));
    s += v * v;
  }
  s = block_reduce(s, SumOp{});
  if (threadIdx.x == 0) atomicAdd(acc, s);
}

/** As sum_squares_kernel, each block's float sum added into a double in rank memory (`B::sum_squares`). */
template <class T>
__global__ void sum_squares_double_kernel(std::size_t n, const T* x, double* acc) {
  float s = 0;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    const float v = float(to_compute(x[i]));
    s += v * v;
  }
  s = block_reduce(s, SumOp{});
  if (threadIdx.x == 0) atomicAdd(acc, double(s));
}

/** host::adamw_advance on one device thread (a template: a header's kernel; `Real` is double). */
template <class Real>
__global__ void adamw_advance_kernel(float beta1, float beta2, const float* lr, const UpdateFactors* factors,
                                     AdamWScalars* s) {
  s->lr = *lr;
  if (factors->skip != 0.0f) return;
  const std::uint32_t t = s->steps + 1;
  s->steps = t;
  s->bias_correction1 = float(Real(1) - pow(Real(beta1), Real(t)));
  s->bias_correction2 = float(Real(1) - pow(Real(beta2), Real(t)));
}

/** host::update_factors on one device thread, operation for operation (a template: a header's kernel). */
template <class Real>
__global__ void update_factors_kernel(const Real* squares, Real max_norm, float inv_loss_scale, bool skip_nonfinite,
                                      Real* norm, UpdateFactors* factors) {
  const Real nrm = sqrt(*squares) * Real(inv_loss_scale);
  const bool finite = isfinite(nrm);
  float clip = 1.0f;
  if (finite && max_norm > 0.0) {
    const Real c = max_norm / (nrm + 1e-6);
    clip = c < 1.0 ? float(c) : 1.0f;
  }
  *norm = nrm;
  factors->grad_scale = __fmul_rn(clip, inv_loss_scale);
  factors->skip = skip_nonfinite && !finite ? 1.0f : 0.0f;
}

}  // namespace detail

// ---- launchers ---------------------------------------------------------------------------------

/** y[i] = gelu(x[i]) (tanh form); y may alias x. */
template <class T>
void gelu_forward(std::size_t n, const T* x, T* y, cudaStream_t s = nullptr) {
  if (!n) return;
  MPAR_LAUNCH(detail::gelu_forward_kernel, detail::grid_for(n), detail::block_threads, 0, detail::pick(s), n, x, y);
  check_launch("gpu::gelu_forward");
}
/** dx[i] = dy[i] * gelu'(x[i]); dx may alias dy. */
template <class T>
void gelu_backward(std::size_t n, const T* x, const T* dy, T* dx, cudaStream_t s = nullptr) {
  if (!n) return;
  MPAR_LAUNCH(detail::gelu_backward_kernel, detail::grid_for(n), detail::block_threads, 0, detail::pick(s), n, x, dy,
              dx);
  check_launch("gpu::gelu_backward");
}
/** y[i] = x[i] + z[i]; y may alias x or z. */
template <class T>
void add(std::size_t n, const T* x, const T* z, T* y, cudaStream_t s = nullptr) {
  if (!n) return;
  MPAR_LAUNCH(detail::add_kernel, detail::grid_for(n), detail::block_threads, 0, detail::pick(s), n, x, z, y);
  check_launch("gpu::add");
}
/** x[i] *= a */
template <class T>
void scale(std::size_t n, compute_type_t<T> a, T* x, cudaStream_t s = nullptr) {
  if (!n) return;
  MPAR_LAUNCH(detail::scale_kernel, detail::grid_for(n), detail::block_threads, 0, detail::pick(s), n, a, x);
  check_launch("gpu::scale");
}
/** y[i] = To(x[i]), rounding to nearest even into 16-bit types. */
template <class From, class To>
void convert(std::size_t n, const From* x, To* y, cudaStream_t s = nullptr) {
  if (!n) return;
  MPAR_LAUNCH(detail::convert_kernel, detail::grid_for(n), detail::block_threads, 0, detail::pick(s), n, x, y);
  check_launch("gpu::convert");
}
/** y[r, c] += bias[c] */
template <class T>
void bias_add_forward(std::size_t rows, std::size_t cols, const T* bias, T* y, cudaStream_t s = nullptr) {
  if (!rows || !cols) return;
  MPAR_LAUNCH(detail::bias_add_forward_kernel, detail::grid_for(rows * cols), detail::block_threads, 0, detail::pick(s),
              rows, cols, bias, y);
  check_launch("gpu::bias_add_forward");
}
/** dbias[c] += sum_r dy[r, c] (dbias in the compute type: float for 16-bit dy). */
template <class T>
void bias_add_backward(std::size_t rows, std::size_t cols, const T* dy, compute_type_t<T>* dbias,
                       cudaStream_t s = nullptr) {
  if (!rows || !cols) return;
  constexpr std::size_t chunk = 64;
  const dim3 grid(unsigned((cols + detail::block_threads - 1) / detail::block_threads),
                  unsigned((rows + chunk - 1) / chunk));
  MPAR_LAUNCH(detail::column_sum_kernel, grid, detail::block_threads, 0, detail::pick(s), rows, cols, chunk, dy, dbias);
  check_launch("gpu::bias_add_backward");
}

/**
 * Row-wise softmax of `scale * x`. With `causal`, rows are query positions of `[.., s, s]` attention
 * scores (cols = s): row r keeps columns c <= r % s, the rest become 0.
 */
template <class T>
void softmax_forward(std::size_t rows, std::size_t cols, const T* x, T* y, bool causal = false, float scale = 1.0f,
                     cudaStream_t s = nullptr) {
  if (!rows || !cols) return;
  MPAR_LAUNCH(detail::softmax_forward_kernel, unsigned(rows), detail::block_threads, 0, detail::pick(s), cols, x, y,
              causal, scale);
  check_launch("gpu::softmax_forward");
}
/** dx = scale * y * (dy - sum(dy * y)); dx may alias dy. Causal masking needs nothing extra (y is 0 there). */
template <class T>
void softmax_backward(std::size_t rows, std::size_t cols, const T* y, const T* dy, T* dx, float scale = 1.0f,
                      cudaStream_t s = nullptr) {
  if (!rows || !cols) return;
  MPAR_LAUNCH(detail::softmax_backward_kernel, unsigned(rows), detail::block_threads, 0, detail::pick(s), cols, y, dy,
              dx, scale);
  check_launch("gpu::softmax_backward");
}

/** y = (x - mean) * rstd * gamma + beta per row; saves mean and rstd (float, length rows). */
template <class T>
void layernorm_forward(std::size_t rows, std::size_t cols, const T* x, const T* gamma, const T* beta, T* y, float* mean,
                       float* rstd, float eps = 1e-5f, cudaStream_t s = nullptr) {
  if (!rows || !cols) return;
  MPAR_LAUNCH(detail::layernorm_forward_kernel, unsigned(rows), detail::block_threads, 0, detail::pick(s), cols, x,
              gamma, beta, y, mean, rstd, eps);
  check_launch("gpu::layernorm_forward");
}
/** dx is overwritten; dgamma and dbeta (float, length cols) accumulate, as on the host. */
template <class T>
void layernorm_backward(std::size_t rows, std::size_t cols, const T* x, const float* mean, const float* rstd,
                        const T* gamma, const T* dy, T* dx, float* dgamma, float* dbeta, cudaStream_t s = nullptr) {
  if (!rows || !cols) return;
  s = detail::pick(s);
  MPAR_LAUNCH(detail::layernorm_backward_dx_kernel, unsigned(rows), detail::block_threads, 0, s, cols, x, mean, rstd,
              gamma, dy, dx);
  check_launch("gpu::layernorm_backward(dx)");
  constexpr std::size_t chunk = 64;
  const dim3 grid(unsigned((cols + detail::block_threads - 1) / detail::block_threads),
                  unsigned((rows + chunk - 1) / chunk));
  MPAR_LAUNCH(detail::layernorm_backward_params_kernel, grid, detail::block_threads, 0, s, rows, cols, chunk, x, mean,
              rstd, dy, dgamma, dbeta);
  check_launch("gpu::layernorm_backward(dgamma, dbeta)");
}

/**
 * Mean over rows of -log softmax(logits)[target], written to the device scalar `*loss` (overwritten);
 * softmax saved in `probs`. A target outside [0, cols) makes the loss NaN (a kernel cannot throw).
 */
template <class T>
void cross_entropy_forward(std::size_t rows, std::size_t cols, const T* logits, const std::int32_t* targets, T* probs,
                           float* loss, cudaStream_t s = nullptr) {
  s = detail::pick(s);
  check(cudaMemsetAsync(loss, 0, sizeof(float), s), "cudaMemsetAsync(loss)");
  if (!rows || !cols) return;
  MPAR_LAUNCH(detail::cross_entropy_forward_kernel, unsigned(rows), detail::block_threads, 0, s, rows, cols, logits,
              targets, probs, loss);
  check_launch("gpu::cross_entropy_forward");
}
/** dlogits = scale * (probs - onehot(target)) / rows */
template <class T>
void cross_entropy_backward(std::size_t rows, std::size_t cols, const T* probs, const std::int32_t* targets, T* dlogits,
                            float scale = 1.0f, cudaStream_t s = nullptr) {
  if (!rows || !cols) return;
  MPAR_LAUNCH(detail::cross_entropy_backward_kernel, detail::grid_for(rows * cols), detail::block_threads, 0,
              detail::pick(s), rows, cols, probs, targets, dlogits, scale);
  check_launch("gpu::cross_entropy_backward");
}

/**
 * @brief Vocabulary-parallel cross-entropy: each rank holds logits for the vocabulary columns
 * `[col_offset, col_offset + cols)` and only per-row scalars cross ranks (as in Megatron).
 *
 * Protocol per step: `vocab_parallel_max` -> all-reduce(max) of row_max -> `vocab_parallel_sumexp`
 * -> all-reduce(sum) of sumexp and target_logit -> `vocab_parallel_loss` and `vocab_parallel_backward`.
 */
template <class T>
void vocab_parallel_max(std::size_t rows, std::size_t cols, const T* logits, float* row_max, cudaStream_t s = nullptr) {
  if (!rows) return;
  MPAR_LAUNCH(detail::vocab_row_max_kernel, unsigned(rows), detail::block_threads, 0, detail::pick(s), cols, logits,
              row_max);
  check_launch("gpu::vocab_parallel_max");
}
/** Local sum of exp(logit - global row max) and the target's logit when this rank owns it (0 otherwise). */
template <class T>
void vocab_parallel_sumexp(std::size_t rows, std::size_t cols, std::size_t col_offset, const T* logits,
                           const std::int32_t* targets, const float* row_max, float* sumexp, float* target_logit,
                           cudaStream_t s = nullptr) {
  if (!rows) return;
  MPAR_LAUNCH(detail::vocab_sumexp_kernel, unsigned(rows), detail::block_threads, 0, detail::pick(s), cols, col_offset,
              logits, targets, row_max, sumexp, target_logit);
  check_launch("gpu::vocab_parallel_sumexp");
}
/** `*loss` = mean over rows of log(sumexp) + max - target_logit, from the all-reduced statistics. */
inline void vocab_parallel_loss(std::size_t rows, const float* row_max, const float* sumexp, const float* target_logit,
                                float* loss, cudaStream_t s = nullptr) {
  s = detail::pick(s);
  check(cudaMemsetAsync(loss, 0, sizeof(float), s), "cudaMemsetAsync(loss)");
  if (!rows) return;
  MPAR_LAUNCH(detail::vocab_loss_kernel<>, detail::grid_for(rows), detail::block_threads, 0, s, rows, row_max, sumexp,
              target_logit, loss);
  check_launch("gpu::vocab_parallel_loss");
}
/** dlogits of the local vocabulary block: scale * (softmax - onehot) / rows, softmax from the global statistics. */
template <class T>
void vocab_parallel_backward(std::size_t rows, std::size_t cols, std::size_t col_offset, const T* logits,
                             const std::int32_t* targets, const float* row_max, const float* sumexp, T* dlogits,
                             float scale = 1.0f, cudaStream_t s = nullptr) {
  if (!rows || !cols) return;
  MPAR_LAUNCH(detail::vocab_backward_kernel, detail::grid_for(rows * cols), detail::block_threads, 0, detail::pick(s),
              rows, cols, col_offset, logits, targets, row_max, sumexp, dlogits, scale);
  check_launch("gpu::vocab_parallel_backward");
}

/**
 * Applies `mask` (a host::DropoutMask: same seed, stream, p and offsets) on the device: the kept
 * elements are exactly those the host keeps, bit-for-bit. Backward is the same call on the gradient.
 */
template <class T>
void dropout_apply(const host::DropoutMask& mask, std::size_t rows, std::size_t cols, const T* x, T* y,
                   cudaStream_t s = nullptr) {
  require(mask.p >= 0.0 && mask.p < 1.0, "gpu::dropout_apply: probability ", mask.p, " must be in [0, 1)");
  if (!rows || !cols) return;
  using C = compute_type_t<T>;
  MPAR_LAUNCH(detail::dropout_kernel, detail::grid_for(rows * cols), detail::block_threads, 0, detail::pick(s), rows,
              cols, mask.seed, mask.stream, mask.p, mask.global_cols, mask.row_offset, mask.col_offset,
              C(1.0 / (1.0 - mask.p)), x, y);
  check_launch("gpu::dropout_apply");
}

/**
 * out[t, :] = table[ids[t] - vocab_offset, :] for ids this rank owns (rows `[vocab_offset,
 * vocab_offset + vocab_local)`), zero otherwise — so a vocabulary-parallel embedding sums to the full one.
 */
template <class T>
void embedding_forward(std::size_t tokens, std::size_t dim, const std::int32_t* ids, const T* table, T* out,
                       std::size_t vocab_offset, std::size_t vocab_local, cudaStream_t s = nullptr) {
  if (!tokens || !dim) return;
  MPAR_LAUNCH(detail::embedding_forward_kernel, detail::grid_for(tokens * dim), detail::block_threads, 0,
              detail::pick(s), tokens, dim, vocab_offset, vocab_local, ids, table, out);
  check_launch("gpu::embedding_forward");
}
/** dtable[ids[t] - vocab_offset, :] += dout[t, :] (float accumulation; repeated ids add up). */
template <class T>
void embedding_backward(std::size_t tokens, std::size_t dim, const std::int32_t* ids, const T* dout, float* dtable,
                        std::size_t vocab_offset, std::size_t vocab_local, cudaStream_t s = nullptr) {
  if (!tokens || !dim) return;
  MPAR_LAUNCH(detail::embedding_backward_kernel, detail::grid_for(tokens * dim), detail::block_threads, 0,
              detail::pick(s), tokens, dim, vocab_offset, vocab_local, ids, dout, dtable);
  check_launch("gpu::embedding_backward");
}

/** @brief AdamW hyper-parameters (decoupled weight decay, as in Loshchilov & Hutter). */
struct AdamWConfig {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;
};

/**
 * One AdamW step on fp32 master weights `w` with gradients of type G (float or 16-bit), with the
 * per-step constants given (bias corrections `1 - beta^t`): exactly host::adamw_update,
 * `w = w (1 - lr wd) - lr (m / c1) / (sqrt(v / c2) + eps)` after the moment updates.
 * `grad_scale` multiplies the gradient first (gradient clipping or loss-scale removal).
 */
template <class G>
void adamw_update(std::size_t n, float* w, const G* grad, float* m, float* v, float beta1, float beta2, float eps,
                  float lr, float weight_decay, float bias_correction1, float bias_correction2, float grad_scale = 1.0f,
                  cudaStream_t s = nullptr) {
  if (!n) return;
  const float decay = 1.0f - lr * weight_decay;  // on the host, as host::adamw_update rounds it
  MPAR_LAUNCH(detail::adamw_kernel, detail::grid_for(n), detail::block_threads, 0, detail::pick(s), n, w, grad, m, v,
              beta1, beta2, eps, lr, decay, bias_correction1, bias_correction2, grad_scale, nullptr);
  check_launch("gpu::adamw_update");
}
/** As above with the gradient scale and the skip flag read from `factors` (rank memory): no host read. */
template <class G>
void adamw_update(std::size_t n, float* w, const G* grad, float* m, float* v, float beta1, float beta2, float eps,
                  float lr, float weight_decay, float bias_correction1, float bias_correction2,
                  const UpdateFactors* factors, cudaStream_t s = nullptr) {
  if (!n) return;
  const float decay = 1.0f - lr * weight_decay;
  MPAR_LAUNCH(detail::adamw_kernel, detail::grid_for(n), detail::block_threads, 0, detail::pick(s), n, w, grad, m, v,
              beta1, beta2, eps, lr, decay, bias_correction1, bias_correction2, 1.0f, factors);
  check_launch("gpu::adamw_update");
}
/**
 * As above over a flat range whose weight decay applies per run of `decay_runs` (rank memory; see
 * host::adamw_update with `DecayRun`s): one launch for all the parameters of a rank.
 */
template <class G>
void adamw_update(std::size_t n, float* w, const G* grad, float* m, float* v, float beta1, float beta2, float eps,
                  float lr, float weight_decay, float bias_correction1, float bias_correction2,
                  const UpdateFactors* factors, const DecayRun* decay_runs, std::size_t runs,
                  cudaStream_t s = nullptr) {
  if (!n || !runs) return;
  const float decay = 1.0f - lr * weight_decay;  // on the host, as host::adamw_update rounds it
  MPAR_LAUNCH(detail::adamw_runs_kernel, detail::grid_for(n), detail::block_threads, 0, detail::pick(s), n, w, grad, m,
              v, beta1, beta2, eps, lr, decay, bias_correction1, bias_correction2, factors, decay_runs, runs);
  check_launch("gpu::adamw_update (decay runs)");
}
/**
 * As above with the learning rate and the bias corrections read from `scalars` (rank memory, advanced by
 * adamw_advance): the update a captured graph replays with each step's values.
 */
template <class G>
void adamw_update(std::size_t n, float* w, const G* grad, float* m, float* v, float beta1, float beta2, float eps,
                  float weight_decay, const AdamWScalars* scalars, const UpdateFactors* factors,
                  cudaStream_t s = nullptr) {
  if (!n) return;
  MPAR_LAUNCH(detail::adamw_kernel, detail::grid_for(n), detail::block_threads, 0, detail::pick(s), n, w, grad, m, v,
              beta1, beta2, eps, 0.0f, 1.0f, 1.0f, 1.0f, 1.0f, factors, scalars, weight_decay);
  check_launch("gpu::adamw_update (scalars in rank memory)");
}
/** The flat-range update (`DecayRun`s) with its scalars read from `scalars` (rank memory). */
template <class G>
void adamw_update(std::size_t n, float* w, const G* grad, float* m, float* v, float beta1, float beta2, float eps,
                  float weight_decay, const AdamWScalars* scalars, const UpdateFactors* factors,
                  const DecayRun* decay_runs, std::size_t runs, cudaStream_t s = nullptr) {
  if (!n || !runs) return;
  MPAR_LAUNCH(detail::adamw_runs_kernel, detail::grid_for(n), detail::block_threads, 0, detail::pick(s), n, w, grad, m,
              v, beta1, beta2, eps, 0.0f, 1.0f, 1.0f, 1.0f, factors, decay_runs, runs, scalars, weight_decay);
  check_launch("gpu::adamw_update (decay runs, scalars in rank memory)");
}
/** host::adamw_advance on the device: the next update's learning rate and bias corrections in rank memory. */
inline void adamw_advance(float beta1, float beta2, const float* lr, const UpdateFactors* factors,
                          AdamWScalars* scalars, cudaStream_t s = nullptr) {
  MPAR_LAUNCH(detail::adamw_advance_kernel<double>, 1, 1, 0, detail::pick(s), beta1, beta2, lr, factors, scalars);
  check_launch("gpu::adamw_advance");
}

/** As above for step `step` (counting from 1) of the hyper-parameters `cfg`. */
template <class G>
void adamw_update(std::size_t n, float* param, const G* grad, float* m, float* v, const AdamWConfig& cfg,
                  std::int64_t step, float grad_scale = 1.0f, cudaStream_t s = nullptr) {
  require(step >= 1, "gpu::adamw_update: step counts from 1, got ", step);
  const float b1 = float(1.0 - std::pow(double(cfg.beta1), double(step)));
  const float b2 = float(1.0 - std::pow(double(cfg.beta2), double(step)));
  adamw_update(n, param, grad, m, v, cfg.beta1, cfg.beta2, cfg.eps, cfg.lr, cfg.weight_decay, b1, b2, grad_scale, s);
}

/**
 * One SGD step, exactly host::sgd_update: `d = grad_scale g + wd w; buf = first ? d : mu buf +
 * (1 - dampening) d; w -= lr (nesterov ? d + mu buf : buf)`; without momentum `buf` may be null.
 */
template <class G>
void sgd_update(std::size_t n, float* w, const G* grad, float* buf, float momentum, float dampening, bool nesterov,
                float lr, float weight_decay, bool first, float grad_scale = 1.0f, cudaStream_t s = nullptr) {
  require(momentum == 0.0f || buf != nullptr || n == 0, "gpu::sgd_update: momentum ", momentum,
          " needs a momentum buffer of ", n, " elements, got null");
  if (!n) return;
  MPAR_LAUNCH(detail::sgd_kernel, detail::grid_for(n), detail::block_threads, 0, detail::pick(s), n, w, grad, buf,
              momentum, dampening, nesterov, lr, weight_decay, first, grad_scale, nullptr);
  check_launch("gpu::sgd_update");
}
/** As above with the gradient scale and the skip flag read from `factors` (rank memory): no host read. */
template <class G>
void sgd_update(std::size_t n, float* w, const G* grad, float* buf, float momentum, float dampening, bool nesterov,
                float lr, float weight_decay, bool first, const UpdateFactors* factors, cudaStream_t s = nullptr) {
  require(momentum == 0.0f || buf != nullptr || n == 0, "gpu::sgd_update: momentum ", momentum,
          " needs a momentum buffer of ", n, " elements, got null");
  if (!n) return;
  MPAR_LAUNCH(detail::sgd_kernel, detail::grid_for(n), detail::block_threads, 0, detail::pick(s), n, w, grad, buf,
              momentum, dampening, nesterov, lr, weight_decay, first, 1.0f, factors);
  check_launch("gpu::sgd_update");
}

/**
 * `*acc += sum x[i]^2` on the device (float). Gradient norm over shards and tensors: accumulate every
 * local shard into one scalar, all-reduce it, then take the square root.
 */
template <class T>
void sum_squares_accumulate(std::size_t n, const T* x, float* acc, cudaStream_t s = nullptr) {
  if (!n) return;
  const unsigned grid = detail::grid_for(n) < 1024 ? detail::grid_for(n) : 1024;
  MPAR_LAUNCH(detail::sum_squares_kernel, grid, detail::block_threads, 0, detail::pick(s), n, x, acc);
  check_launch("gpu::sum_squares_accumulate");
}
/** `*acc += sum x[i]^2` into a double in rank memory (blocks sum in float): `CudaBackend::sum_squares`. */
template <class T>
void sum_squares_accumulate(std::size_t n, const T* x, double* acc, cudaStream_t s = nullptr) {
  if (!n) return;
  const unsigned grid = detail::grid_for(n) < 1024 ? detail::grid_for(n) : 1024;
  MPAR_LAUNCH(detail::sum_squares_double_kernel, grid, detail::block_threads, 0, detail::pick(s), n, x, acc);
  check_launch("gpu::sum_squares_accumulate");
}
/** host::update_factors on the device: the step's norm and `UpdateFactors` from the reduced sum of squares. */
inline void update_factors(const double* squares, double max_norm, float inv_loss_scale, bool skip_nonfinite,
                           double* norm, UpdateFactors* factors, cudaStream_t s = nullptr) {
  MPAR_LAUNCH(detail::update_factors_kernel<double>, 1, 1, 0, detail::pick(s), squares, max_norm, inv_loss_scale,
              skip_nonfinite, norm, factors);
  check_launch("gpu::update_factors");
}

}  // namespace mpar::gpu
