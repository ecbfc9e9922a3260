// Data parallelism with buckets, ZeRO-1, clipping over mesh axes and the loss scaler's agreement,
// each against the single-rank result, on thread ranks.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "mpar/comm/mesh_comms.hpp"
#include "mpar/comm/threads.hpp"
#include "mpar/optim.hpp"
#include "mpar/parallel.hpp"
#include "support/rank_checks.hpp"

using namespace mpar;
using mpar::testing::RankChecks;

namespace {

/**
 * A two-layer perceptron y = tanh(x W1 + b1) W2 + b2 with loss mean_over_batch(0.5 |y - t|^2), written by
 * hand so the tests depend on nothing but nn::Parameter. Samples are a function of their global index.
 */
struct TinyMlp {
  static constexpr std::size_t din = 5, dh = 7, dout = 3;
  nn::Parameter w1, b1, w2, b2;

  TinyMlp() {
    auto mk = [](nn::Parameter& p, const char* name, std::uint64_t id, std::vector<std::size_t> shape) {
      p.name = name;
      p.id = id;
      p.global_shape = shape;
      for (auto e : shape) p.local_box.push_back({0, e});
      p.layout = "Replicate";
      p.initialise(42, InitSpec::normal(0.5));
    };
    mk(w1, "fc1.weight", 1, {din, dh});
    mk(b1, "fc1.bias", 2, {dh});
    mk(w2, "fc2.weight", 3, {dh, dout});
    mk(b2, "fc2.bias", 4, {dout});
  }
  std::vector<nn::Parameter*> params() { return {&w1, &b1, &w2, &b2}; }

  static float input(std::size_t sample, std::size_t i) {
    return float(CounterRng{7, 100 + sample}.uniform(i) * 2 - 1);
  }
  static float target(std::size_t sample, std::size_t i) { return float(CounterRng{9, 100 + sample}.uniform(i)); }

  /** Accumulates the gradient of the mean loss over samples [first, first + count) divided by `batch_div`;
   *  calls `ready(p)` as soon as p's gradient is final (reverse order, as a real backward). */
  void forward_backward(std::size_t first, std::size_t count, double batch_div,
                        const std::function<void(nn::Parameter&)>& ready) {
    std::vector<float> h(count * dh), y(count * dout), dy(count * dout), dh_(count * dh);
    for (std::size_t s = 0; s < count; ++s) {
      for (std::size_t j = 0; j < dh; ++j) {
        float a = b1.value[j];
        for (std::size_t i = 0; i < din; ++i) a += input(first + s, i) * w1.value[i * dh + j];
        h[s * dh + j] = std::tanh(a);
      }
      for (std::size_t k = 0; k < dout; ++k) {
        float a = b2.value[k];
        for (std::size_t j = 0; j < dh; ++j) a += h[s * dh + j] * w2.value[j * dout + k];
        y[s * dout + k] = a;
        dy[s * dout + k] = float((a - target(first + s, k)) / batch_div);
      }
    }
    for (std::size_t s = 0; s < count; ++s)
      for (std::size_t k = 0; k < dout; ++k) b2.grad[k] += dy[s * dout + k];
    ready(b2);
    for (std::size_t s = 0; s < count; ++s)
      for (std::size_t j = 0; j < dh; ++j)
        for (std::size_t k = 0; k < dout; ++k) w2.grad[j * dout + k] += h[s * dh + j] * dy[s * dout + k];
    ready(w2);
    for (std::size_t s = 0; s < count; ++s)
      for (std::size_t j = 0; j < dh; ++j) {
        float a = 0;
        for (std::size_t k = 0; k < dout; ++k) a += dy[s * dout + k] * w2.value[j * dout + k];
        dh_[s * dh + j] = a * (1 - h[s * dh + j] * h[s * dh + j]);
      }
    for (std::size_t s = 0; s < count; ++s)
      for (std::size_t j = 0; j < dh; ++j) b1.grad[j] += dh_[s * dh + j];
    ready(b1);
    for (std::size_t s = 0; s < count; ++s)
      for (std::size_t i = 0; i < din; ++i)
        for (std::size_t j = 0; j < dh; ++j) w1.grad[i * dh + j] += input(first + s, i) * dh_[s * dh + j];
    ready(w1);
  }
};

constexpr std::size_t global_batch = 12;
void no_hook(nn::Parameter&) {}

/** Records, element by element, that `got` has the values (or gradients) of `want` (run on rank threads). */
void check_same(RankChecks& rc, const std::vector<nn::Parameter*>& got, const std::vector<nn::Parameter*>& want,
                bool grads, double tol) {
  rc.expect(got.size() == want.size(), "parameter counts differ");
  for (std::size_t k = 0; k < got.size() && k < want.size(); ++k) {
    const auto& a = grads ? got[k]->grad : got[k]->value;
    const auto& b = grads ? want[k]->grad : want[k]->value;
    if (!rc.expect(a.size() == b.size(), got[k]->name + ": sizes differ")) continue;
    for (std::size_t i = 0; i < a.size(); ++i) rc.close(a[i], b[i], tol, got[k]->name + "[" + std::to_string(i) + "]");
  }
}

}  // namespace

