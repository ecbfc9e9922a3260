// Equivalence tests: every tensor-parallel configuration reproduces the single-rank layers.
// Tolerance (stated once, used everywhere): norm-relative ||parallel - serial||_2 <= 1e-5 ||serial||_2,
// for the forward output, the input gradient and EVERY parameter gradient; initial parameter values
// must be bit-identical (sharding-independent initialisation).
#include <catch2/catch.hpp>

#include <mpar/comm/threads.hpp>
#include <mpar/observe/counting_backend.hpp>

#include "call_layer.hpp"
#include "counting_communicator.hpp"
#include "nn_test_support.hpp"

using namespace mpar;
using namespace mpar::nn;
using namespace mpar::testing;
using Comm = ThreadsCommunicator;

namespace {

/** What a parallel run produced, re-assembled into global tensors. */
struct ParallelResult {
  Activation y, dx;
  Assembled params;
  std::mutex m;
};

void require_params_match(Assembled& par, Assembled& ref) {
  CHECK(par.replica_mismatch < 1e-6);
  for (const auto& [name, g] : ref.grad) {
    INFO("parameter " << name);
    REQUIRE(par.grad.count(name) == 1);
    CHECK(par.value[name] == ref.value[name]);  // bit-identical initialisation
    CHECK(rel_err(par.grad[name], g) <= rel_tol);
  }
  CHECK(par.grad.size() == ref.grad.size());
}

void require_close(const Activation& a, const Activation& b, const char* what) {
  INFO(what);
  REQUIRE(a.shape() == b.shape());
  CHECK(rel_err(a.values(), b.values()) <= rel_tol);
}

/**
 * Runs `make(tp)` (a layer on the tensor group) on `p` ranks with input `x` and output gradient `dy`
 * (global, in layout `L` on the way in and out), re-assembling outputs, input gradients and parameters.
 */
template <class L, class Make>
void run_parallel(int p, const Activation& x, const Activation& dy, ParallelResult& out, Make make) {
  out.y = Activation({x.extent(0), dy.extent(1)});
  out.dx = Activation(x.shape());
  run_threads(p, [&](Comm& tp) {
    auto layer = make(tp);
    const auto n = std::size_t(p), r = std::size_t(tp.rank());
    // Typed: the layer must return layout L and take (and return) gradients in L.
    const Act<L> y = layer.forward(Act<L>(local_block<L>(x, n, r)), 0);
    const Act<L> dx = layer.backward(Act<L>(local_block<L>(dy, n, r)), 0);
    {
      std::lock_guard lock(out.m);
      put_block<L>(out.y, y.tensor(), n, r);
      put_block<L>(out.dx, dx.tensor(), n, r);
    }
    out.params.add(layer.parameters());
  });
}

template <class Ref>
void run_serial(Ref& ref, const Activation& x, const Activation& dy, Activation& y, Activation& dx, Assembled& params) {
  if constexpr (requires { typename Ref::default_input; }) {  // an nn layer or stage: through its typed API
    y = testing::forward(ref, x, 0);
    dx = testing::backward(ref, dy, 0);
  } else {  // a reference written in this file on plain tensors
    y = ref.forward(x, 0);
    dx = ref.backward(dy, 0);
  }
  params.add(ref.parameters());
}

constexpr std::uint64_t seed = 7;

}  // namespace

TEMPLATE_TEST_CASE("MLP: TP = 1, 2, 4 match the serial MLP", "[nn][mlp]", std::false_type, std::true_type) {
  constexpr bool sp = TestType::value;
  using L = std::conditional_t<sp, TokenShard, Replicate>;
  const MlpConfig cfg{16, 32, seed, 100, "mlp"};
  const Activation x = random_activation(8, 16, 1), dy = random_activation(8, 16, 2);
  auto ref = make_serial_mlp(cfg);
  Activation y, dx;
  Assembled rp;
  run_serial(ref, x, dy, y, dx, rp);
  for (int p : {1, 2, 4}) {
    INFO("TP = " << p << (sp ? " with sequence parallelism" : ""));
    ParallelResult out;
    run_parallel<L>(p, x, dy, out, [&](Comm& tp) { return make_mlp<Comm, dyn, dyn, dyn, TestType::value>(tp, cfg); });
    require_close(out.y, y, "forward output");
    require_close(out.dx, dx, "input gradient");
    require_params_match(out.params, rp);
  }
}

