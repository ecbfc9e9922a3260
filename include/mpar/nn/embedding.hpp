#pragma once
/**
 * @file Token embeddings: the single-rank `Embedding` and the tensor-parallel `VocabParallelEmbedding`
 * (each rank holds a contiguous slice of the vocabulary).
 */
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "mpar/backend/host/host_backend.hpp"
#include "mpar/comm/communicator.hpp"
#include "mpar/comm/host_memory_communicator.hpp"
#include "mpar/nn/collective_layers.hpp"
#include "mpar/nn/layer.hpp"
#include "mpar/nn/rank_tokens.hpp"
#include "mpar/nn/upload.hpp"

namespace mpar::nn {

/** @brief Sizes and initialisation of an embedding table `[vocab, hidden]` (id `id_base`). */
struct EmbeddingConfig {
  std::size_t vocab = 0, hidden = 0;
  std::uint64_t seed = 0, id_base = 0;
  std::string name = "embed";
};

namespace detail {
/** Rows `[offset, offset + n)` of the table: in-range tokens' rows, zeros for the others. */
template <mpar::detail::layer_kernel_backend B>
Activation embed_rows(RankTokens tokens, const Parameter& w, std::size_t offset, std::size_t n, std::size_t hidden) {
  Activation y({tokens.size, hidden}, uninitialized);  // the kernel writes every row (zeros outside the slice)
  B::run(ops::embedding_forward{.tokens = tokens.size,
                                .dim = hidden,
                                .ids = tokens.data,
                                .table = w.value.data(),
                                .out = y.data(),
                                .vocab_offset = offset,
                                .vocab_local = n});
  return y;
}
template <mpar::detail::layer_kernel_backend B>
void embed_rows_backward(RankTokens tokens, Parameter& w, std::size_t offset, std::size_t n, std::size_t hidden,
                         const Activation& dy) {
  B::run(ops::embedding_backward{.tokens = tokens.size,
                                 .dim = hidden,
                                 .ids = tokens.data,
                                 .dout = dy.data(),
                                 .dtable = w.grad.data(),
                                 .vocab_offset = offset,
                                 .vocab_local = n});
}
/** The ids of a cached micro-batch: uploaded into `tokens` (host ids), or a view of rank memory the caller keeps. */
struct EmbeddingIds {
  Buffer<std::int32_t> tokens;
  RankTokens ids;
};
inline void check_tokens(std::span<const std::int32_t> tokens, std::size_t vocab, std::string_view who) {
  for (std::size_t t = 0; t < tokens.size(); ++t)
    require(tokens[t] >= 0 && std::size_t(tokens[t]) < vocab, who, ": token ", tokens[t], " at position ", t,
            " is outside the vocabulary of ", vocab);
}
}  // namespace detail

/**
 * @brief Single-rank embedding lookup on backend `B`: tokens -> `Act<Replicate>` `[tokens, hidden]` (the same
 * typed entries as VocabParallelEmbedding). `Embedding` is the host form.
 */
template <backend B>
class BasicEmbedding {
 public:
  using output_layout = Replicate;

  explicit BasicEmbedding(const EmbeddingConfig& c) : vocab_(c.vocab), hidden_(c.hidden) {
    const std::array<std::size_t, 2> s{vocab_, hidden_};
    weight_ = make_parameter<B, 2>(c.name + ".weight", c.id_base, s, detail::tensor_box<Replicate>(s, 1, 0),
                                   Replicate::name(), false, c.seed, InitSpec::normal(0.02));
  }
  /** Typed lookup: the tokens' rows, `Act<Replicate>`. */
  Act<output_layout> embed(std::span<const std::int32_t> tokens, int mb = 0) {
    detail::check_tokens(tokens, vocab_, "Embedding");
    auto& c = cache_.put(mb);
    c.tokens = uninitialized_buffer<std::int32_t>(tokens.size());
    upload<B>(c.tokens,
              tokens);  // into the rank's memory (a stream-ordered upload on a device), where the kernels read them
    note_host_access(c.tokens.size() * sizeof(std::int32_t));
    c.ids = {c.tokens.data(), c.tokens.size()};
    return Act<output_layout>(detail::embed_rows<B>(c.ids, weight_, 0, vocab_, hidden_));
  }
  /** Typed backward: the gradient of the lookup's output (accumulated into the table's gradient). */
  void backward(const Act<output_layout>& dy, int mb = 0) {
    auto c = cache_.take(mb, "Embedding");
    detail::embed_rows_backward<B>(c.ids, weight_, 0, vocab_, hidden_, dy.tensor());
  }
  std::vector<Parameter*> parameters() { return {&weight_}; }
  void drop(int mb) { cache_.drop(mb); }

