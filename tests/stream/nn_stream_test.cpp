// The nn layers a user composes by hand, over the stream backends: every operation runs later, on a worker thread
// per rank, and fresh rank memory is NaN (StreamHostBackend), or the host cannot touch rank memory at all
// (DiscreteHostBackend: a host access faults). A layer that reads or writes an activation on the host — a copy, a
// slice, an interleave — sees a stale or NaN value there, so equal outputs, input gradients and parameter
// gradients, bit for bit, against HostBackend show that the layer's passes are stream-ordered, as the CUDA backend
// needs them to be. The GPT's own layers are covered by its stream tests; these are the others: the redistribution
// layers, a gathered column output, a deferred row reduction, the sequence-parallel pieces, bias and dropout on a
// feature shard, 2D tensor parallelism, the single-rank attention, and the Llama-class pieces (RMSNorm, the SwiGLU
// MLP under sequence parallelism, the rotary embedding, grouped-query attention).
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <mpar/backend/rank_transfer.hpp>
#include <mpar/backend/stream/stream_backend.hpp>
#include <mpar/comm/stream_ordered_communicator.hpp>
#include <mpar/comm/threads.hpp>
#include <mpar/nn.hpp>
// The trace single-steps host code under its own signal handlers, which ThreadSanitizer's build does not take; the
// StreamHostBackend cases run there (their races are what it looks for).
#if defined(__linux__) && defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
#define MPAR_NN_STREAM_TRACE 1
#include <mpar/backend/stream/host_access_trace.hpp>
#endif

#include "rank_world.hpp"

using namespace mpar;
using namespace mpar::nn;