TEMPLATE_TEST_CASE("Self-attention split by heads: TP = 1, 2, 4 match the serial attention", "[nn][attention]",
                   std::false_type, std::true_type) {
  constexpr bool sp = TestType::value;
  using L = std::conditional_t<sp, TokenShard, Replicate>;
  const AttentionConfig cfg{16, 4, 4, seed, 200, "attn"};  // batch 2 x seq 4 = 8 tokens
  const Activation x = random_activation(8, 16, 3), dy = random_activation(8, 16, 4);
  Attention<> ref(cfg);
  Activation y, dx;
  Assembled rp;
  run_serial(ref, x, dy, y, dx, rp);
  for (int p : {1, 2, 4}) {
    INFO("TP = " << p << (sp ? " with sequence parallelism" : ""));
    ParallelResult out;
    run_parallel<L>(p, x, dy, out,
                    [&](Comm& tp) { return SelfAttention<Comm, dyn, dyn, dyn, TestType::value>(tp, cfg); });
    require_close(out.y, y, "forward output");
    require_close(out.dx, dx, "input gradient");
    require_params_match(out.params, rp);
  }
}

namespace {
/** The single-rank pre-LN block assembled from serial layers with the same ids and dropout streams. */
struct SerialBlock {
  LayerNorm<> ln1, ln2;
  Attention<> attn;
  Dropout<> d1, d2;
  SerialMlp<> mlp;
  explicit SerialBlock(const BlockConfig& c)
      : ln1(c.hidden, c.seed, c.id_base + 0, c.name + ".ln1"), ln2(c.hidden, c.seed, c.id_base + 6, c.name + ".ln2"),
        attn(AttentionConfig{c.hidden, c.heads, c.seq, c.seed, c.id_base + 2, c.name + ".attn"}),
        d1(c.dropout, c.seed, c.id_base + 12), d2(c.dropout, c.seed, c.id_base + 13),
        mlp(make_serial_mlp(MlpConfig{c.hidden, c.ffn, c.seed, c.id_base + 8, c.name + ".mlp"})) {}
  Activation forward(const Activation& x, int mb) {
    Activation h = testing::forward(d1, testing::forward(attn, testing::forward(ln1, x, mb), mb), mb);
    host::add(h.size(), h.data(), x.data(), h.data());
    Activation y = testing::forward(d2, testing::forward(mlp, testing::forward(ln2, h, mb), mb), mb);
    host::add(y.size(), y.data(), h.data(), y.data());
    return y;
  }
  Activation backward(const Activation& dy, int mb) {
    Activation dh = testing::backward(ln2, testing::backward(mlp, testing::backward(d2, dy, mb), mb), mb);
    host::add(dh.size(), dh.data(), dy.data(), dh.data());
    Activation dx = testing::backward(ln1, testing::backward(attn, testing::backward(d1, dh, mb), mb), mb);
    host::add(dx.size(), dx.data(), dh.data(), dx.data());
    return dx;
  }
  std::vector<Parameter*> parameters() {
    auto ps = ln1.parameters();
    nn::detail::append(ps, attn.parameters());
    nn::detail::append(ps, ln2.parameters());
    nn::detail::append(ps, mlp.parameters());
    return ps;
  }
};
}  // namespace

TEMPLATE_TEST_CASE("Transformer block (dropout 0.1): TP = 1, 2, 4 match the serial block", "[nn][block]",
                   std::false_type, std::true_type) {
  constexpr bool sp = TestType::value;
  using L = std::conditional_t<sp, TokenShard, Replicate>;
  const BlockConfig cfg{16, 4, 64, 4, 0.1, seed, 300, "block"};
  const Activation x = random_activation(8, 16, 5), dy = random_activation(8, 16, 6);
  SerialBlock ref(cfg);
  Activation y, dx;
  Assembled rp;
  run_serial(ref, x, dy, y, dx, rp);
  REQUIRE(rp.grad.size() == 12);
  for (int p : {1, 2, 4}) {
    INFO("TP = " << p << (sp ? " with sequence parallelism" : ""));
    ParallelResult out;
    run_parallel<L>(p, x, dy, out, [&](Comm& tp) { return TransformerBlock<Comm, TestType::value>(tp, cfg); });
    require_close(out.y, y, "forward output");
    require_close(out.dx, dx, "input gradient");
    require_params_match(out.params, rp);
  }
}

