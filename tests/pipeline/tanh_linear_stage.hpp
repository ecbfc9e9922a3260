#pragma once
// A small stage for the pipeline tests: `layers` blocks of y = tanh(x W + b), with the backward split
// into B (input gradient) and W (weight gradient), built directly on the host backend's GEMM.
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "mpar/backend/host/host_backend.hpp"
#include "mpar/core/init.hpp"
#include "mpar/core/layout.hpp"
#include "mpar/nn/activation.hpp"
#include "mpar/nn/parameter.hpp"

namespace mpar_test {

using mpar::nn::Activation;
using mpar::nn::Parameter;

class TanhLinear {
 public:
  TanhLinear(std::size_t in, std::size_t out, std::uint64_t id, std::uint64_t seed = 7) : in_(in), out_(out) {
    w_.name = "w" + std::to_string(id);
    w_.id = 2 * id;
    w_.global_shape = {in, out};
    w_.local_box = {{0, in}, {0, out}};
    w_.initialise(seed, mpar::InitSpec::normal(1.0 / std::sqrt(double(in))));
    b_.name = "b" + std::to_string(id);
    b_.id = 2 * id + 1;
    b_.global_shape = {out};
    b_.local_box = {{0, out}};
    b_.initialise(seed, mpar::InitSpec::normal(0.1));
  }
  Activation forward(const Activation& x, int mb) {
    const std::size_t t = x.extent(0);
    Activation y({t, out_});
    mpar::HostBackend::run(mpar::ops::gemm<float>{.ta = mpar::Trans::no,
                                                  .tb = mpar::Trans::no,
                                                  .m = t,
                                                  .n = out_,
                                                  .k = in_,
                                                  .alpha = 1.0f,
                                                  .a = x.data(),
                                                  .lda = in_,
                                                  .b = w_.value.data(),
                                                  .ldb = out_,
                                                  .beta = 0.0f,
                                                  .c = y.data(),
                                                  .ldc = out_});
    for (std::size_t r = 0; r < t; ++r)
      for (std::size_t c = 0; c < out_; ++c) y(r, c) = std::tanh(y(r, c) + b_.value[c]);
    saved_[mb] = {x, y, {}};
    return y;
  }
  Activation backward_input(const Activation& dy, int mb) {
    auto& s = saved_.at(mb);
    const std::size_t t = dy.extent(0);
    Activation dz({t, out_});
    for (std::size_t i = 0; i < dz.size(); ++i) dz.data()[i] = dy.data()[i] * (1.0f - s.y.data()[i] * s.y.data()[i]);
    Activation dx({t, in_});
    mpar::HostBackend::run(mpar::ops::gemm<float>{.ta = mpar::Trans::no,
                                                  .tb = mpar::Trans::yes,
                                                  .m = t,
                                                  .n = in_,
                                                  .k = out_,
                                                  .alpha = 1.0f,
                                                  .a = dz.data(),
                                                  .lda = out_,
                                                  .b = w_.value.data(),
                                                  .ldb = out_,
                                                  .beta = 0.0f,
                                                  .c = dx.data(),
                                                  .ldc = in_});
    s.dz = std::move(dz);
    return dx;
  }
  void backward_weight(int mb) {
    auto it = saved_.find(mb);
    auto& s = it->second;
    const std::size_t t = s.x.extent(0);
    mpar::HostBackend::run(mpar::ops::gemm<float>{.ta = mpar::Trans::yes,
                                                  .tb = mpar::Trans::no,
                                                  .m = in_,
                                                  .n = out_,
                                                  .k = t,
                                                  .alpha = 1.0f,
                                                  .a = s.x.data(),
                                                  .lda = in_,
                                                  .b = s.dz.data(),
                                                  .ldb = out_,
                                                  .beta = 1.0f,
                                                  .c = w_.grad.data(),
                                                  .ldc = out_});
    for (std::size_t r = 0; r < t; ++r)
      for (std::size_t c = 0; c < out_; ++c) b_.grad[c] += s.dz(r, c);
    saved_.erase(it);
  }
  void drop(int mb) { saved_.erase(mb); }
  std::vector<Parameter*> parameters() { return {&w_, &b_}; }
  [[nodiscard]] std::size_t in_features() const { return in_; }

 private:
  struct Saved {
    Activation x, y, dz;
  };
  std::size_t in_, out_;
  Parameter w_, b_;
  std::map<int, Saved> saved_;
};

/** A chain of TanhLinear layers; satisfies pipeline_part, split_backward_part and droppable_part. */
class TanhStack {
 public:
  /** The pipeline contract: a replicated activation in and out (this stage runs on one tensor rank). */
  using default_input = mpar::Replicate;
  template <class>
  using output_layout = mpar::Replicate;
  using X = mpar::nn::Act<mpar::Replicate>;

  TanhStack(std::size_t width, std::size_t first_layer, std::size_t layers) {
    for (std::size_t i = 0; i < layers; ++i) layers_.emplace_back(width, width, first_layer + i);
  }
  X forward(const X& x, int mb) {
    Activation h = x.tensor();
    for (auto& l : layers_) h = l.forward(h, mb);
    return X(std::move(h));
  }
  X backward_input(const X& dy, int mb) {
    Activation g = dy.tensor();
    // W of layer i needs only its own dz, so B of the whole stack runs every layer's input half.
    for (std::size_t i = layers_.size(); i-- > 0;) g = layers_[i].backward_input(g, mb);
    return X(std::move(g));
  }
  void backward_weight(int mb) {
    for (auto& l : layers_) l.backward_weight(mb);
  }
  X backward(const X& dy, int mb) {
    X g = backward_input(dy, mb);
    backward_weight(mb);
    return g;
  }
  void drop(int mb) {
    for (auto& l : layers_) l.drop(mb);
  }
  std::vector<Parameter*> parameters() {
    std::vector<Parameter*> ps;
    for (auto& l : layers_)
      for (auto* p : l.parameters()) ps.push_back(p);
    return ps;
  }
  [[nodiscard]] std::size_t in_features() const { return layers_.front().in_features(); }

 private:
  std::vector<TanhLinear> layers_;
};

/** Mean squared error of a micro-batch against `target`, and its gradient. */
inline double mse(const Activation& y, const Activation& target, Activation& dy) {
  double l = 0;
  const double n = double(y.size());
  for (std::size_t i = 0; i < y.size(); ++i) {
    const double d = double(y.data()[i]) - double(target.data()[i]);
    l += d * d / n;
    dy.data()[i] = float(2.0 * d / n);
  }
  return l;
}

/** The same on a typed (replicated) micro-batch output, as the executor's loss receives it. */
inline double mse(const mpar::nn::Act<mpar::Replicate>& y, const Activation& target,
                  mpar::nn::Act<mpar::Replicate>& dy) {
  return mse(y.tensor(), target, dy.tensor());
}

}  // namespace mpar_test
