// Static tests: the layout contract of every nn layer, the typed activations they take and return, and
// the Stage compositions that are accepted. Compiling this file is the test. Every call below is a call
// a user writes (`layer.forward(Act<In>)`, `stage.backward(Act<G>)`), taken in an unevaluated context;
// the refused compositions are must-not-compile snippets in tests/verify/nn_*.verify.cpp, which
// construct and call the wrong composition and match the message.
#include <utility>

#include <mpar/comm/threads.hpp>
#include <mpar/nn.hpp>

namespace {
using namespace mpar;
using namespace mpar::nn;
using C = ThreadsCommunicator;

using Col = ColumnParallel<C, 1024, 4096, 4>;
using ColSP = ColumnParallel<C, 1024, 4096, 4, ColumnOptions{.sequence_parallel = true}>;
using ColGather = ColumnParallel<C, 1024, 4096, 4, ColumnOptions{.gather_output = true}>;
using Row = RowParallel<C, 4096, 1024, 4>;
using RowSP = RowParallel<C, 4096, 1024, 4, RowReduce::reduce_scatter>;
using RowPartial = RowParallel<C, 4096, 1024, 4, RowReduce::none>;

/** The type `l.forward(x)` returns for a layer `L` fed an `Act<In>`. */
template <class L, class In>
using forward_t = decltype(std::declval<L&>().forward(std::declval<const Act<In>&>(), 0));
/** The type `l.backward(dy)` returns for a layer `L` given an output gradient `Act<G>`. */
template <class L, class G>
using backward_t = decltype(std::declval<L&>().backward(std::declval<const Act<G>&>(), 0));

// ---- every layer satisfies the layer concept ----
static_assert(layer<Linear<>> && layer<Col> && layer<Row> && layer<Gelu> && layer<Dropout<>> && layer<LayerNorm<>>);
static_assert(layer<LayerNorm<TokenShard, C>> && layer<AllReduce<C>> && layer<GatherFeatures<C>> && layer<Linear2D<C>>);
static_assert(layer<Attention<>> && layer<SelfAttention<C>> && layer<TransformerBlock<C>> &&
              layer<TransformerBlock<C, true>>);
static_assert(layer<Bias<>> && layer<Bias<FeatureShard>>);
static_assert(layer<MlpStage<C>> && layer<SerialMlp<>>, "stages are layers, so they nest");

// ---- typed activations cost nothing: the layout is an empty tag, the storage is the tensor ----
static_assert(sizeof(Act<Replicate>) == sizeof(Activation) && sizeof(Act<TensorPartial>) == sizeof(Activation));
static_assert(!std::is_convertible_v<Activation, Act<Replicate>>, "a layout is stated explicitly, once");
static_assert(!std::is_convertible_v<Act<TensorPartial>, Act<Replicate>>, "no conversion between layouts");
static_assert(!std::is_convertible_v<Act<Replicate>, Act<FeatureShard>>);

// ---- forward: the output layout is a function of the input layout ----
static_assert(std::is_same_v<forward_t<Col, Replicate>, Act<FeatureShard>>);
static_assert(std::is_same_v<forward_t<ColSP, TokenShard>, Act<FeatureShard>>);
static_assert(std::is_same_v<forward_t<ColGather, Replicate>, Act<Replicate>>);
static_assert(std::is_same_v<forward_t<Row, FeatureShard>, Act<Replicate>>);
static_assert(std::is_same_v<forward_t<RowSP, FeatureShard>, Act<TokenShard>>);
static_assert(std::is_same_v<forward_t<RowPartial, FeatureShard>, Act<TensorPartial>>);
static_assert(std::is_same_v<forward_t<Gelu, FeatureShard>, Act<FeatureShard>>, "elementwise layers keep a shard");
static_assert(std::is_same_v<forward_t<Gelu, TokenShard>, Act<TokenShard>>);
static_assert(std::is_same_v<forward_t<Linear<>, TokenShard>, Act<TokenShard>>, "rows are independent");
static_assert(std::is_same_v<forward_t<AllReduce<C>, TensorPartial>, Act<Replicate>>);
static_assert(std::is_same_v<forward_t<GatherFeatures<C>, FeatureShard>, Act<Replicate>>);
static_assert(std::is_same_v<forward_t<LayerNorm<TokenShard, C>, TokenShard>, Act<TokenShard>>);
static_assert(std::is_same_v<forward_t<Dropout<FeatureShard>, FeatureShard>, Act<FeatureShard>>);
static_assert(std::is_same_v<forward_t<Bias<FeatureShard>, FeatureShard>, Act<FeatureShard>>);
static_assert(std::is_same_v<forward_t<Linear2D<C>, GridShard>, Act<GridShard>>);
static_assert(std::is_same_v<forward_t<SelfAttention<C>, Replicate>, Act<Replicate>>);
static_assert(std::is_same_v<forward_t<TransformerBlock<C, true>, TokenShard>, Act<TokenShard>>);

// ---- backward: gradients follow; the gradient of a Partial output is replicated ----
static_assert(std::is_same_v<backward_t<Col, FeatureShard>, Act<Replicate>>, "f's backward all-reduced it");
static_assert(std::is_same_v<backward_t<ColSP, FeatureShard>, Act<TokenShard>>, "SP: reduce-scattered");
static_assert(std::is_same_v<backward_t<Row, Replicate>, Act<FeatureShard>>);
static_assert(std::is_same_v<backward_t<RowSP, TokenShard>, Act<FeatureShard>>);
static_assert(std::is_same_v<backward_t<RowPartial, Replicate>, Act<FeatureShard>>);
static_assert(std::is_same_v<backward_t<Gelu, FeatureShard>, Act<FeatureShard>>);
static_assert(std::is_same_v<backward_t<AllReduce<C>, Replicate>, Act<Replicate>>);
static_assert(std::is_same_v<grad_layout_t<TensorPartial>, Replicate> &&
              std::is_same_v<grad_layout_t<TokenShard>, TokenShard>);

// ---- whole stages: forward and backward of the checked chain ----
using Megatron = Stage<Col, Gelu, Row>;
static_assert(std::is_same_v<forward_t<Megatron, Replicate>, Act<Replicate>>);
static_assert(std::is_same_v<backward_t<Megatron, Replicate>, Act<Replicate>>);
static_assert(Megatron::static_in_features == 1024 && Megatron::static_out_features == 1024);
using MegatronSP = Stage<LayerNorm<TokenShard, C>, ColSP, Gelu, Dropout<FeatureShard>, RowSP, Dropout<TokenShard>>;
static_assert(std::is_same_v<forward_t<MegatronSP, TokenShard>, Act<TokenShard>>);
static_assert(std::is_same_v<backward_t<MegatronSP, TokenShard>, Act<TokenShard>>);
using BiasAfterColumn = Stage<ColumnParallel<C, 1024, 4096, 4>, Bias<FeatureShard>, Gelu, Row>;
static_assert(std::is_same_v<forward_t<BiasAfterColumn, Replicate>, Act<Replicate>>, "a bias keeps the feature shard");
using Deferred = Stage<Col, Gelu, RowPartial, AllReduce<C>, LayerNorm<>>;
static_assert(std::is_same_v<forward_t<Deferred, Replicate>, Act<Replicate>>,
              "a Partial is fine once an AllReduce follows");
using Gathered = Stage<Col, GatherFeatures<C>, Linear<4096, 1024>>;
static_assert(std::is_same_v<forward_t<Gathered, Replicate>, Act<Replicate>>);
using Summa = Stage<Linear2D<C>, Gelu, Linear2D<C>>;
static_assert(std::is_same_v<forward_t<Summa, GridShard>, Act<GridShard>>, "2D layers chain on the grid layout");
using Nested = Stage<Megatron, Megatron>;
static_assert(std::is_same_v<forward_t<Nested, Replicate>, Act<Replicate>> && Nested::static_out_features == 1024);

// ---- static sizes: divisibility rules are compile-time facts ----
static_assert(statically_divisible_v<4096, 4> && !statically_divisible_v<1000, 3>);
static_assert(!layer<int> && !layer<Activation>, "only types with the layer contract are layers");
}  // namespace

// ---- one module concept: layers, stages, blocks and the feed-forward halves are all modules ----
namespace {
using namespace mpar;
using namespace mpar::nn;
static_assert(layer<Gelu> && layer<Megatron> && layer<TransformerBlock<C>>, "typed modules");
static_assert(!module<Megatron> && !module<TransformerBlock<C>> && !module<SelfAttention<C>>,
              "compositions are typed only: no forward(const Activation&) on a Stage, a block or attention");
static_assert(module<Megatron, Act<Replicate>> && mpar::nn::detail::split_backward_module<Megatron, Act<Replicate>>,
              "typed");
static_assert(mpar::nn::detail::split_backward_module<TransformerBlock<C, true>, Act<TokenShard>>);
static_assert(mpar::nn::detail::block_ffn<MlpStage<C>, Replicate> &&
              mpar::nn::detail::block_ffn<MlpStage<C, dyn, dyn, dyn, true>, TokenShard>);
static_assert(mpar::nn::detail::split_backward_layer<Col> && mpar::nn::detail::split_backward_layer<Row> &&
              !mpar::nn::detail::split_backward_layer<Gelu>);
}  // namespace