TEST_CASE("Transformer block: micro-batches in flight and recomputation give the same gradients", "[nn][block]") {
  const BlockConfig cfg{16, 4, 64, 4, 0.1, seed, 300, "block"};
  const Activation x0 = random_activation(8, 16, 7), x1 = random_activation(8, 16, 8);
  const Activation dy0 = random_activation(8, 16, 9), dy1 = random_activation(8, 16, 10);
  Assembled sequential, interleaved;
  Activation dx0_seq, dx0_int;
  std::mutex m;
  run_threads(2, [&](Comm& tp) {
    const std::size_t r = std::size_t(tp.rank());
    TransformerBlock<Comm> a(tp, cfg), b(tp, cfg);
    // a: one micro-batch at a time.
    testing::forward(a, x0, 0);
    Activation d0 = testing::backward(a, dy0, 0);
    testing::forward(a, x1, 1);
    testing::backward(a, dy1, 1);
    // b: both in flight (1F1B-like order), with full recomputation.
    b.set_recompute(true);
    testing::forward(b, x0, 0);
    testing::forward(b, x1, 1);
    testing::backward(b, dy1, 1);
    Activation e0 = testing::backward(b, dy0, 0);
    sequential.add(a.parameters());
    interleaved.add(b.parameters());
    if (r == 0) {
      std::lock_guard l(m);
      dx0_seq = d0, dx0_int = e0;
    }
  });
  CHECK(rel_err(dx0_int.values(), dx0_seq.values()) <= rel_tol);
  for (const auto& [name, g] : sequential.grad) {
    INFO(name);
    CHECK(rel_err(interleaved.grad[name], g) <= rel_tol);
  }
}

TEMPLATE_TEST_CASE("Vocab-parallel embedding + LM head + cross-entropy match the serial loss and gradients",
                   "[nn][loss]", std::false_type, std::true_type) {
  constexpr bool sp = TestType::value;
  constexpr std::size_t vocab = 24, hidden = 8, tokens = 8;
  const std::vector<std::int32_t> tok{0, 5, 23, 11, 12, 6, 17, 5}, target{5, 23, 11, 12, 6, 17, 5, 0};
  const EmbeddingConfig ecfg{vocab, hidden, seed, 400, "embed"};
  const LinearInit head_init{seed, 402, "head", false};
  // Serial: embedding -> Linear(hidden, vocab) -> softmax cross-entropy.
  Embedding emb(ecfg);
  Linear<> head(hidden, vocab, head_init);
  Activation logits = head.forward(emb.embed(tok)).tensor();
  Activation probs(logits.shape()), dlogits(logits.shape());
  const float loss = host::cross_entropy_forward(tokens, vocab, logits.data(), target.data(), probs.data());
  host::cross_entropy_backward(tokens, vocab, probs.data(), target.data(), dlogits.data());
  emb.backward(head.backward(Act<Replicate>(dlogits)));
  Assembled rp;
  rp.add(emb.parameters());
  rp.add(head.parameters());

  for (int p : {1, 2, 4}) {
    INFO("TP = " << p << (sp ? " with sequence parallelism" : ""));
    Assembled pp;
    std::vector<float> losses(static_cast<std::size_t>(p));
    run_threads(p, [&](Comm& tp) {
      VocabParallelEmbedding<Comm, TestType::value> pemb(tp, ecfg);
      ColumnParallel<Comm, dyn, dyn, dyn, ColumnOptions{TestType::value, false, 1}> phead(tp, hidden, vocab, head_init);
      VocabParallelCrossEntropy<Comm> ce(tp, vocab);
      // Typed: the embedding returns Replicate (SP: Shard<0, tensor>), the head Shard<1, tensor> logits,
      // which is what the vocab-parallel loss takes; the gradients flow back in the same layouts.
      const float l = ce.forward(phead.forward(pemb.embed(tok)), target);
      pemb.backward(phead.backward(ce.logits_gradient()));
      losses[std::size_t(tp.rank())] = l;
      pp.add(pemb.parameters());
      pp.add(phead.parameters());
    });
    for (float l : losses) CHECK(std::abs(l - loss) <= rel_tol * std::abs(loss));
    require_params_match(pp, rp);
  }
}

