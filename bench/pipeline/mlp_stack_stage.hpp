#pragma once
// The benchmark's model chunk: `layers` blocks y = relu(x W) of width h, with the backward split into
// B (input gradient) and W (weight gradient) so the zero-bubble schedules have a W to defer. Each of
// F, B and W is one GEMM of 2·T·h² flops per layer.
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "mpar/backend/host/host_backend.hpp"
#include "mpar/core/init.hpp"
#include "mpar/nn/activation.hpp"
#include "mpar/nn/parameter.hpp"

namespace mpar::bench {

class MlpStackStage {
 public:
  MlpStackStage(std::size_t width, std::size_t first_layer, std::size_t layers) : h_(width) {
    for (std::size_t i = 0; i < layers; ++i) {
      nn::Parameter p;
      p.name = "layer" + std::to_string(first_layer + i) + ".weight";
      p.id = first_layer + i;
      p.global_shape = {width, width};
      p.local_box = {{0, width}, {0, width}};
      p.initialise(3, InitSpec::normal(std::sqrt(2.0 / double(width))));
      w_.push_back(std::move(p));
    }
  }
  /** The pipeline contract: a replicated activation in and out. */
  using default_input = Replicate;
  template <class>
  using output_layout = Replicate;
  using X = nn::Act<Replicate>;

  X forward(const X& x, int mb) { return X(run_forward(x.tensor(), mb)); }
  X backward_input(const X& dy, int mb) { return X(run_backward_input(dy.tensor(), mb)); }
  nn::Activation run_forward(const nn::Activation& x, int mb) {
    auto& s = saved_[mb];
    s.in.clear();
    s.dz.assign(w_.size(), {});
    nn::Activation h = x;
    for (auto& w : w_) {
      s.in.push_back(h);
      nn::Activation y({h.extent(0), h_});
      HostBackend::run(ops::gemm<float>{.ta = Trans::no,
                                        .tb = Trans::no,
                                        .m = h.extent(0),
                                        .n = h_,
                                        .k = h_,
                                        .alpha = 1.0f,
                                        .a = h.data(),
                                        .lda = h_,
                                        .b = w.value.data(),
                                        .ldb = h_,
                                        .beta = 0.0f,
                                        .c = y.data(),
                                        .ldc = h_});
      for (auto& v : y.values()) v = v > 0 ? v : 0.0f;
      h = std::move(y);
    }
    s.out = h;
    return h;
  }
  nn::Activation run_backward_input(const nn::Activation& dy, int mb) {
    auto& s = saved_.at(mb);
    nn::Activation g = dy;
    for (std::size_t i = w_.size(); i-- > 0;) {
      const nn::Activation& y = i + 1 < w_.size() ? s.in[i + 1] : s.out;
      for (std::size_t k = 0; k < g.size(); ++k) g.data()[k] = y.data()[k] > 0 ? g.data()[k] : 0.0f;
      nn::Activation dx({g.extent(0), h_});
      HostBackend::run(ops::gemm<float>{.ta = Trans::no,
                                        .tb = Trans::yes,
                                        .m = g.extent(0),
                                        .n = h_,
                                        .k = h_,
                                        .alpha = 1.0f,
                                        .a = g.data(),
                                        .lda = h_,
                                        .b = w_[i].value.data(),
                                        .ldb = h_,
                                        .beta = 0.0f,
                                        .c = dx.data(),
                                        .ldc = h_});
      s.dz[i] = std::move(g);
      g = std::move(dx);
    }
    return g;
  }
  void backward_weight(int mb) {
    auto it = saved_.find(mb);
    auto& s = it->second;
    for (std::size_t i = 0; i < w_.size(); ++i)
      HostBackend::run(ops::gemm<float>{.ta = Trans::yes,
                                        .tb = Trans::no,
                                        .m = h_,
                                        .n = h_,
                                        .k = s.in[i].extent(0),
                                        .alpha = 1.0f,
                                        .a = s.in[i].data(),
                                        .lda = h_,
                                        .b = s.dz[i].data(),
                                        .ldb = h_,
                                        .beta = 1.0f,
                                        .c = w_[i].grad.data(),
                                        .ldc = h_});
    saved_.erase(it);
  }
  X backward(const X& dy, int mb) {
    X g = backward_input(dy, mb);
    backward_weight(mb);
    return g;
  }
  void drop(int mb) { saved_.erase(mb); }
  std::vector<nn::Parameter*> parameters() {
    std::vector<nn::Parameter*> ps;
    for (auto& w : w_) ps.push_back(&w);
    return ps;
  }
  [[nodiscard]] std::size_t in_features() const { return h_; }

 private:
  struct Saved {
    std::vector<nn::Activation> in, dz;
    nn::Activation out;
  };
  std::size_t h_;
  std::vector<nn::Parameter> w_;
  std::map<int, Saved> saved_;
};

}  // namespace mpar::bench