TEST_CASE("Bucket planning fills buckets in reverse parameter order", "[train][dp]") {
  TinyMlp m;  // sizes 35, 7, 21, 3
  auto ps = m.params();
  auto one = parallel::plan_buckets(ps, 1 << 20);
  REQUIRE(one.size() == 1);
  CHECK(one[0].slots.front().param == 3);
  CHECK(one[0].size == 66);
  auto small = parallel::plan_buckets(ps, 20 * sizeof(float));  // a bucket closes once it holds >= 20 floats
  REQUIRE(small.size() == 2);
  CHECK(small[0].size == 24);  // b2 (3) + w2 (21)
  CHECK(small[1].size == 42);  // b1 (7) + w1 (35)
  CHECK(small[1].slots[1].offset == 7);
  CHECK(parallel::plan_buckets(ps, 0).size() == 4);
}

TEST_CASE("Data parallelism with buckets equals the single-rank gradient", "[train][dp]") {
  TinyMlp ref;
  ref.forward_backward(0, global_batch, double(global_batch), no_hook);
  for (int dp : {2, 4}) {
    for (std::size_t bucket_bytes : {std::size_t(0), std::size_t(64), std::size_t(1) << 20}) {
      DYNAMIC_SECTION("dp=" << dp << " bucket_bytes=" << bucket_bytes) {
        RankChecks rc;
        run_threads(dp, [&](ThreadsCommunicator& world) {
          TinyMlp m;
          parallel::DataParallel<ThreadsCommunicator> ddp(m.params(), world, {.bucket_bytes = bucket_bytes});
          const std::size_t local = global_batch / std::size_t(dp);
          // loss = mean over the local batch; DataParallel divides the sum by dp
          std::size_t launched_before_last = 0;
          m.forward_backward(local * std::size_t(world.rank()), local, double(local), [&](nn::Parameter& p) {
            if (&p == &m.w1) launched_before_last = ddp.launched();
            ddp.mark_ready(p);
          });
          ddp.finish();
          check_same(rc, m.params(), ref.params(), true, 1e-5);
          // with more than one bucket, an all-reduce started before the backward's last gradient existed
          if (ddp.bucket_count() > 1)
            rc.expect(launched_before_last >= 1, "no all-reduce launched before the last gradient");
        });
        rc.assert_all(66 * std::size_t(dp));
      }
    }
  }
}

TEST_CASE("Data parallelism with a summed loss divides by the global batch", "[train][dp]") {
  TinyMlp ref;
  ref.forward_backward(0, global_batch, double(global_batch), no_hook);
  RankChecks rc;  // Catch2 assertions are not thread-safe: ranks record, the main thread asserts
  run_threads(3, [&](ThreadsCommunicator& world) {
    TinyMlp m;
    parallel::DataParallel<ThreadsCommunicator> ddp(m.params(), world,
                                                    {.bucket_bytes = 0, .divisor = double(global_batch)});
    const std::size_t local = global_batch / 3;
    m.forward_backward(local * std::size_t(world.rank()), local, 1.0, no_hook);  // sum over local samples
    ddp.finish();                                                                // no hooks: everything reduced here
    check_same(rc, m.params(), ref.params(), true, 1e-5);
  });
  rc.assert_all(3 * 66);
}

