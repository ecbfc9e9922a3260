// Static tests: the layout contract of every nn layer and which Stage compositions are accepted.
// Compiling this file is the test (the rejected compositions are checked without instantiating
// Stage, through the layers' accepts<> verdicts; tests/verify/ checks the diagnostics themselves).
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

// ---- every layer satisfies the layer concept ----
static_assert(layer<Linear<>> && layer<Col> && layer<Row> && layer<Gelu> && layer<Dropout<>> && layer<LayerNorm<>>);
static_assert(layer<LayerNorm<TokenShard, C>> && layer<AllReduce<C>> && layer<GatherFeatures<C>> && layer<Linear2D<C>>);
static_assert(layer<Attention<>> && layer<SelfAttention<C>> && layer<TransformerBlock<C>> && layer<TransformerBlock<C, true>>);
static_assert(layer<Bias<>> && layer<Bias<FeatureShard>>);
static_assert(layer<MlpStage<C>> && layer<SerialMlp<>>, "stages are layers, so they nest");

// ---- output layouts (a metafunction of the input) ----
static_assert(std::is_same_v<Col::output_layout<Replicate>, FeatureShard>);
static_assert(std::is_same_v<ColGather::output_layout<Replicate>, Replicate>);
static_assert(std::is_same_v<Row::output_layout<FeatureShard>, Replicate>);
static_assert(std::is_same_v<RowSP::output_layout<FeatureShard>, TokenShard>);
static_assert(std::is_same_v<RowPartial::output_layout<FeatureShard>, TensorPartial>);
static_assert(std::is_same_v<Gelu::output_layout<FeatureShard>, FeatureShard>, "elementwise layers keep a shard");
static_assert(std::is_same_v<Gelu::output_layout<TokenShard>, TokenShard>);
static_assert(std::is_same_v<AllReduce<C>::output_layout<TensorPartial>, Replicate>);

// ---- accepted inputs ----
static_assert(Col::accepts<Replicate>() == Verdict::ok && ColSP::accepts<TokenShard>() == Verdict::ok);
static_assert(Row::accepts<FeatureShard>() == Verdict::ok);
static_assert(Gelu::accepts<FeatureShard>() == Verdict::ok && Gelu::accepts<Replicate>() == Verdict::ok);
static_assert(LayerNorm<>::accepts<Replicate>() == Verdict::ok && LayerNorm<TokenShard, C>::accepts<TokenShard>() == Verdict::ok);
static_assert(Dropout<FeatureShard>::accepts<FeatureShard>() == Verdict::ok);
static_assert(Linear2D<C>::accepts<GridShard>() == Verdict::ok);

// ---- rejected inputs, one cause each ----
static_assert(Row::accepts<Replicate>() == Verdict::needs_feature_shard, "row-parallel fed a replicated tensor");
static_assert(Row::accepts<TokenShard>() == Verdict::needs_feature_shard);
static_assert(Gelu::accepts<TensorPartial>() == Verdict::nonlinear_fed_partial, "nonlinear fed a Partial tensor");
static_assert(LayerNorm<>::accepts<TensorPartial>() == Verdict::nonlinear_fed_partial);
static_assert(Dropout<>::accepts<TensorPartial>() == Verdict::nonlinear_fed_partial);
static_assert(Col::accepts<TensorPartial>() == Verdict::linear_fed_partial, "a bias would be added once per rank");
static_assert(Col::accepts<FeatureShard>() == Verdict::needs_full_features);
static_assert(LayerNorm<>::accepts<FeatureShard>() == Verdict::needs_full_features, "statistics need whole rows");
static_assert(ColSP::accepts<Replicate>() == Verdict::needs_token_shard);
static_assert(Col::accepts<TokenShard>() == Verdict::needs_replicated);
static_assert(Dropout<>::accepts<FeatureShard>() == Verdict::layout_parameter_mismatch);
static_assert(Linear2D<C>::accepts<Replicate>() == Verdict::needs_2d_shard);
static_assert(Bias<FeatureShard>::accepts<TensorPartial>() == Verdict::linear_fed_partial, "the bias would be added per addend");

// ---- whole stages ----
using Megatron = Stage<Col, Gelu, Row>;
static_assert(Megatron::valid && std::is_same_v<Megatron::output_layout<Replicate>, Replicate>);
static_assert(Megatron::static_in_features == 1024 && Megatron::static_out_features == 1024);
using MegatronSP = Stage<LayerNorm<TokenShard, C>, ColSP, Gelu, Dropout<FeatureShard>, RowSP, Dropout<TokenShard>>;
static_assert(MegatronSP::valid && std::is_same_v<MegatronSP::output_layout<TokenShard>, TokenShard>);
using BiasAfterColumn = Stage<ColumnParallel<C, 1024, 4096, 4>, Bias<FeatureShard>, Gelu, Row>;
static_assert(BiasAfterColumn::valid, "an elementwise bias keeps the feature shard");
using Deferred = Stage<Col, Gelu, RowPartial, AllReduce<C>, LayerNorm<>>;
static_assert(Deferred::valid, "a Partial output is fine once an AllReduce follows");
using Gathered = Stage<Col, GatherFeatures<C>, Linear<4096, 1024>>;
static_assert(Gathered::valid);
using Summa = Stage<Linear2D<C>, Gelu, Linear2D<C>>;
static_assert(Summa::valid && std::is_same_v<Summa::output_layout<GridShard>, GridShard>, "2D layers chain on the grid layout");
using Nested = Stage<Megatron, Megatron>;
static_assert(Nested::valid && Nested::static_out_features == 1024);

// ---- static sizes: divisibility rules are compile-time facts ----
static_assert(statically_divisible_v<4096, 4> && !statically_divisible_v<1000, 3>);
static_assert(!layer<int> && !layer<Activation>, "only types with the layer contract are layers");
}  // namespace