namespace {

/** What one rank's passes gave: its output, its input gradient and every parameter gradient it holds. */
struct LayerPass {
  std::vector<float> y, dx;
  std::vector<std::string> names;
  std::vector<std::vector<float>> grads;
  bool operator==(const LayerPass&) const = default;
};

/** Deterministic values of a `[rows, cols]` host matrix (`stream` tells the matrices apart). */
std::vector<float> pass_values(std::size_t rows, std::size_t cols, std::uint64_t stream) {
  std::vector<float> v(rows * cols);
  const CounterRng rng{4321, stream};
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = float(rng.normal(i));
  return v;
}

/** Rows `[r0, r0 + nr)` and columns `[c0, c0 + nc)` of a row-major host matrix with `cols` columns. */
std::vector<float> host_block(const std::vector<float>& m, std::size_t cols, std::size_t r0, std::size_t nr,
                              std::size_t c0, std::size_t nc) {
  std::vector<float> b(nr * nc);
  for (std::size_t i = 0; i < nr; ++i)
    for (std::size_t j = 0; j < nc; ++j) b[i * nc + j] = m[(r0 + i) * cols + c0 + j];
  return b;
}

/**
 * Runs `layer` forward on `x` and backward on `dy` (this rank's blocks, `[rows, ...]` host values) in layout `L`,
 * with backend `B`'s operations only: the inputs go into rank memory by asynchronous copies, and the results come
 * back the same way, after one wait.
 */
template <class L, class B, class Layer>
void stream_pass(Layer& layer, const std::vector<float>& x, std::size_t x_cols, const std::vector<float>& dy,
                 std::size_t dy_cols, LayerPass& out) {
  Act<L> xa(Activation({x.size() / x_cols, x_cols}, uninitialized));
  B::template copy_from_host_async<float>(x.size(), x.data(), xa.data());
  const Act<L> y = layer.forward(xa, 0);
  Act<grad_layout_t<L>> dya(Activation({dy.size() / dy_cols, dy_cols}, uninitialized));
  B::template copy_from_host_async<float>(dy.size(), dy.data(), dya.data());
  const auto dx = layer.backward(dya, 0);
  out.y.resize(y.size());
  out.dx.resize(dx.size());
  B::template copy_to_host_async<float>(y.size(), y.data(), out.y.data());
  B::template copy_to_host_async<float>(dx.size(), dx.data(), out.dx.data());
  for (const Parameter* p : layer.parameters()) {
    out.names.push_back(p->name);
    out.grads.emplace_back(p->grad.size());
    B::template copy_to_host_async<float>(p->grad.size(), p->grad.data(), out.grads.back().data());
  }
  B::synchronize();  // the host values above are read by the copies until here
}

/** Every rank's pass of `Case` over backend `B` (HostBackend on the plain threads communicator). */
template <class B, class Case>
std::vector<LayerPass> run_layer_case() {
  std::vector<LayerPass> out(std::size_t(Case::ranks));
  run_threads(Case::ranks, [&](ThreadsCommunicator& w) {
    B::init_rank();
    testing::on_rank_world<B>(w, [&](auto& world) {
      Case::template run<std::decay_t<decltype(world)>, B>(world, out[std::size_t(w.rank())]);
    });
  });
  return out;
}

constexpr std::uint64_t layer_seed = 11;
constexpr std::size_t tokens = 8;

LinearInit linear_init(std::uint64_t id, const char* name, bool bias = true) {
  return LinearInit{layer_seed, id, name, bias};
}

/** ColumnParallel with its output gathered, then a RowParallel whose sum is left to an AllReduce layer (tp = 2). */
struct GatheredColumnThenAllReduce {
  static constexpr int ranks = 2;
  template <class C, class B>
  static void run(C& tp, LayerPass& out) {
    using GatherCol = ColumnParallel<C, dyn, dyn, dyn, ColumnOptions{.gather_output = true}, B>;
    using Col = ColumnParallel<C, dyn, dyn, dyn, ColumnOptions{}, B>;
    using Deferred = RowParallel<C, dyn, dyn, dyn, RowReduce::none, B>;
    Stage<GatherCol, BasicGelu<B>, Col, BasicGelu<B>, Deferred, AllReduce<C, B>> s(
        GatherCol(tp, 16, 32, linear_init(600, "a")), BasicGelu<B>{}, Col(tp, 32, 24, linear_init(602, "b")),
        BasicGelu<B>{}, Deferred(tp, 24, 16, linear_init(604, "c")), AllReduce<C, B>(tp));
    stream_pass<Replicate, B>(s, pass_values(tokens, 16, 1), 16, pass_values(tokens, 16, 2), 16, out);
  }
};

/** A column shard gathered by the GatherFeatures layer into a replicated Linear (tp = 2). */
struct GatherFeaturesThenLinear {
  static constexpr int ranks = 2;
  template <class C, class B>
  static void run(C& tp, LayerPass& out) {
    using Col = ColumnParallel<C, dyn, dyn, dyn, ColumnOptions{}, B>;
    Stage<Col, GatherFeatures<C, B>, BasicGelu<B>, Linear<dyn, dyn, B>> s(
        Col(tp, 16, 32, linear_init(600, "a")), GatherFeatures<C, B>(tp), BasicGelu<B>{},
        Linear<dyn, dyn, B>(32, 12, linear_init(602, "b")));
    stream_pass<Replicate, B>(s, pass_values(tokens, 16, 3), 16, pass_values(tokens, 12, 4), 12, out);
  }
};

/**
 * The MLP with its bias as a layer of its own on the feature shard, and dropout there (tp = 2): the bias and the
 * mask each see this rank's columns only.
 */
struct BiasAndDropoutOnFeatureShard {
  static constexpr int ranks = 2;
  template <class C, class B>
  static void run(C& tp, LayerPass& out) {
    using Col = ColumnParallel<C, dyn, dyn, dyn, ColumnOptions{}, B>;
    using Row = RowParallel<C, dyn, dyn, dyn, RowReduce::all_reduce, B>;
    const auto p = std::size_t(tp.size()), r = std::size_t(tp.rank());
    Stage<Col, Bias<FeatureShard, B>, BasicGelu<B>, Dropout<FeatureShard, B>, Row> s(
        Col(tp, 16, 32, linear_init(600, "fc1", false)), Bias<FeatureShard, B>(32, layer_seed, 601, "fc1.bias", p, r),
        BasicGelu<B>{}, Dropout<FeatureShard, B>(0.25, layer_seed, 9, p, r), Row(tp, 32, 16, linear_init(602, "fc2")));
    stream_pass<Replicate, B>(s, pass_values(tokens, 16, 5), 16, pass_values(tokens, 16, 6), 16, out);
  }
};

/**
 * Sequence parallelism as a user composes it (tp = 2): a layer norm on this rank's tokens, a column projection that
 * all-gathers them, and a row projection that reduce-scatters its sum back to token blocks.
 */
struct SequenceParallelProjections {
  static constexpr int ranks = 2;
  template <class C, class B>
  static void run(C& tp, LayerPass& out) {
    using Col = ColumnParallel<C, dyn, dyn, dyn, ColumnOptions{.sequence_parallel = true}, B>;
    using Row = RowParallel<C, dyn, dyn, dyn, RowReduce::reduce_scatter, B>;
    Stage<LayerNorm<TokenShard, C, B>, Col, BasicGelu<B>, Row> s(
        LayerNorm<TokenShard, C, B>(tp, 16, layer_seed, 700, "ln"), Col(tp, 16, 32, linear_init(702, "fc1")),
        BasicGelu<B>{}, Row(tp, 32, 16, linear_init(704, "fc2")));
    const auto rows = tokens / std::size_t(tp.size()), first = std::size_t(tp.rank()) * rows;
    stream_pass<TokenShard, B>(s, host_block(pass_values(tokens, 16, 7), 16, first, rows, 0, 16), 16,
                               host_block(pass_values(tokens, 16, 8), 16, first, rows, 0, 16), 16, out);
  }
};

/** Two SUMMA layers on a 2 x 2 tensor grid, each rank holding one block of every activation. */
struct SummaGrid {
  static constexpr int ranks = 4;
  template <class C, class B>
  static void run(C& tp, LayerPass& out) {
    auto grid = make_tensor_grid(tp, 2, 2);
    Stage<Linear2D<C, B>, BasicGelu<B>, Linear2D<C, B>> s(Linear2D<C, B>(grid, 8, 12, linear_init(500, "a")),
                                                          BasicGelu<B>{},
                                                          Linear2D<C, B>(grid, 12, 8, linear_init(502, "b")));
    const std::size_t i = grid.i(), j = grid.j();
    stream_pass<GridShard, B>(s, host_block(pass_values(tokens, 8, 9), 8, i * tokens / 2, tokens / 2, j * 4, 4), 4,
                              host_block(pass_values(tokens, 8, 10), 8, i * tokens / 2, tokens / 2, j * 4, 4), 4, out);
  }
};

/**
 * The Llama-class pieces under sequence parallelism (tp = 2): RMSNorm on this rank's tokens, then the SwiGLU MLP (the
 * fused gate-and-up projection all-gathers the tokens, the down projection reduce-scatters its sum).
 */
struct LlamaSequenceParallel {
  static constexpr int ranks = 2;
  template <class C, class B>
  static void run(C& tp, LayerPass& out) {
    using Norm = RMSNorm<TokenShard, C, B>;
    using GateUp = ColumnParallel<C, dyn, dyn, dyn, ColumnOptions{true, false, 2}, B>;
    using Down = RowParallel<C, dyn, dyn, dyn, RowReduce::reduce_scatter, B>;
    Stage<Norm, GateUp, SiluGate<B>, Down> s(Norm(tp, 16, layer_seed, 900, "norm"),
                                             GateUp(tp, 16, 24, linear_init(902, "gate_up", false)), SiluGate<B>(24),
                                             Down(tp, 24, 16, linear_init(904, "down", false)));
    const auto rows = tokens / std::size_t(tp.size()), first = std::size_t(tp.rank()) * rows;
    stream_pass<TokenShard, B>(s, host_block(pass_values(tokens, 16, 13), 16, first, rows, 0, 16), 16,
                               host_block(pass_values(tokens, 16, 14), 16, first, rows, 0, 16), 16, out);
  }
};

/**
 * Grouped-query attention (8 query heads, 4 KV heads) over two tensor ranks with sequence parallelism: the KV heads'
 * repetition and the rotary positions (uploaded once into rank memory) on the stream.
 */
struct GqaSequenceParallel {
  static constexpr int ranks = 2;
  template <class C, class B>
  static void run(C& tp, LayerPass& out) {
    GroupedQueryAttention<C, true, B> attn(tp, GqaConfig{16, 8, 4, 4, 10000.0, layer_seed, 920, "attn"});
    const auto rows = tokens / std::size_t(tp.size()), first = std::size_t(tp.rank()) * rows;
    stream_pass<TokenShard, B>(attn, host_block(pass_values(tokens, 16, 17), 16, first, rows, 0, 16), 16,
                               host_block(pass_values(tokens, 16, 18), 16, first, rows, 0, 16), 16, out);
  }
};

/** RMSNorm then the rotary embedding at the rows' positions (uploaded host values), on one rank. */
template <class B>
struct NormThenRotary {
  RMSNorm<Replicate, NoComm, B> norm;
  Rotary<B> rope;
  std::vector<std::int32_t> positions;
  Act<Replicate> forward(const Act<Replicate>& x, int mb) { return rope.forward(norm.forward(x, mb), positions, mb); }
  Act<Replicate> backward(const Act<Replicate>& dy, int mb) { return norm.backward(rope.backward(dy, mb), mb); }
  std::vector<Parameter*> parameters() { return norm.parameters(); }
};
struct SingleRankRotary {
  static constexpr int ranks = 1;
  template <class C, class B>
  static void run(C&, LayerPass& out) {
    NormThenRotary<B> s{RMSNorm<Replicate, NoComm, B>(16, layer_seed, 910, "norm"), Rotary<B>(4),
                        sequence_positions(tokens, 4)};
    stream_pass<Replicate, B>(s, pass_values(tokens, 16, 15), 16, pass_values(tokens, 16, 16), 16, out);
  }
};

/** How many elements differ bit for bit (a size mismatch counts every element of the longer one). */
std::size_t differing(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return std::max(a.size(), b.size());
  std::size_t n = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    n += std::bit_cast<std::uint32_t>(a[i]) != std::bit_cast<std::uint32_t>(b[i]);
  return n;
}

/** The single-rank pieces: a layer norm and causal self-attention over two sequences of 4 tokens. */
struct SingleRankAttention {
  static constexpr int ranks = 1;
  template <class C, class B>
  static void run(C&, LayerPass& out) {
    Stage<LayerNorm<Replicate, NoComm, B>, Attention<B>> s(
        LayerNorm<Replicate, NoComm, B>(16, layer_seed, 800, "ln"),
        Attention<B>(AttentionConfig{16, 2, 4, layer_seed, 802, "attn"}));
    stream_pass<Replicate, B>(s, pass_values(tokens, 16, 11), 16, pass_values(tokens, 16, 12), 16, out);
  }
};

template <class Case>
void check_stream_equals_host() {
  const std::vector<LayerPass> host = run_layer_case<HostBackend, Case>();
  const std::vector<LayerPass> stream = run_layer_case<StreamHostBackend, Case>();
  for (std::size_t r = 0; r < host.size(); ++r) {
    INFO("rank " << r);
    REQUIRE(!host[r].y.empty());
    CHECK(differing(stream[r].y, host[r].y) == 0);
    CHECK(differing(stream[r].dx, host[r].dx) == 0);
    REQUIRE(stream[r].names == host[r].names);
    for (std::size_t k = 0; k < host[r].grads.size(); ++k) {
      INFO("gradient of " << host[r].names[k]);
      CHECK(differing(stream[r].grads[k], host[r].grads[k]) == 0);
    }
  }
}

#ifdef MPAR_NN_STREAM_TRACE
/**
 * `Case` over DiscreteHostBackend in a child process (the trace installs process-wide signal handlers): exit status
 * 0 when the passes touched no rank memory from the host and gave HostBackend's values bit for bit; 1 when the host
 * touched it (each place printed to stderr); 2 when the values differ.
 */
template <class Case>
void check_discrete_untouched() {
  const std::vector<LayerPass> host = run_layer_case<HostBackend, Case>();
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    int code = 0;
    {
      stream::HostAccessTrace trace;
      // On a thread of its own: a one-rank case runs on the calling thread, and this process's main thread may
      // hold an earlier case's stream, whose worker thread the fork did not copy.
      std::vector<LayerPass> discrete;
      std::thread ranks([&] { discrete = run_layer_case<DiscreteHostBackend, Case>(); });
      ranks.join();
      if (trace.accesses(false) + trace.accesses(true) != 0) {
        trace.print(stderr);
        code = 1;
      } else if (discrete != host) {
        code = 2;
      }
    }
    _exit(code);
  }
  REQUIRE(pid > 0);
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  INFO("1: the host touched rank memory (the places are on stderr); 2: values differ from HostBackend's");
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}
#endif

}  // namespace

TEMPLATE_TEST_CASE("nn layers composed by hand run stream-ordered: StreamHostBackend equals HostBackend bit for bit",
                   "[stream][nn]", GatheredColumnThenAllReduce, GatherFeaturesThenLinear, BiasAndDropoutOnFeatureShard,
                   SequenceParallelProjections, SummaGrid, SingleRankAttention, LlamaSequenceParallel, SingleRankRotary,
                   GqaSequenceParallel) {
  check_stream_equals_host<TestType>();
}

#ifdef MPAR_NN_STREAM_TRACE
TEMPLATE_TEST_CASE("nn layers composed by hand touch no rank memory from the host (DiscreteHostBackend)",
                   "[stream][nn][discrete]", GatheredColumnThenAllReduce, GatherFeaturesThenLinear,
                   BiasAndDropoutOnFeatureShard, SequenceParallelProjections, SummaGrid, SingleRankAttention,
                   LlamaSequenceParallel, SingleRankRotary, GqaSequenceParallel) {
  check_discrete_untouched<TestType>();
}
#endif