TEST_CASE("2D tensor parallelism (SUMMA, 2 x 2 grid) matches the serial Linear", "[nn][2d]") {
  constexpr std::size_t t = 8, in = 8, out = 12, q = 2;
  const LinearInit init{seed, 500, "fc2d", true};
  const Activation x = random_activation(t, in, 11), dy = random_activation(t, out, 12);
  Linear<> ref(in, out, init);
  Activation y, dx;
  Assembled rp;
  run_serial(ref, x, dy, y, dx, rp);
  Activation py({t, out}), pdx({t, in});
  Assembled pp;
  std::mutex m;
  run_threads(int(q * q), [&](Comm& tp) {
    auto grid = make_tensor_grid(tp, q, q);
    Linear2D<Comm> layer(grid, in, out, init);
    const std::size_t i = grid.i(), j = grid.j();
    auto block = [&](const Activation& g) {  // this rank's block X_ij, typed as the grid shard it is
      return Act<GridShard>(Activation(g.slice(0, i * g.extent(0) / q, (i + 1) * g.extent(0) / q)
                                           .slice(1, j * g.extent(1) / q, (j + 1) * g.extent(1) / q)));
    };
    Activation ly = layer.forward(block(x)).tensor();
    Activation ldx = layer.backward(block(dy)).tensor();
    {
      std::lock_guard l(m);
      copy_into(ly.view(), py.slice(0, i * t / q, (i + 1) * t / q).slice(1, j * out / q, (j + 1) * out / q));
      copy_into(ldx.view(), pdx.slice(0, i * t / q, (i + 1) * t / q).slice(1, j * in / q, (j + 1) * in / q));
    }
    pp.add(layer.parameters());
  });
  require_close(py, y, "forward output");
  require_close(pdx, dx, "input gradient");
  require_params_match(pp, rp);
}

TEST_CASE("Collectives per layer: the MLP does one all-reduce forward and one backward", "[nn][collectives]") {
  using CC = CountingCommunicator<Comm>;
  const MlpConfig cfg{16, 32, seed, 100, "mlp"};
  const BlockConfig bcfg{16, 4, 64, 4, 0.0, seed, 300, "block"};
  const Activation x = random_activation(8, 16, 1);
  std::mutex m;
  std::vector<CollectiveCounts> fwd, bwd, sp_fwd, sp_bwd, blk_fwd, blk_bwd;
  run_threads(2, [&](Comm& raw) {
    CC tp(raw);
    auto mlp = make_mlp<CC>(tp, cfg);
    auto mlp_sp = make_mlp<CC, dyn, dyn, dyn, true>(tp, cfg);
    TransformerBlock<CC> blk(tp, bcfg);
    auto step = [&](auto& layer, const Activation& in, std::vector<CollectiveCounts>& f,
                    std::vector<CollectiveCounts>& b) {
      tp.counts().reset();
      Activation y = testing::forward(layer, in);
      CollectiveCounts cf = tp.counts();
      tp.counts().reset();
      testing::backward(layer, y);
      std::lock_guard l(m);
      f.push_back(cf);
      b.push_back(tp.counts());
    };
    step(mlp, x, fwd, bwd);
    step(mlp_sp, local_tokens(x, 2, std::size_t(tp.rank())), sp_fwd, sp_bwd);
    step(blk, x, blk_fwd, blk_bwd);
  });
  for (int r = 0; r < 2; ++r) {
    CHECK(fwd[r].total_calls() == 1);
    CHECK(fwd[r].count("all_reduce") == 1);
    CHECK(fwd[r].volume("all_reduce") == 8 * 16);  // tokens x hidden
    CHECK(bwd[r].total_calls() == 1);
    CHECK(bwd[r].count("all_reduce") == 1);
    CHECK(bwd[r].volume("all_reduce") == 8 * 16);
    // Sequence parallelism: all-gather + reduce-scatter instead, the same volume each way; the backward also
    // all-gathers fc1's input again (the forward kept only this rank's tokens of it, as Megatron-LM does).
    CHECK(sp_fwd[r].total_calls() == 2);
    CHECK(sp_fwd[r].count("all_gather") == 1);
    CHECK(sp_fwd[r].count("reduce_scatter") == 1);
    CHECK(sp_bwd[r].total_calls() == 3);
    CHECK(sp_bwd[r].count("all_gather") == 2);
    CHECK(sp_bwd[r].volume("all_gather") == 2 * 8 * 16);  // fc2's output gradient and fc1's input, whole
    CHECK(sp_bwd[r].count("reduce_scatter") == 1);
    // Block: attention and MLP each one all-reduce per direction.
    CHECK(blk_fwd[r].total_calls() == 2);
    CHECK(blk_fwd[r].count("all_reduce") == 2);
    CHECK(blk_bwd[r].total_calls() == 2);
    CHECK(blk_bwd[r].count("all_reduce") == 2);
  }
}

