#pragma once
/**
 * @file The Megatron MLP: `ColumnParallel -> Gelu -> RowParallel`, exactly one all-reduce forward and
 * one backward (with sequence parallelism: all-gather + reduce-scatter each way instead).
 *
 * The tensor-parallel stage runs its first projection and GeLU as one layer (`ColumnParallelGelu`: the bias
 * and GeLU as the GEMM's epilogue); the single-rank reference keeps the three-layer chain
 * `Linear -> Gelu -> Linear`, so the tests of one against the other check the fusion too.
 */
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "mpar/nn/column_parallel.hpp"
#include "mpar/nn/column_parallel_gelu.hpp"
#include "mpar/nn/gelu.hpp"
#include "mpar/nn/row_parallel.hpp"
#include "mpar/nn/stage.hpp"

namespace mpar::nn {

/** @brief Sizes and initialisation of an MLP. */
struct MlpConfig {
  std::size_t hidden = 0, ffn = 0;
  std::uint64_t seed = 0, id_base = 0;  ///< fc1 weight/bias: id_base, +1; fc2: +2, +3
  std::string name = "mlp";
};

/** @brief The stage type of the tensor-parallel MLP (`Hidden`, `Ffn`, `TP` static or `dyn`). */
template <communicator C, std::size_t Hidden = dyn, std::size_t Ffn = dyn, std::size_t TP = dyn, bool SP = false,
          backend B = HostBackend>
using MlpStage = Stage<ColumnParallelGelu<C, Hidden, Ffn, TP, SP, B>,
                       RowParallel<C, Ffn, Hidden, TP, SP ? RowReduce::reduce_scatter : RowReduce::all_reduce, B>>;

/** @brief Builds the tensor-parallel MLP stage on tensor group `tp`. */
template <communicator C, std::size_t Hidden = dyn, std::size_t Ffn = dyn, std::size_t TP = dyn, bool SP = false,
          backend B = HostBackend>
[[nodiscard]] MlpStage<C, Hidden, Ffn, TP, SP, B> make_mlp(C& tp, const MlpConfig& c) {
  using S = MlpStage<C, Hidden, Ffn, TP, SP, B>;
  using Fc1 = ColumnParallelGelu<C, Hidden, Ffn, TP, SP, B>;
  using Fc2 = RowParallel<C, Ffn, Hidden, TP, SP ? RowReduce::reduce_scatter : RowReduce::all_reduce, B>;
  return S(Fc1(tp, c.hidden, c.ffn, {c.seed, c.id_base, c.name + ".fc1", true}),
           Fc2(tp, c.ffn, c.hidden, {c.seed, c.id_base + 2, c.name + ".fc2", true}));
}

/** @brief The single-rank MLP with the same parameter ids (the reference for the parallel one). */
template <backend B = HostBackend>
using SerialMlp = Stage<Linear<dyn, dyn, B>, BasicGelu<B>, Linear<dyn, dyn, B>>;

template <backend B = HostBackend>
[[nodiscard]] SerialMlp<B> make_serial_mlp(const MlpConfig& c) {
  return SerialMlp<B>(Linear<dyn, dyn, B>(c.hidden, c.ffn, {c.seed, c.id_base, c.name + ".fc1", true}), BasicGelu<B>{},
                      Linear<dyn, dyn, B>(c.ffn, c.hidden, {c.seed, c.id_base + 2, c.name + ".fc2", true}));
}

}  // namespace mpar::nn
