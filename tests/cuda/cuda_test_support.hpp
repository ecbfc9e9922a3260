#pragma once
/**
 * @file What the CUDA tests share: the stream they run on, deterministic host data, copies to and from the
 * device, and naive double-precision attention (the independent reference of the flash-attention and cuDNN
 * attention tests), written here without mpar::host or the device kernels.
 */
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <vector>

#include "mpar/cuda.hpp"

namespace mpar::cuda_testing {

/** The current device stream, which every test's kernels and copies run on (short: most lines name it). */
inline cudaStream_t S() { return gpu::current_stream(); }

/** `n` deterministic values in [-scale, scale) drawn from `rng` (element `i` from draw `i`), rounded to T. */
template <class T>
std::vector<T> uniform_values(std::size_t n, const CounterRng& rng, double scale) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = convert<T>(scale * (2.0 * rng.uniform(i) - 1.0));
  return v;
}
template <class T>
double as_double(T v) {
  return double(float(v));
}
template <class T>
gpu::DeviceBuffer<T> upload(const std::vector<T>& h) {
  return gpu::to_device(std::span<const T>(h), S());
}
template <class T>
std::vector<T> download(const gpu::DeviceBuffer<T>& d) {
  return gpu::to_host(d.data(), d.size(), S());
}

/** Rank memory of backend `B` read as a program reads it: the staged copy and one wait (`mpar::copy_to_host`). */
template <class B, class T>
std::vector<T> rank_values(std::span<const T> rank) {
  std::vector<T> h(rank.size());
  copy_to_host<B>(rank.data(), h.data(), rank.size());
  return h;
}
/** A rank buffer of backend `B` holding `host`, filled by the staged copy (`mpar::copy_to_rank`). */
template <class B, class T>
Buffer<T> rank_buffer(const std::vector<T>& host) {
  Buffer<T> b = B::template allocate<T>(host.size());
  copy_to_rank<B>(host.data(), b.data(), host.size());
  return b;
}

/** Naive attention in double over `bh` heads of `s` x `d`: the outputs, log-sum-exps and input gradients. */
struct AttentionReference {
  std::vector<double> o, lse, dq, dk, dv;
};
/** The full score matrix, softmax and the textbook backward, over the T-rounded inputs. */
template <class T>
AttentionReference attention_reference(std::size_t bh, std::size_t s, std::size_t d, const std::vector<T>& q,
                                       const std::vector<T>& k, const std::vector<T>& v, const std::vector<T>& dout,
                                       double scale, bool causal) {
  const std::size_t n = bh * s * d;
  AttentionReference ref{std::vector<double>(n, 0.0), std::vector<double>(bh * s, 0.0), std::vector<double>(n, 0.0),
                         std::vector<double>(n, 0.0), std::vector<double>(n, 0.0)};
  std::vector<double> p(s * s), dp(s * s);
  for (std::size_t h = 0; h < bh; ++h) {
    const std::size_t b = h * s * d;
    auto at = [&](const std::vector<T>& x, std::size_t r, std::size_t c) { return as_double(x[b + r * d + c]); };
    for (std::size_t i = 0; i < s; ++i) {
      double mx = -INFINITY;
      for (std::size_t j = 0; j < s; ++j) {
        double sc = -INFINITY;
        if (!causal || j <= i) {
          sc = 0;
          for (std::size_t c = 0; c < d; ++c) sc += at(q, i, c) * at(k, j, c);
          sc *= scale;
        }
        p[i * s + j] = sc;
        mx = std::max(mx, sc);
      }
      double sum = 0;
      for (std::size_t j = 0; j < s; ++j) sum += std::exp(p[i * s + j] - mx);
      ref.lse[h * s + i] = mx + std::log(sum);
      for (std::size_t j = 0; j < s; ++j) p[i * s + j] = std::exp(p[i * s + j] - ref.lse[h * s + i]);
      for (std::size_t c = 0; c < d; ++c)
        for (std::size_t j = 0; j < s; ++j) ref.o[b + i * d + c] += p[i * s + j] * at(v, j, c);
    }
    // dV = P^T dO; dP = dO V^T; dS = P * (dP - rowsum(dP * P)); dQ = scale dS K; dK = scale dS^T Q.
    for (std::size_t i = 0; i < s; ++i) {
      double rowsum = 0;
      for (std::size_t j = 0; j < s; ++j) {
        double x = 0;
        for (std::size_t c = 0; c < d; ++c) x += at(dout, i, c) * at(v, j, c);
        dp[i * s + j] = x;
        rowsum += x * p[i * s + j];
      }
      for (std::size_t j = 0; j < s; ++j) {
        const double ds = p[i * s + j] * (dp[i * s + j] - rowsum);
        for (std::size_t c = 0; c < d; ++c) {
          ref.dv[b + j * d + c] += p[i * s + j] * at(dout, i, c);
          ref.dq[b + i * d + c] += scale * ds * at(k, j, c);
          ref.dk[b + j * d + c] += scale * ds * at(q, i, c);
        }
      }
    }
  }
  return ref;
}

}  // namespace mpar::cuda_testing