TEST_CASE("Bucket overlap: an all-reduce is in flight while the backward still runs", "[train][dp]") {
  RankChecks rc;
  run_threads(2, [&](ThreadsCommunicator& world) {
    TinyMlp m;
    parallel::DataParallel<ThreadsCommunicator> ddp(m.params(), world, {.bucket_bytes = 0});
    std::vector<std::size_t> launched_at;
    m.forward_backward(std::size_t(world.rank()) * 6, 6, 6.0, [&](nn::Parameter& p) {
      ddp.mark_ready(p);
      launched_at.push_back(ddp.launched());
    });
    ddp.finish();
    const std::size_t after = ddp.launched();
    bool unknown_rejected = false;
    nn::Parameter stranger;
    stranger.name = "stranger.weight";
    try {
      ddp.mark_ready(stranger);
    } catch (const config_error& e) {
      const std::string what = e.what();
      unknown_rejected = what.find("mark_ready on rank " + std::to_string(world.rank())) != std::string::npos &&
                         what.find("stranger.weight is not managed here") != std::string::npos;
    }
    rc.expect(ddp.bucket_count() == 4, "bucket count is not 4");
    // one bucket per parameter: each is launched the moment its gradient is marked
    rc.expect(launched_at == std::vector<std::size_t>{1, 2, 3, 4},
              "buckets were not launched as their gradients were marked");
    rc.expect(after == 0, "the launch count was not reset for the next step");
    rc.expect(unknown_rejected, "an unknown parameter was not refused with its name and the rank");
  });
  rc.assert_all(8);
}

namespace {
/** The AdamW settings of the ZeRO tests: weight decay on the matrices only. */
optim::AdamWConfig zero_test_adamw() {
  return {.lr = 0.05f,
          .beta1 = 0.9f,
          .beta2 = 0.99f,
          .eps = 1e-8f,
          .weight_decay = 0.1f,
          .decays = [](const nn::Parameter& p) { return p.global_shape.size() >= 2; }};
}

/** The single-rank reference of the ZeRO tests: `steps` AdamW steps of `ref` on the full batch. */
void train_single_rank_adamw(TinyMlp& ref, const optim::AdamWConfig& cfg, int steps) {
  optim::AdamW ref_opt(ref.params(), cfg);
  for (int s = 0; s < steps; ++s) {
    ref_opt.zero_grad();
    ref.forward_backward(std::size_t(s) * global_batch, global_batch, double(global_batch), no_hook);
    ref_opt.step(cfg.lr);
  }
}

/**
 * Runs `on_rank(world, first, local, bucket_bytes, rc)` — one rank's part of a ZeRO test, on its `local` samples
 * from `first` — on dp = 2, 3 and 4 thread ranks, with one bucket and with 80-byte buckets, each in a section of
 * its own; every rank makes `checks_per_rank` checks.
 */
template <class OnRank>
void for_each_zero_layout(std::size_t checks_per_rank, OnRank on_rank) {
  for (int dp : {2, 3, 4}) {
    for (std::size_t bucket_bytes : {std::size_t(0), std::size_t(80)}) {
      DYNAMIC_SECTION("dp=" << dp << " bucket_bytes=" << bucket_bytes) {
        RankChecks rc;
        run_threads(dp, [&](ThreadsCommunicator& world) {
          const std::size_t local = global_batch / std::size_t(dp);
          on_rank(world, local * std::size_t(world.rank()), local, bucket_bytes, rc);
        });
        rc.assert_all(checks_per_rank * std::size_t(dp));
      }
    }
  }
}
}  // namespace