 private:
  std::size_t vocab_, hidden_;
  Parameter weight_;
  MicroBatchCache<detail::EmbeddingIds> cache_;
};

/** @brief The single-rank embedding on the host backend. */
using Embedding = BasicEmbedding<HostBackend>;

/**
 * @brief Vocab-parallel embedding: the table `[vocab, hidden]` is split by rows (`Shard<0, tensor>`);
 * a rank returns its rows for the tokens in its slice and zeros for the others, and one all-reduce
 * (SP: reduce-scatter, returning `Shard<0, tensor>` tokens) completes the lookup. Backward needs no
 * collective (SP: one all-gather of the gradient).
 */
template <communicator C, bool SP = false, backend B = HostBackend>
class VocabParallelEmbedding {
 public:
  using output_layout = std::conditional_t<SP, TokenShard, Replicate>;

  VocabParallelEmbedding(C& tp, const EmbeddingConfig& c)
      : comm_(&tp), vocab_(c.vocab), hidden_(c.hidden), p_(std::size_t(tp.size())), rank_(std::size_t(tp.rank())) {
    require(vocab_ > 0 && hidden_ > 0, "VocabParallelEmbedding '", c.name, "': sizes must be positive");
    require_reaches_rank_memory<B>(tp, "VocabParallelEmbedding '" + c.name + "'");
    const std::array<std::size_t, 2> s{vocab_, hidden_};
    const auto box = detail::tensor_box<TokenShard>(s, p_, rank_);
    slice_ = box[0];
    weight_ = make_parameter<B, 2>(c.name + ".weight", c.id_base, s, box, TokenShard::name(), p_ > 1, c.seed,
                                   InitSpec::normal(0.02));
  }
  /** Typed lookup: `Act<Replicate>` (SP: `Act<Shard<0, tensor>>`) of the tokens' rows. */
  Act<output_layout> embed(std::span<const std::int32_t> tokens, int mb = 0) {
    detail::check_tokens(tokens, vocab_, "VocabParallelEmbedding");
    auto& c = cache_.put(mb);
    c.tokens = uninitialized_buffer<std::int32_t>(tokens.size());
    upload<B>(c.tokens,
              tokens);  // into the rank's memory (a stream-ordered upload on a device), where the kernels read them
    note_host_access(c.tokens.size() * sizeof(std::int32_t));
    c.ids = {c.tokens.data(), c.tokens.size()};
    return lookup(c.ids);
  }
  /**
   * As `embed`, with the ids already in rank memory (`RankTokens`: not checked here, the caller checked them
   * before writing them, and keeps them until the backward of `mb`): no upload, nothing the host decides per
   * call, so a captured step replays it with whatever ids the memory holds then.
   */
  Act<output_layout> embed(RankTokens ids, int mb = 0) {
    cache_.put(mb).ids = ids;
    return lookup(ids);
  }
  /** Typed backward: the gradient of the lookup's output (accumulated into the table's gradient). */
  void backward(Act<output_layout> dy_in, int mb = 0) {
    auto c = cache_.take(mb, "VocabParallelEmbedding");
    // The backward dual of the forward reduction: all-gather (SP) or identity.
    const Act<Replicate> dy = [&] {
      if constexpr (SP)
        return ReduceScatterTokens::backward<B>(*comm_, std::move(dy_in));
      else
        return ReduceToReplicate::backward<B>(*comm_, std::move(dy_in));
    }();
    detail::embed_rows_backward<B>(c.ids, weight_, slice_.offset, slice_.extent, hidden_, dy.tensor());
  }
  std::vector<Parameter*> parameters() { return {&weight_}; }
  void drop(int mb) { cache_.drop(mb); }
  [[nodiscard]] Block vocab_slice() const { return slice_; }

 private:
  /** The lookup of `ids`, reduced over the tensor group. */
  Act<output_layout> lookup(RankTokens ids) {
    // This rank's rows for the tokens in its vocabulary slice, zeros elsewhere: an addend of the lookup.
    Act<TensorPartial> y(detail::embed_rows<B>(ids, weight_, slice_.offset, slice_.extent, hidden_));
    if constexpr (SP)
      return ReduceScatterTokens::forward<B>(*comm_, std::move(y), "VocabParallelEmbedding");
    else
      return ReduceToReplicate::forward<B>(*comm_, std::move(y));
  }

  C* comm_;
  std::size_t vocab_, hidden_, p_, rank_;
  Block slice_{};
  Parameter weight_;
  MicroBatchCache<detail::EmbeddingIds> cache_;
};

}  // namespace mpar::nn