TEST_CASE("Dynamic sizes are checked once at construction, naming the layer and the sizes", "[nn][errors]") {
  std::vector<std::string> messages(3);
  run_threads(2, [&](Comm& tp) {
    if (tp.rank() != 0) return;  // construction is local: no collective is involved
    try {
      ColumnParallel<Comm> bad(tp, 8, 7, {});
    } catch (const config_error& e) {
      messages[0] = e.what();
    }
    try {
      SelfAttention<Comm> bad(tp, AttentionConfig{12, 3, 4});
    } catch (const config_error& e) {
      messages[1] = e.what();
    }
    try {
      using S = Stage<ColumnParallel<Comm>, Gelu, RowParallel<Comm>>;
      S bad(ColumnParallel<Comm>(tp, 8, 16, {}), Gelu{}, RowParallel<Comm>(tp, 32, 8, {}));
    } catch (const config_error& e) {
      messages[2] = e.what();
    }
  });
  CHECK_THAT(messages[0], Catch::Contains("ColumnParallel") && Catch::Contains("output size 7") &&
                              Catch::Contains("tensor-parallel size 2"));
  CHECK_THAT(messages[1], Catch::Contains("SelfAttention") && Catch::Contains("3 heads") &&
                              Catch::Contains("tensor-parallel size 2"));
  CHECK_THAT(messages[2], Catch::Contains("RowParallel") && Catch::Contains("takes 32") &&
                              Catch::Contains("ColumnParallel") && Catch::Contains("returns 16"));
}

TEST_CASE("Vocab-parallel embedding rejects tokens outside the vocabulary", "[nn][errors]") {
  auto one = Comm::single();
  VocabParallelEmbedding<Comm> emb(one, EmbeddingConfig{10, 4, seed, 1});
  const std::vector<std::int32_t> bad{1, 10};
  CHECK_THROWS_WITH(emb.embed(bad), Catch::Contains("token 10") && Catch::Contains("vocabulary of 10"));
}

TEST_CASE("Stage<ColumnParallel (no bias), Bias<Shard<1>>, Gelu, RowParallel> matches the serial MLP", "[nn][stage]") {
  // A custom stage: the column layer's bias as a separate elementwise layer on the feature shard.
  const MlpConfig cfg{16, 32, seed, 100, "mlp"};
  const Activation x = random_activation(8, 16, 21), dy = random_activation(8, 16, 22);
  auto ref = make_serial_mlp(cfg);
  Activation y, dx;
  Assembled rp;
  run_serial(ref, x, dy, y, dx, rp);
  for (int p : {2, 4}) {
    INFO("TP = " << p);
    ParallelResult out;
    run_parallel<Replicate>(p, x, dy, out, [&](Comm& tp) {
      using S = Stage<ColumnParallel<Comm>, Bias<FeatureShard>, Gelu, RowParallel<Comm>>;
      return S(ColumnParallel<Comm>(tp, 16, 32, {seed, 100, "mlp.fc1", false}),
               Bias<FeatureShard>(32, seed, 101, "mlp.fc1.bias", std::size_t(tp.size()), std::size_t(tp.rank())),
               Gelu{}, RowParallel<Comm>(tp, 32, 16, {seed, 102, "mlp.fc2", true}));
    });
    require_close(out.y, y, "forward output");
    require_close(out.dx, dx, "input gradient");
    require_params_match(out.params, rp);
  }
}