TEST_CASE("ZeRO-1 AdamW equals data parallelism with AdamW over several steps", "[train][zero]") {
  const optim::AdamWConfig cfg = zero_test_adamw();
  const int steps = 4;
  TinyMlp ref;
  train_single_rank_adamw(ref, cfg, steps);
  for_each_zero_layout(2 * 66, [&](ThreadsCommunicator& world, std::size_t first, std::size_t local,
                                   std::size_t bucket_bytes, RankChecks& rc) {
    TinyMlp a, z;  // a: DataParallel + AdamW, z: ZeRO-1
    parallel::DataParallel<ThreadsCommunicator> ddp(a.params(), world, {.bucket_bytes = bucket_bytes});
    optim::AdamW opt(a.params(), cfg);
    parallel::Zero1AdamW<ThreadsCommunicator> zero(z.params(), world, cfg, {.bucket_bytes = bucket_bytes});
    for (int s = 0; s < steps; ++s) {
      opt.zero_grad();
      a.forward_backward(std::size_t(s) * global_batch + first, local, double(local),
                         [&](nn::Parameter& p) { ddp.mark_ready(p); });
      ddp.finish();
      opt.step(cfg.lr);
      zero.zero_grad();
      z.forward_backward(std::size_t(s) * global_batch + first, local, double(local),
                         [&](nn::Parameter& p) { zero.mark_ready(p); });
      zero.step(cfg.lr);
    }
    check_same(rc, z.params(), a.params(), false, 1e-6);
    check_same(rc, z.params(), ref.params(), false, 1e-5);
    // states are sharded: about 2 * 66 / dp floats here, never the full 132
    rc.expect(zero.state_elements() <= 2 * (66 / std::size_t(world.size()) + zero.bucket_count()),
              "optimizer state is not sharded");
  });
}

TEST_CASE("ZeRO-1, -2 and -3 on one rank update their shard as AdamW updates each parameter, bit for bit",
          "[train][zero]") {
  // On one rank the reduce-scatter hands back the gradient and the average divides by 1, so ZeRO's one update
  // over its shard (four buckets, one per parameter, whose blocks lie back to back; the weight decay of the
  // matrices but not of the biases, alternating along the shard, comes from the run table) must give
  // optim::AdamW's update of each parameter on its own exactly.
  const optim::AdamWConfig cfg = zero_test_adamw();
  using parallel::ZeroStage;
  for (ZeroStage stage : {ZeroStage::optimizer_states, ZeroStage::gradients, ZeroStage::parameters}) {
    DYNAMIC_SECTION("stage " << parallel::stage_number(stage)) {
      RankChecks rc;
      run_threads(1, [&](ThreadsCommunicator& world) {
        TinyMlp ref, z;
        optim::AdamW ref_opt(ref.params(), cfg);
        parallel::ZeroAdamW<ThreadsCommunicator> zero(z.params(), world, cfg, {.bucket_bytes = 0, .stage = stage});
        rc.expect(zero.bucket_count() == 4, "bucket_bytes = 0 should give each of the 4 parameters a bucket");
        for (int s = 0; s < 3; ++s) {
          ref_opt.zero_grad();
          ref.forward_backward(std::size_t(s) * global_batch, global_batch, double(global_batch), no_hook);
          ref_opt.step(cfg.lr);
          zero.zero_grad();
          zero.prepare_gradients();
          if (stage == ZeroStage::parameters) zero.gather_all();
          z.forward_backward(std::size_t(s) * global_batch, global_batch, double(global_batch),
                             [&](nn::Parameter& p) { zero.mark_ready(p); });
          if (stage == ZeroStage::parameters) zero.release_all();
          zero.step(cfg.lr);
        }
        if (stage == ZeroStage::parameters) zero.gather_all();
        for (std::size_t k = 0; k < ref.params().size(); ++k) {
          const auto &got = z.params()[k]->value, &want = ref.params()[k]->value;
          if (!rc.expect(got.size() == want.size(), z.params()[k]->name + ": sizes differ")) continue;
          for (std::size_t i = 0; i < want.size(); ++i)
            rc.expect(got[i] == want[i], z.params()[k]->name + "[" + std::to_string(i) + "] differs");
        }
        if (stage == ZeroStage::parameters) zero.release_all();
      });
      rc.assert_all(1 + 66);
    }
  }
}

TEST_CASE("ZeRO-2 AdamW equals single-rank AdamW, releasing each gradient as its bucket takes it",
          "[train][zero][zero2]") {
  const optim::AdamWConfig cfg = zero_test_adamw();
  const int steps = 4;
  TinyMlp ref;
  train_single_rank_adamw(ref, cfg, steps);
  for_each_zero_layout(66 + 5, [&](ThreadsCommunicator& world, std::size_t first, std::size_t local,
                                   std::size_t bucket_bytes, RankChecks& rc) {
    TinyMlp z;
    parallel::ZeroAdamW<ThreadsCommunicator> zero(
        z.params(), world, cfg,
        {.bucket_bytes = bucket_bytes, .stage = parallel::ZeroStage::gradients, .in_flight = 1});
    std::size_t largest_bucket = 0;
    const std::size_t shards = zero.gradient_buffer_elements();  // before any step: the shards alone
    std::size_t total = 0;
    for (auto* p : z.params()) total += p->value.size(), largest_bucket = std::max(largest_bucket, p->value.size());
    if (bucket_bytes) largest_bucket += bucket_bytes / sizeof(float);  // a bucket closes past its bound
    bool released = true, bounded = true;
    std::size_t peak = 0;
    for (int s = 0; s < steps; ++s) {
      zero.zero_grad();
      for (auto* p : z.params()) released = released && p->grad.empty();  // nothing full-size between steps
      zero.prepare_gradients();
      z.forward_backward(std::size_t(s) * global_batch + first, local, double(local), [&](nn::Parameter& p) {
        zero.mark_ready(p);
        released = released && p.grad.empty();
        const std::size_t now = zero.gradient_buffer_elements() - shards;
        peak = std::max(peak, now);
        // in_flight = 1: the bucket being filled and the one in flight (an older one was waited for and freed)
        bounded = bounded && now <= 2 * largest_bucket;
      });
      zero.step(cfg.lr);
      released = released && zero.gradient_buffer_elements() == shards && zero.gather_buffer_elements() == 0;
    }
    check_same(rc, z.params(), ref.params(), false, 1e-5);
    rc.expect(released, "a full-size gradient, bucket or gather buffer outlived its use");
    rc.expect(bounded, "more full-size buckets were alive than the in-flight bound allows");
    rc.expect(peak > 0, "no bucket memory was ever seen (the check above would be void)");
    rc.expect(shards <= total / std::size_t(world.size()) + zero.bucket_count(), "the gradient shards are not 1/dp");
    rc.expect(zero.stage() == parallel::ZeroStage::gradients, "not stage 2");
  });
  RankChecks bad;
  run_threads(2, [&](ThreadsCommunicator& world) {
    TinyMlp z;
    std::string what;
    try {
      parallel::ZeroAdamW<ThreadsCommunicator> zero(z.params(), world, cfg, {.stage = parallel::ZeroStage::none});
    } catch (const std::exception& e) {
      what = e.what();
    }
    bad.expect(what.find("stage 0 is not 1, 2 or 3") != std::string::npos && what.find("rank") != std::string::npos,
               "ZeRO without a sharded state was not refused naming the stage and the rank: " + what);
  });
  bad.assert_all(1);
}