TEST_CASE("Gathered column output, deferred row reduction + AllReduce, and GatherFeatures match serial Linear stacks",
          "[nn][stage]") {
  const Activation x = random_activation(8, 16, 31), dy = random_activation(8, 16, 32);
  auto init = [](std::uint64_t id, const char* name) { return LinearInit{seed, id, name, true}; };
  // Serial: Linear(16, 32) -> Gelu -> Linear(32, 24) -> Gelu -> Linear(24, 16).
  Stage<Linear<>, Gelu, Linear<>, Gelu, Linear<>> ref(Linear<>(16, 32, init(600, "a")), Gelu{},
                                                      Linear<>(32, 24, init(602, "b")), Gelu{},
                                                      Linear<>(24, 16, init(604, "c")));
  Activation y, dx;
  Assembled rp;
  run_serial(ref, x, dy, y, dx, rp);
  using GatherCol = ColumnParallel<Comm, dyn, dyn, dyn, ColumnOptions{.gather_output = true}>;
  using Deferred = RowParallel<Comm, dyn, dyn, dyn, RowReduce::none>;
  for (int p : {2, 4}) {
    INFO("TP = " << p);
    ParallelResult first;
    run_parallel<Replicate>(p, x, dy, first, [&](Comm& tp) {
      using S = Stage<GatherCol, Gelu, ColumnParallel<Comm>, Gelu, Deferred, AllReduce<Comm>>;
      static_assert(std::is_same_v<S::output_layout<Replicate>, Replicate>);
      return S(GatherCol(tp, 16, 32, init(600, "a")), Gelu{}, ColumnParallel<Comm>(tp, 32, 24, init(602, "b")), Gelu{},
               Deferred(tp, 24, 16, init(604, "c")), AllReduce<Comm>(tp));
    });
    require_close(first.y, y, "forward output (gather_output, RowReduce::none + AllReduce)");
    require_close(first.dx, dx, "input gradient");
    require_params_match(first.params, rp);

    ParallelResult second;
    run_parallel<Replicate>(p, x, dy, second, [&](Comm& tp) {
      // The middle Linear is replicated: every rank computes it in full.
      return Stage<ColumnParallel<Comm>, GatherFeatures<Comm>, Gelu, Linear<>, Gelu, Linear<>>(
          ColumnParallel<Comm>(tp, 16, 32, init(600, "a")), GatherFeatures<Comm>(tp), Gelu{},
          Linear<>(32, 24, init(602, "b")), Gelu{}, Linear<>(24, 16, init(604, "c")));
    });
    require_close(second.y, y, "forward output (GatherFeatures)");
    require_close(second.dx, dx, "input gradient");
    require_params_match(second.params, rp);
  }
}

TEST_CASE(
    "Dropout without a mask to draw returns an input it is given as an rvalue (moved, no copy) and copies one it is "
    "lent",
    "[nn][dropout][move]") {
  using Counting = observe::CountingBackend<HostBackend>;
  Dropout<Replicate, Counting> drop(0.0, seed, 7);
  const Activation x = random_activation(4, 6, 3);
  const std::vector<float> want(x.data(), x.data() + x.size());

  Act<Replicate> given(x);
  const float* storage = given.tensor().data();
  const auto before = Counting::counts();
  const Act<Replicate> moved = drop.forward(std::move(given));
  const auto d = Counting::counts() - before;
  CHECK(moved.tensor().data() == storage);  // the very storage: nothing allocated, nothing copied
  CHECK(d.total_launches() == 0);
  CHECK(std::vector<float>(moved.tensor().data(), moved.tensor().data() + moved.size()) == want);

  // A caller that keeps reading its activation (a residual) lends it: the output is a backend copy.
  const Act<Replicate> lent(x);
  const auto before_lent = Counting::counts();
  const Act<Replicate> copied = drop.forward(lent);
  const auto dl = Counting::counts() - before_lent;
  CHECK(copied.tensor().data() != lent.tensor().data());
  CHECK(dl[observe::Op::copy] == 1);
  CHECK(std::vector<float>(copied.tensor().data(), copied.tensor().data() + copied.size()) == want);
  CHECK(std::vector<float>(lent.tensor().data(), lent.tensor().data() + lent.size()) == want);
}