TEST_CASE("ZeRO-1 gradient norm and clipping equal the single-rank ones", "[train][zero]") {
  // One AdamW step moves every weight by about lr * sign(g) whatever the gradient's scale, so the weights
  // alone barely see clipping. The first moment does: after one step m = (1 - beta1) * c * g with the
  // clip coefficient c = max_norm / ||g|| written here by hand. A second step (with its own clipping)
  // then has to match the single-rank run as well.
  constexpr double max_norm = 0.1;
  constexpr float beta1 = 0.9f;
  TinyMlp ref;
  ref.forward_backward(0, global_batch, double(global_batch), no_hook);
  double sq = 0;
  for (const nn::Parameter* p : ref.params())
    for (float g : p->grad) sq += double(g) * g;
  const double want = std::sqrt(sq), hand_coef = max_norm / want;
  REQUIRE(hand_coef < 0.5);                           // the gradient is clipped to well below its size
  std::map<std::string, std::vector<double>> want_m;  // the first moment after one clipped step, by hand
  for (const nn::Parameter* p : ref.params())
    for (float g : p->grad) want_m[p->name].push_back((1.0 - beta1) * hand_coef * g);
  optim::AdamW ref_opt(ref.params(), {.lr = 0.1f, .beta1 = beta1, .weight_decay = 0.0f});
  ref_opt.step(0.1f, optim::clip_coefficient(want, max_norm));
  ref_opt.zero_grad();
  ref.forward_backward(global_batch, global_batch, double(global_batch), no_hook);
  const double want2 = optim::grad_norm(ref.params());
  ref_opt.step(0.1f, optim::clip_coefficient(want2, max_norm));
  RankChecks rc;
  std::mutex mu;
  std::size_t moments_seen = 0;
  run_threads(4, [&](ThreadsCommunicator& world) {
    TinyMlp z;
    parallel::Zero1AdamW<ThreadsCommunicator> zero(
        z.params(), world, {.lr = 0.1f, .beta1 = beta1, .weight_decay = 0.0f}, {.bucket_bytes = 48});
    z.forward_backward(3 * std::size_t(world.rank()), 3, 3.0, no_hook);
    const double norm = zero.grad_norm();
    zero.step(0.1f, optim::clip_coefficient(norm, max_norm));
    rc.close(norm, want, 1e-6, "gradient norm of step 1");
    std::size_t seen = 0;
    for (const auto& piece : zero.state_pieces())
      for (std::size_t i = 0; i < piece.m.size(); ++i, ++seen)
        rc.close(piece.m[i], want_m[piece.param->name][piece.param_offset + i], 1e-6,
                 "first moment of " + piece.param->name + "[" + std::to_string(piece.param_offset + i) + "]");
    zero.zero_grad();
    z.forward_backward(global_batch + 3 * std::size_t(world.rank()), 3, 3.0, no_hook);
    const double norm2 = zero.grad_norm();
    zero.step(0.1f, optim::clip_coefficient(norm2, max_norm));
    rc.close(norm2, want2, 1e-6, "gradient norm of step 2");
    check_same(rc, z.params(), ref.params(), false, 1e-6);
    std::lock_guard l(mu);
    moments_seen += seen;
  });
  CHECK(moments_seen == 66);  // every element's moment is held by exactly one rank
  rc.assert_all(4 * (2 + 66) + 66);
}

namespace {
/** A parameter of global shape `shape` holding the block of `shard_dim` (or everything when -1) for part `part`
 *  of `parts`; gradient element g = sin(0.37 g_index + id). */
nn::Parameter sharded_param(std::uint64_t id, std::vector<std::size_t> shape, int shard_dim, std::size_t parts,
                            std::size_t part) {
  nn::Parameter p;
  p.name = "p" + std::to_string(id);
  p.id = id;
  p.global_shape = shape;
  for (std::size_t d = 0; d < shape.size(); ++d)
    p.local_box.push_back(int(d) == shard_dim ? block_of(shape[d], parts, part) : Block{0, shape[d]});
  p.sharded_over_tensor = shard_dim >= 0 && parts > 1;
  p.layout = shard_dim >= 0 ? "Shard<" + std::to_string(shard_dim) + ", tensor>" : "Replicate";
  p.initialise(1, InitSpec::constant(0.0));
  // fill the gradient from global indices (2-D or 1-D)
  const std::size_t cols = shape.size() == 2 ? shape[1] : 1;
  const std::size_t lc = shape.size() == 2 ? p.local_box[1].extent : 1;
  for (std::size_t k = 0; k < p.grad.size(); ++k) {
    const std::size_t r = p.local_box[0].offset + k / lc, c = (shape.size() == 2 ? p.local_box[1].offset : 0) + k % lc;
    p.grad[k] = float(std::sin(0.37 * double(r * cols + c) + double(id)));
  }
  return p;
}

int shard_dim_of(std::uint64_t id) { return id % 3 == 0 ? 1 : id % 3 == 1 ? 0 : -1; }

/** Stage `stage` of `stages` owns parameters ids with id % stages == stage. */
std::vector<nn::Parameter> model_shard(std::size_t tp, std::size_t t, std::size_t stages, std::size_t stage) {
  std::vector<nn::Parameter> out;
  for (std::uint64_t id = 0; id < 6; ++id) {
    if (id % stages != stage) continue;
    // a column-parallel weight, an unevenly sharded vector, a replicated vector (a norm gain)
    const std::vector<std::size_t> shape = id % 3 == 0   ? std::vector<std::size_t>{8, 6}
                                           : id % 3 == 1 ? std::vector<std::size_t>{7}
                                                         : std::vector<std::size_t>{5};
    out.push_back(sharded_param(id, shape, shard_dim_of(id), tp, t));
  }
  return out;
}
}  // namespace

TEST_CASE("Clipping equals single-rank clipping for tensor-sharded and replicated parameters", "[train][clip]") {
  auto full = model_shard(1, 0, 1, 0);
  std::vector<nn::Parameter*> fp;
  for (auto& p : full) fp.push_back(&p);
  const double want = optim::clip_grad_norm(fp, 1.0);
  REQUIRE(want > 1.0);
  struct Shape {
    std::size_t tp, pp, dp;
  };
  for (Shape sh : {Shape{2, 1, 1}, Shape{4, 1, 1}, Shape{2, 1, 2}, Shape{2, 2, 1}, Shape{1, 2, 2}}) {
    DYNAMIC_SECTION("tp=" << sh.tp << " pp=" << sh.pp << " dp=" << sh.dp) {
      RankChecks rc;
      const DynamicMesh mesh(sh.tp, sh.pp, sh.dp, std::size_t(1));
      run_threads(int(mesh.world_size()), [&](ThreadsCommunicator& world) {
        auto comms = make_mesh_comms(world, mesh);
        const MeshCoord c = mesh.coord(std::size_t(world.rank()));
        auto mine = model_shard(sh.tp, c.tensor, sh.pp, c.pipeline);
        std::vector<nn::Parameter*> ps;
        for (auto& p : mine) ps.push_back(&p);
        const double norm = optim::clip_grad_norm(ps, 1.0, comms.tensor, comms.pipeline);
        const double after = optim::grad_norm(ps, comms.tensor, comms.pipeline);
        rc.expect(norm == Approx(want).epsilon(1e-9), "norm " + std::to_string(norm) + " vs " + std::to_string(want));
        const double coef = 1.0 / want;  // max_norm / ||g||, by hand
        for (auto& p : mine) {
          const auto expect = sharded_param(p.id, p.global_shape, shard_dim_of(p.id), sh.tp, c.tensor);
          for (std::size_t i = 0; i < p.grad.size(); ++i)
            rc.expect(p.grad[i] == Approx(expect.grad[i] * coef).epsilon(1e-5),
                      p.name + "[" + std::to_string(i) + "] clipped wrongly");
        }
        rc.expect(after == Approx(1.0).epsilon(1e-5), "norm after clipping is " + std::to_string(after));
      });
      rc.assert_all(std::size_t(mesh.world_size()) * 2);
    }
  }
}

TEST_CASE("Loss-scaler overflow is agreed by every rank", "[train][mixed]") {
  RankChecks rc;
  run_threads(4, [&](ThreadsCommunicator& world) {
    optim::DynamicLossScaler scaler({.initial_scale = 256.0f, .growth_interval = 2});
    nn::Parameter p;
    p.value = {1.0f};
    p.grad = {world.rank() == 2 ? std::numeric_limits<float>::infinity() : 512.0f};
    std::vector<nn::Parameter*> ps{&p};
    const bool ok = scaler.unscale_and_check(ps, world);
    scaler.update(ok);
    const float lowered = scaler.scale();
    p.grad = {256.0f};
    const bool ok2 = scaler.unscale_and_check(ps, world);
    rc.expect(!ok, "rank 2 overflowed, yet this rank did not skip");
    rc.expect(lowered == 128.0f, "the scale was not halved");
    rc.expect(ok2, "a finite step was skipped");
    rc.expect(p.grad[0] == 2.0f, "the gradient was not unscaled");
  });
  rc.assert_all(16);
}

TEST_CASE("bf16 and f16 compute copies round the masters and accumulate in fp32", "[train][mixed]") {
  nn::Parameter p;
  p.value = {1.0f + 1.0f / 256.0f + 1.0f / 1024.0f, 70000.0f, -0.5f};
  p.grad = {0.0f, 0.0f, 0.0f};
  parallel::ComputeCopies<bf16> b({&p});
  CHECK(float(b.weights(0)[0]) == 1.0f + 1.0f / 128.0f);  // 7 stored mantissa bits: above half an ulp, rounds up
  CHECK(float(b.weights(0)[2]) == -0.5f);
  parallel::ComputeCopies<f16> h({&p});
  CHECK(std::isinf(float(h.weights(0)[1])));  // beyond f16's range: why f16 needs loss scaling
  CHECK(h.bytes() == 6);
  std::vector<f16> g{f16(0.25f), f16(1.5f), f16(-2.0f)};
  h.add_grad(0, g);
  h.add_grad(0, g);
  CHECK(std::vector<float>(p.grad.begin(), p.grad.end()) == std::vector<float>{0.5f, 3.0f, -4.0f});
  p.value[2] = 3.0f;
  h.refresh();
  CHECK(float(h.weights(0)[2]) == 3.0f);
}

TEST_CASE("f16 gradients survive with loss scaling and underflow without it", "[train][mixed]") {
  // a gradient of 1e-8 is below f16's smallest subnormal (6e-8): computed in f16 it vanishes
  nn::Parameter p;
  p.value = {0.5f, -0.25f};
  p.grad = {0.0f, 0.0f};
  std::vector<nn::Parameter*> ps{&p};
  parallel::ComputeCopies<f16> half(ps);
  const std::vector<float> true_grad{1e-8f, -2e-8f};
  auto backward16 = [&](float loss_scale) {  // what an f16 backward seeded with dy = loss_scale produces
    std::vector<f16> g16{f16(true_grad[0] * loss_scale), f16(true_grad[1] * loss_scale)};
    half.add_grad(0, g16);
  };
  backward16(1.0f);
  CHECK(std::vector<float>(p.grad.begin(), p.grad.end()) == std::vector<float>{0.0f, 0.0f});  // lost
  p.zero_grad();
  optim::DynamicLossScaler scaler({.initial_scale = 65536.0f});
  backward16(scaler.scale());
  REQUIRE(scaler.unscale_and_check(ps));
  CHECK(p.grad[0] == Approx(true_grad[0]).epsilon(1e-3));  // f16 keeps 11 significant bits
  CHECK(p.grad[1] == Approx(true_grad[1]).epsilon(1e-3));
  // too large a scale overflows f16 instead: the step is skipped and the scale halved
  p.zero_grad();
  optim::DynamicLossScaler big({.initial_scale = 16777216.0f});
  std::vector<f16> huge{f16(1e-2f * big.scale()), f16(0.0f)};
  half.add_grad(0, huge);
  const bool ok = big.unscale_and_check(ps);
  CHECK_FALSE(ok);
  big.update(ok);
  CHECK(big.scale() == 8388608.0f);
}

TEST_CASE("ZeRO-1 gradient norm over tensor x pipeline x data meshes equals the single-rank norm",
          "[train][zero][clip]") {
  auto full = model_shard(1, 0, 1, 0);
  std::vector<nn::Parameter*> fp;
  for (auto& p : full) fp.push_back(&p);
  const double want = optim::grad_norm(fp);
  struct Shape {
    std::size_t tp, pp, dp;
  };
  for (Shape sh : {Shape{2, 1, 2}, Shape{2, 2, 2}, Shape{1, 2, 3}}) {
    DYNAMIC_SECTION("tp=" << sh.tp << " pp=" << sh.pp << " dp=" << sh.dp) {
      RankChecks rc;
      const DynamicMesh mesh(sh.tp, sh.pp, sh.dp, std::size_t(1));
      run_threads(int(mesh.world_size()), [&](ThreadsCommunicator& world) {
        auto comms = make_mesh_comms(world, mesh);
        const MeshCoord c = mesh.coord(std::size_t(world.rank()));
        auto mine = model_shard(sh.tp, c.tensor, sh.pp, c.pipeline);  // equal gradients on every data replica
        std::vector<nn::Parameter*> ps;
        for (auto& p : mine) ps.push_back(&p);
        parallel::Zero1AdamW<ThreadsCommunicator> zero(ps, comms.data, {.lr = 0.0f}, {.bucket_bytes = 40});
        const double n = zero.grad_norm(comms.tensor, comms.pipeline);
        // the fp32 average (3 g) / 3 may differ from g in the last bit
        rc.expect(n == Approx(want).epsilon(1e-6), "norm " + std::to_string(n) + " vs " + std::to_string(want));
      });
      rc.assert_all(mesh.world_size());
    }
  }
}
