#pragma once
/**
 * @file A GPT-style decoder assembled from the tensor-parallel layers and split into pipeline stages.
 *
 * Model: token embedding (vocab-parallel) + learned position embedding, N pre-LN transformer blocks,
 * a final layer norm and an output head tied to the token embedding (logits = h · Eᵀ, vocab-sharded
 * over the tensor axis, consumed by `VocabParallelCrossEntropy` without gathering the logits).
 *
 * A `GptPipelinePart` is one pipeline stage (one model chunk): the first stage embeds, the last stage holds
 * the final layer norm and the head, every stage holds a contiguous range of blocks. Stages satisfy
 * `pipeline::pipeline_part` and `droppable_part`, so every schedule and activation recomputation run
 * them. Token ids enter the first stage as a `[tokens, 1]` activation of floats (exact below 2²⁴),
 * replicated over the tensor group like the hidden states that cross every other boundary: a stage takes
 * `Act<Replicate>`; it returns `Act<Replicate>` hidden states (`forward`) or, the last stage,
 * vocab-sharded logits `Act<FeatureShard>` for the loss (`forward_to_loss`, the pipeline's `loss_layout`).
 * They also satisfy `pipeline::split_backward_part`: `backward_input` (B) and `backward_weight` (W,
 * the weight GEMMs of the head and of every block, and the embeddings), so zero-bubble schedules
 * defer the weight gradients into the pipeline bubble.
 *
 * Tied weights across the pipeline: with one stage the head uses the embedding parameter itself;
 * otherwise the last stage holds a copy with the same name, id and block (so the same initial values)
 * and `GptTiedEmbedding` adds the two gradients over the first-and-last-stage group before the step,
 * keeping both copies identical — the copy is excluded from gradient norms so it is not counted twice.
 *
 * Llama (`GptConfig::family = ModelFamily::llama`): the same stages with `nn::LlamaBlock`s (rotary positions, so no
 * position embedding), a final RMSNorm and an untied vocab-parallel head `head.weight` of the embedding's shape and
 * split; nothing is tied across the pipeline. Under context parallelism its blocks are `nn::RingLlamaBlock`s (ring
 * grouped-query attention, rotary positions of the zig-zag chunks).
 *
 * Mixture of experts (`GptConfig::experts > 0`): the blocks `GptConfig::is_moe_block` selects replace
 * their MLP by a top-k gated MoE (`MoeTransformerBlock`) whose experts are spread over an expert group
 * and whose load-balancing statistics are taken over a token group (`GptMoeGroups`); the load-balancing
 * losses join the training objective of each micro-batch.
 */
#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "mpar/backend/host/host_backend.hpp"
#include "mpar/comm/communicator.hpp"
#include "mpar/models/model_family.hpp"
#include "mpar/models/moe_block.hpp"
#include "mpar/nn/cross_entropy.hpp"
#include "mpar/nn/embedding.hpp"
#include "mpar/nn/half_weight.hpp"
#include "mpar/nn/layer_norm.hpp"
#include "mpar/nn/llama_block.hpp"
#include "mpar/nn/rank_tokens.hpp"
#include "mpar/nn/recompute.hpp"
#include "mpar/nn/reduce_gradients.hpp"
#include "mpar/nn/ring_llama_block.hpp"
#include "mpar/nn/ring_transformer_block.hpp"
#include "mpar/nn/transformer_block.hpp"

namespace mpar::models {

/** @brief Sizes of a GPT-style model. `ffn = 0` means 4 · hidden. */
struct GptConfig {
  std::size_t vocab = 0, hidden = 64, heads = 4, layers = 2, seq = 32, ffn = 0;
  double dropout = 0.0;
  std::uint64_t seed = 1;
  /// GPT-2's blocks or Llama's (`ModelFamily`); the fields below are Llama's.
  ModelFamily family = ModelFamily::gpt2;
  std::size_t kv_heads = 0;     ///< Llama: key/value heads of grouped-query attention, dividing heads (0: heads)
  double rope_theta = 10000.0;  ///< Llama: the rotary frequency base
  float norm_eps = 1e-5f;       ///< Llama: RMSNorm's epsilon
  /// Mixture of experts: 0 keeps every MLP dense; otherwise the MoE blocks hold this many experts of
  /// width `ffn_size()` each.
  std::size_t experts = 0;
  std::size_t moe_top_k = 2;     ///< experts each token is routed to
  double moe_capacity = 1.25;    ///< capacity factor (<= 0: unlimited, nothing dropped)
  float moe_aux_weight = 0.01f;  ///< coefficient of the load-balancing loss
  std::size_t moe_every = 1;     ///< every n-th block is MoE: blocks n-1, 2n-1, ... (1: all, 2: every other)
  /// The experts' own tensor-parallel size (--etp): 1 keeps whole experts on every tensor rank (each computes them
  /// all); the tensor-parallel size splits each expert's width over the tensor group, as the dense MLP is
  /// (parallel::MoeMlp, "Tensor parallelism inside the experts").
  std::size_t expert_tp = 1;
  /// Sequence parallelism (Korthikanti et al., 2022): inside each stage the layer norms, residual additions and
  /// dropout work on this tensor rank's block of the tokens, and each block's tensor collectives are all-gathers
  /// and reduce-scatters instead of all-reduces. The same parameters and results as without; dense models only.
  bool sequence_parallel = false;

  /** Whether block `b` (0-based) holds a mixture of experts instead of a dense MLP. */
  [[nodiscard]] bool is_moe_block(std::size_t b) const {
    return experts > 0 && moe_every > 0 && b % moe_every == moe_every - 1;
  }
  [[nodiscard]] bool has_moe() const {
    for (std::size_t b = 0; b < layers; ++b)
      if (is_moe_block(b)) return true;
    return false;
  }
  /** The MoE layer's settings (the block fills in its width, seed and parameter ids). */
  [[nodiscard]] parallel::MoeConfig moe_config() const {
    parallel::MoeConfig m;
    m.d_model = hidden;
    m.d_ff = ffn_size();
    m.experts = experts;
    m.top_k = moe_top_k;
    m.capacity_factor = moe_capacity;
    m.aux_loss_weight = moe_aux_weight;
    m.seed = seed;
    return m;
  }

  /// The vocabulary is padded to a multiple of this. `GptTrainer` makes it lcm(16, tp) (as Megatron-LM pads to
  /// a multiple of base x tp), so any tensor-parallel size dividing the heads splits the vocabulary evenly.
  std::size_t vocab_multiple = 16;

  /** The vocabulary rounded up to a multiple of `vocab_multiple`. The padding columns of the logits are masked
   *  out (-1e30 before the softmax), so they never count in the softmax or the loss: the loss is the
   *  cross-entropy over the real `vocab` ids, whatever the padding (as llm.c). */
  [[nodiscard]] std::size_t padded_vocab() const {
    const std::size_t m = vocab_multiple ? vocab_multiple : 1;
    return (vocab + m - 1) / m * m;
  }
  [[nodiscard]] std::size_t ffn_size() const { return ffn ? ffn : 4 * hidden; }
  [[nodiscard]] bool is_llama() const { return family == ModelFamily::llama; }
  /** Key/value heads: `kv_heads`, or `heads` when 0 (GPT-2's attention has as many as query heads). */
  [[nodiscard]] std::size_t kv_head_count() const { return is_llama() && kv_heads > 0 ? kv_heads : heads; }
  /** Whether the output head is the token embedding (GPT-2) or a parameter of its own (Llama). */
  [[nodiscard]] bool tied_head() const { return !is_llama(); }

  /** Throws with what to change when the sizes do not fit tensor size `tp` (and `ep` expert ranks). */
  void validate(std::size_t tp, std::size_t ep = 1) const {
    require(vocab > 0 && hidden > 0 && heads > 0 && layers > 0 && seq > 0,
            "GPT: vocab, hidden, heads, layers and seq must be positive");
    require(hidden % heads == 0, "GPT: hidden ", hidden, " is not divisible by heads ", heads,
            "; choose hidden = k * heads");
    require(heads % tp == 0, "GPT: heads ", heads, " is not divisible by the tensor-parallel size ", tp,
            "; use --tp dividing ", heads, " or change --heads");
    require(ffn_size() % tp == 0, "GPT: the MLP size ", ffn_size(), " is not divisible by the tensor-parallel size ",
            tp);
    require(padded_vocab() % tp == 0, "GPT: the padded vocabulary ", padded_vocab(), " is not divisible by --tp ", tp,
            "; use a tensor-parallel size dividing ", vocab_multiple,
            " or set vocab_multiple to a multiple of it (GptTrainer does)");
    if (experts > 0) {
      require(moe_every >= 1 && moe_every <= layers, "GPT: --moe-every ", moe_every, " must be between 1 and --layers ",
              layers, " (1: every block is MoE, 2: every other block)");
      require(moe_top_k >= 1 && moe_top_k <= experts, "GPT: --topk ", moe_top_k, " must be between 1 and --experts ",
              experts);
      require(experts % ep == 0, "GPT: ", experts, " experts do not divide over the expert-parallel size ", ep,
              "; use --experts as a multiple of --ep ", ep, " or an --ep dividing ", experts);
      require(moe_aux_weight >= 0.0f, "GPT: --aux-coef ", moe_aux_weight, " must not be negative");
      require(expert_tp == 1 || expert_tp == tp, "GPT: --etp ", expert_tp,
              " splits each expert over that many tensor ranks, but the tensor group has ", tp,
              "; the experts split over the whole tensor group or not at all: use --etp 1 or --etp ", tp);
    }
    require(expert_tp == 1 || experts > 0, "GPT: --etp ", expert_tp,
            " splits experts over the tensor ranks, but the model has none; add --experts N or use --etp 1");
    if (is_llama()) {
      const std::size_t kv = kv_head_count();
      require(heads % kv == 0, "Llama: ", heads, " heads are not divisible by --kv-heads ", kv,
              "; choose --kv-heads dividing --heads");
      require(kv % tp == 0, "Llama: --kv-heads ", kv, " is not divisible by the tensor-parallel size ", tp,
              "; attention is split by whole key/value heads, so use --tp dividing ", kv, " or more --kv-heads");
      require((hidden / heads) % 2 == 0, "Llama: the head size hidden / heads = ", hidden / heads,
              " is odd; the rotary embedding rotates pairs, so choose an even head size");
      require(experts == 0, "Llama: --experts ", experts,
              " (mixture of experts) is built for GPT-2's blocks only; use --experts 0");
      require(dropout == 0.0, "Llama: --dropout ", dropout, ": Llama's blocks have no dropout; use --dropout 0");
      require(rope_theta > 0.0 && norm_eps > 0.0f, "Llama: --rope-theta and the RMSNorm epsilon must be positive");
    }
    require(!sequence_parallel || experts == 0, "GPT: --sequence-parallel with --experts ", experts,
            ": the MoE blocks are not sequence-parallel; use --experts 0, or drop --sequence-parallel");
    require(ep == 1 || experts > 0, "GPT: --ep ", ep, " spreads experts, but the model has none; add --experts N ",
            "(a multiple of ", ep, ") or use --ep 1");
  }

  /** Parameter ids: embeddings, final norm and (Llama) head first, then `BlockConfig::ids_per_block` per block. */
  static constexpr std::uint64_t token_embedding_id = 1, position_embedding_id = 2, final_norm_id = 3,
                                 output_head_id = 5, first_block_id = 16;
  static_assert(nn::LlamaBlockConfig::ids_per_block == nn::BlockConfig::ids_per_block);

  /** Parameters of the unsharded model (with the padded vocabulary). */
  [[nodiscard]] std::size_t parameter_count() const {
    const std::size_t h = hidden, f = ffn_size();
    if (is_llama()) {
      const std::size_t d = hidden / heads, qkv = h * (heads + 2 * kv_head_count()) * d;
      const std::size_t block = 2 * h + qkv + heads * d * h + h * 2 * f + f * h;
      return 2 * padded_vocab() * h + layers * block + h;  // embedding, blocks, final norm, untied head
    }
    const std::size_t attn = 2 * h + (3 * h * h + 3 * h) + (h * h + h) + 2 * h;
    const std::size_t dense = h * f + f + f * h + h, moe = h * experts + experts * 2 * h * f;
    std::size_t blocks = 0;
    for (std::size_t b = 0; b < layers; ++b) blocks += attn + (is_moe_block(b) ? moe : dense);
    return padded_vocab() * h + seq * h + blocks + 2 * h;
  }
};

/**
 * @brief The groups a stage's MoE blocks communicate over: `expert` (the experts' ranks) and `tokens` (the
 * ranks sharing each micro-batch, over which the load-balancing statistics are taken). Null: size-1 groups.
 */
template <communicator C>
struct GptMoeGroups {
  C* expert = nullptr;
  C* tokens = nullptr;
};

namespace detail {
/**
 * What a stage asks of one block, dense or MoE (a virtual call per block and micro-batch is noise). A block's
 * hidden states are `Act<Replicate>`, or `Act<TokenShard>` under sequence parallelism: it implements the passes of
 * its own layout, and the stage, which built its blocks for one layout, only calls those.
 */
struct GptBlock {
  virtual ~GptBlock() = default;
  virtual nn::Act<Replicate> forward(const nn::Act<Replicate>&, int) { wrong_layout(); }
  virtual nn::Act<Replicate> backward_input(const nn::Act<Replicate>&, int) { wrong_layout(); }
  virtual nn::Act<nn::TokenShard> forward(const nn::Act<nn::TokenShard>&, int) { wrong_layout(); }
  virtual nn::Act<nn::TokenShard> backward_input(const nn::Act<nn::TokenShard>&, int) { wrong_layout(); }
  virtual void backward_weight(int mb) = 0;
  virtual std::vector<nn::Parameter*> parameters() = 0;
  virtual void drop(int mb) = 0;
  virtual void set_recompute(nn::Recompute r) = 0;
  virtual void set_aux_gradient(float) {}
  virtual void set_statistics(const parallel::MoeStatistics&) {}
  /** See nn::TransformerBlock::defer_norm_gradient_reduction; nothing for a block without sequence parallelism. */
  virtual std::vector<nn::Parameter*> defer_norm_gradient_reduction() { return {}; }

 private:
  [[noreturn]] static void wrong_layout() {
    throw std::logic_error(
        "GptPipelinePart: a block was passed hidden states of a layout it was not built for (Replicate vs "
        "TokenShard); the stage builds all its blocks for GptConfig::sequence_parallel and must pass that layout");
  }
};
template <class Block>
struct GptBlockOf final : GptBlock {
  using L = typename Block::default_input;  ///< Replicate, or TokenShard for a sequence-parallel block
  using GptBlock::backward_input;
  using GptBlock::forward;
  template <class... A>
  explicit GptBlockOf(A&&... a) : block(std::forward<A>(a)...) {}
  nn::Act<L> forward(const nn::Act<L>& x, int mb) override { return block.forward(x, mb); }
  nn::Act<L> backward_input(const nn::Act<L>& dy, int mb) override { return block.backward_input(dy, mb); }
  void backward_weight(int mb) override { block.backward_weight(mb); }
  std::vector<nn::Parameter*> parameters() override { return block.parameters(); }
  void drop(int mb) override { block.drop(mb); }
  void set_recompute(nn::Recompute r) override { block.set_recompute(r); }
  void set_aux_gradient(float g) override {
    if constexpr (requires { block.set_aux_gradient(g); }) block.set_aux_gradient(g);
  }
  void set_statistics(const parallel::MoeStatistics& s) override {
    if constexpr (requires { block.set_statistics(s); }) block.set_statistics(s);
  }
  std::vector<nn::Parameter*> defer_norm_gradient_reduction() override {
    if constexpr (requires { block.defer_norm_gradient_reduction(); })
      return block.defer_norm_gradient_reduction();
    else
      return {};
  }
  Block block;
};
/**
 * A context-parallel block (`nn::RingTransformerBlock`): the stage's hidden states are the rank's zig-zag
 * tokens (whole rows on the tensor axis, which is all `Replicate` says at a stage boundary), the block's
 * own layout `Act<ContextShard>` says where the sequence is split.
 */
template <class Block, backend B>
struct GptRingBlockOf final : GptBlock {
  using GptBlock::backward_input;
  using GptBlock::forward;
  template <class... A>
  explicit GptRingBlockOf(A&&... a) : block(std::forward<A>(a)...) {}
  nn::Act<Replicate> forward(const nn::Act<Replicate>& x, int mb) override {
    return nn::Act<Replicate>(block.forward(nn::Act<nn::ContextShard>(nn::backend_copy<B>(x.tensor())), mb).tensor());
  }
  nn::Act<Replicate> backward_input(const nn::Act<Replicate>& dy, int mb) override {
    return nn::Act<Replicate>(
        block.backward_input(nn::Act<nn::ContextShard>(nn::backend_copy<B>(dy.tensor())), mb).tensor());
  }
  void backward_weight(int mb) override { block.backward_weight(mb); }
  std::vector<nn::Parameter*> parameters() override { return block.parameters(); }
  void drop(int mb) override { block.drop(mb); }
  void set_recompute(nn::Recompute r) override { block.set_recompute(r); }
  Block block;
};
}  // namespace detail

/**
 * @brief One pipeline stage of the GPT model on a tensor group `C`: blocks `[first_block, first_block + block_count)`,
 * plus the embeddings when `first`, and the final layer norm and tied head when `last`.
 */
template <communicator C, backend B = HostBackend>
class GptPipelinePart {
 public:
  using Block = nn::TransformerBlock<C, false, B>;
  using SequenceParallelBlock = nn::TransformerBlock<C, true, B>;
  using MoeBlock = MoeTransformerBlock<C, B>;
  using GradientsFinalHook = std::function<void(const std::vector<nn::Parameter*>&)>;
  using backend_type = B;  ///< the executor scales the loss gradient with it

  /**
   * `context`: the context-parallel group (null or size 1: the stage holds whole sequences). With cp > 1 the
   * stage's tokens are, per sequence, the rank's zig-zag chunks r and 2 cp - 1 - r (docs/context-parallel.md),
   * its blocks use ring self-attention over `context`, and its position embedding their global positions.
   */
  GptPipelinePart(C& tp, const GptConfig& cfg, bool first, bool last, std::size_t first_block, std::size_t block_count,
                  nn::Parameter* shared_embedding = nullptr, GptMoeGroups<C> moe_groups = {}, C* context = nullptr)
      : tp_(&tp), cfg_(cfg), first_(first), last_(last), sp_(cfg.sequence_parallel),
        cp_(context ? std::size_t(context->size()) : 1), cp_rank_(context ? std::size_t(context->rank()) : 0) {
    tokens_.seq = cfg.seq, tokens_.cp = cp_, tokens_.cp_rank = cp_rank_;  // the rest per step
    require(!cfg.sequence_parallel || (cp_ == 1 && !cfg.has_moe()), "GptPipelinePart: sequence parallelism with ",
            cp_ > 1 ? "context parallelism (cp " + std::to_string(cp_) + ")" : std::string("MoE blocks"),
            " is not supported; set GptConfig::sequence_parallel = false (drop --sequence-parallel)",
            cp_ > 1 ? " or use cp 1" : " or use a dense model (--experts 0)");
    if (cp_ > 1) {
      require(!cfg.has_moe(), "GptPipelinePart: context parallelism (cp ", cp_,
              ") with MoE blocks is not supported; use cp 1 "
              "or a dense model (--experts 0)");
      require(cfg.seq % (2 * cp_) == 0, "GptPipelinePart: sequence length ", cfg.seq,
              " is not divisible by 2 x cp = ", 2 * cp_,
              " (each sequence splits into 2 x cp equal chunks, two per context rank); use --seq a multiple of ",
              2 * cp_);
    }
    if (first_) {
      embed_.emplace(tp, nn::EmbeddingConfig{cfg.padded_vocab(), cfg.hidden, cfg.seed, GptConfig::token_embedding_id,
                                             "embed.token"});
      const std::array<std::size_t, 2> ps{cfg.seq, cfg.hidden};
      if (!cfg.is_llama())  // Llama's positions are rotary, inside the attention
        pos_ = nn::make_parameter<B, 2>("embed.position", GptConfig::position_embedding_id, ps,
                                        nn::detail::tensor_box<Replicate>(ps, 1, 0), Replicate::name(), false, cfg.seed,
                                        InitSpec::normal(0.01));
    }
    for (std::size_t i = 0; i < block_count; ++i) {
      const std::size_t b = first_block + i;
      const nn::BlockConfig bc{cfg.hidden,
                               cfg.heads,
                               cfg.ffn_size(),
                               cfg.seq,
                               cfg.dropout,
                               cfg.seed,
                               GptConfig::first_block_id + b * nn::BlockConfig::ids_per_block,
                               "block" + std::to_string(b),
                               &tokens_};
      if (cfg.is_llama()) {
        const nn::LlamaBlockConfig lc{cfg.hidden,     cfg.heads,    cfg.kv_heads, cfg.ffn_size(), cfg.seq,
                                      cfg.rope_theta, cfg.norm_eps, cfg.seed,     bc.id_base,     bc.name};
        if constexpr (mpar::detail::llama_kernel_backend<B>) {
          if (cp_ > 1) {
            if constexpr (mpar::detail::online_softmax_backend<B>)
              blocks_.push_back(
                  std::make_unique<detail::GptRingBlockOf<nn::RingLlamaBlock<C, B>, B>>(tp, *context, lc));
            else
              throw config_error(mpar::detail::cat("GptPipelinePart: context parallelism (cp ", cp_,
                                                   ") needs ring attention's online-softmax operations, which "
                                                   "backend '",
                                                   B::name, "' lacks; use cp 1"));
          } else if (sp_)
            blocks_.push_back(std::make_unique<detail::GptBlockOf<nn::LlamaBlock<C, true, B>>>(tp, lc));
          else
            blocks_.push_back(std::make_unique<detail::GptBlockOf<nn::LlamaBlock<C, false, B>>>(tp, lc));
        } else {
          throw config_error(mpar::detail::cat(
              "GptPipelinePart: the Llama family needs the Llama-class kernels (backend/llama_kernel_backend.hpp), "
              "which backend '",
              B::name, "' lacks; use the GPT-2 family on it, or a backend that has them (host, stream-host)"));
        }
      } else if (cp_ > 1) {
        if constexpr (mpar::detail::online_softmax_backend<B>)
          blocks_.push_back(
              std::make_unique<detail::GptRingBlockOf<nn::RingTransformerBlock<C, B>, B>>(tp, *context, bc));
        else
          throw config_error(mpar::detail::cat(
              "GptPipelinePart: context parallelism (cp ", cp_,
              ") needs ring attention's "
              "online-softmax operations, which backend '",
              B::name,
              "' lacks (backend/detail/online_softmax_backend.hpp); use cp 1, or a backend that has them "
              "(host, stream-host, cuda)"));
      } else if (cfg.is_moe_block(b)) {
        if (moe_groups.expert == nullptr || moe_groups.tokens == nullptr) {
          // One rank holds every expert and the whole micro-batch: size-1 groups of this tensor rank.
          own_groups_.emplace_back(std::make_unique<C>(tp.split(tp.rank(), 0)));
          if (moe_groups.expert == nullptr) moe_groups.expert = own_groups_.back().get();
          if (moe_groups.tokens == nullptr) moe_groups.tokens = own_groups_.back().get();
        }
        blocks_.push_back(std::make_unique<detail::GptBlockOf<MoeBlock>>(
            tp, *moe_groups.expert, *moe_groups.tokens, bc, cfg.moe_config(), cfg.expert_tp > 1 ? &tp : nullptr));
      } else if (sp_) {
        blocks_.push_back(std::make_unique<detail::GptBlockOf<SequenceParallelBlock>>(tp, bc));
      } else {
        blocks_.push_back(std::make_unique<detail::GptBlockOf<Block>>(tp, bc));
      }
    }
    if (last_) {
      if constexpr (mpar::detail::llama_kernel_backend<
                        B>) {  // a Llama model on another backend was refused with its blocks
        if (cfg.is_llama() && sp_)
          final_rms_sp_.emplace(tp, cfg.hidden, cfg.seed, GptConfig::final_norm_id, "final_norm", cfg.norm_eps);
        else if (cfg.is_llama())
          final_rms_.emplace(cfg.hidden, cfg.seed, GptConfig::final_norm_id, "final_norm", cfg.norm_eps);
      }
      if (!cfg.is_llama() && sp_)
        final_ln_sp_.emplace(tp, cfg.hidden, cfg.seed, GptConfig::final_norm_id, "final_norm");
      else if (!cfg.is_llama())
        final_ln_.emplace(cfg.hidden, cfg.seed, GptConfig::final_norm_id, "final_norm");
      if (cfg.is_llama()) {
        // Untied: a vocab-parallel weight of the embedding's shape and split, with its own id and values.
        nn::VocabParallelEmbedding<C, false, B> head(
            tp, nn::EmbeddingConfig{cfg.padded_vocab(), cfg.hidden, cfg.seed, GptConfig::output_head_id, "head"});
        head_own_ = std::move(*head.parameters()[0]);
        head_ = &head_own_;
      } else if (first_) {
        head_ = embed_->parameters()[0];
      } else if (shared_embedding != nullptr) {
        head_ = shared_embedding;  // the same stage object holds both ends (interleaved chunks on one rank)
      } else {
        // The tied copy: same name, id and block as the first stage's embedding shard, hence the same values.
        nn::VocabParallelEmbedding<C, false, B> twin(
            tp, nn::EmbeddingConfig{cfg.padded_vocab(), cfg.hidden, cfg.seed, GptConfig::token_embedding_id,
                                    "embed.token"});
        head_copy_ = std::move(*twin.parameters()[0]);
        head_ = &head_copy_;
      }
      ce_.emplace(tp, cfg.padded_vocab());
      // This rank's padding columns of the logits get -1e30 (exp gives 0): excluded from softmax and loss.
      const mpar::Block cols = head_->local_box[0];
      if (cols.offset + cols.extent > cfg.vocab) {
        std::vector<float> mask(cols.extent, 0.0f);
        for (std::size_t c = 0; c < cols.extent; ++c)
          if (cols.offset + c >= cfg.vocab) mask[c] = -1e30f;
        vocab_mask_ = uninitialized_buffer<float>(cols.extent);
        write_initial(vocab_mask_, std::span<const float>(mask));  // rank memory the host never touches again
      }
    }
  }
  GptPipelinePart(const GptPipelinePart&) = delete;
  GptPipelinePart& operator=(const GptPipelinePart&) = delete;

  /** The pipeline contract (pipeline/pipeline_part.hpp): what crosses a boundary, and what the last stage gives the loss. */
  using default_input = Replicate;
  template <class>
  using output_layout = Replicate;
  using loss_layout = nn::FeatureShard;

  /** Tokens as the first stage's input activation `[tokens, 1]` (every tensor rank holds the same tokens). */
  [[nodiscard]] static nn::Act<Replicate> tokens_as_activation(std::span<const std::int32_t> tokens) {
    nn::Act<Replicate> a(nn::Activation({tokens.size(), 1}));
    for (std::size_t i = 0; i < tokens.size(); ++i) a.data()[i] = float(tokens[i]);
    note_host_access(a.tensor().bytes());
    return a;
  }

  /**
   * The token ids of micro-batch `mb` as host values, for a first stage on a backend whose rank memory the
   * host must not read: its embedding then takes them from here and leaves the `[tokens, 1]` input activation
   * unread (it carries the shape only). Kept until the next call for `mb` (recomputation reruns the lookup).
   */
  void set_tokens(int mb, std::span<const std::int32_t> tokens) {
    if (std::size_t(mb) >= host_tokens_.size()) host_tokens_.resize(std::size_t(mb) + 1);
    host_tokens_[std::size_t(mb)].assign(tokens.begin(), tokens.end());
    if (std::size_t(mb) < rank_tokens_.size()) rank_tokens_[std::size_t(mb)] = {};
  }
  /**
   * The token ids of micro-batch `mb` in rank memory (checked against the vocabulary by the caller, and kept by it
   * while a step may read them): the first stage's embedding reads them there, with no upload and nothing the host
   * decides per micro-batch, so a captured step replays with whatever ids the memory holds (`GptTrainConfig::graph`).
   * Replaces what `set_tokens` gave for `mb`, and is replaced by its next call.
   */
  void set_tokens(int mb, nn::RankTokens ids) {
    if (std::size_t(mb) >= rank_tokens_.size()) rank_tokens_.resize(std::size_t(mb) + 1);
    rank_tokens_[std::size_t(mb)] = ids;
    if (std::size_t(mb) < host_tokens_.size()) host_tokens_[std::size_t(mb)].clear();
  }

  /**
   * The step the next passes belong to and, by micro-batch id, the step-batch index of each micro-batch's first
   * sequence: the blocks' dropout masks are keyed by them (nn/token_coordinates.hpp), so every layout drops what
   * the single-rank run drops and each step draws new masks. Not set: the masks are keyed by micro-batch id, the
   * same every step. Dropout under context parallelism needs them. `microbatches_per_step` > 0: the passes run
   * several steps, micro-batch id `mb` belonging to step `step + mb / microbatches_per_step`.
   */
  void set_token_coordinates(std::uint64_t step, std::vector<std::size_t> first_sequence,
                             std::size_t microbatches_per_step = 0) {
    tokens_.step = step;
    tokens_.first_sequence = std::move(first_sequence);
    tokens_.microbatches_per_step = microbatches_per_step;
    tokens_.training = true;
  }
  /**
   * Whether the passes train (dropout draws its masks) or evaluate (dropout is the identity, as in PyTorch's
   * `model.eval()`): `GptTrainer::evaluate` and `models::generate` switch it off; `set_token_coordinates` on.
   */
  void set_training(bool on) { tokens_.training = on; }
  [[nodiscard]] bool training() const { return tokens_.training; }

  /** Forward of micro-batch `mb` on a stage other than the last: tokens (first stage) or hidden states in, hidden states out. */
  nn::Act<Replicate> forward(const nn::Act<Replicate>& x, int mb) {
    require(!last_,
            "GptPipelinePart: the last stage returns vocab-sharded logits, not hidden states; call forward_to_loss");
    // Under sequence parallelism the next stage receives whole rows, as every stage boundary carries them, and
    // sends back a gradient that is the same on every tensor rank: each keeps its own rows of it.
    if (sp_) return nn::GatherTokensReplicatedGrad::forward<B>(*tp_, hidden<nn::TokenShard>(x, mb));
    return hidden<Replicate>(x, mb);
  }
  /** Forward of micro-batch `mb` on the last stage: tokens or hidden states in, this rank's vocab-sharded logits out. */
  nn::Act<nn::FeatureShard> forward_to_loss(const nn::Act<Replicate>& x, int mb) {
    require(last_, "GptPipelinePart: only the last stage returns logits; call forward on the others");
    if (sp_) {
      nn::Act<nn::TokenShard> h = hidden<nn::TokenShard>(x, mb);
      return use_unit(head_unit(), no_unit, [&] { return head_forward(std::move(h), mb); });
    }
    nn::Act<Replicate> h = hidden<Replicate>(x, mb);
    return use_unit(head_unit(), no_unit, [&] { return head_forward(std::move(h), mb); });
  }

 private:
  /** The final layer norm and the tied head: the last block's hidden states (`L`) in, vocab-sharded logits out. */
  template <class L>
  nn::Act<nn::FeatureShard> head_forward(nn::Act<L> h, int mb) {
    // The tied head is column-parallel over the vocabulary: f (identity forward), then this rank's
    // vocabulary rows of E give vocab-sharded logits. Under sequence parallelism the norm works on this rank's
    // tokens and an all-gather replaces f (its backward reduce-scatters the head's Partial input gradient).
    nn::Act<Replicate> hn = [&] {
      nn::Act<L> hn = with_final_norm<L>([&](auto& norm) { return norm.forward(h, mb); });
      if constexpr (std::is_same_v<L, nn::TokenShard>)
        return nn::GatherTokens::forward<B>(*tp_, std::move(hn));
      else
        return nn::CopyToTensorRegion::forward<B>(*tp_, std::move(hn));
    }();
    nn::Act<nn::FeatureShard> logits(nn::Activation({hn.extent(0), head_->local_box[0].extent}, uninitialized));
    // Inside an Autocast scope the head's products take 16-bit operands (the input converted once, kept for
    // W; the weight once per scope) and accumulate in fp32: the logits and the loss stay fp32.
    const nn::ComputeType ct = nn::autocast_type();
    nn::detail::GemmOperand hop = nn::detail::make_operand<B>(std::move(hn).tensor(), ct);
    const std::size_t t = hop.rows, vl = logits.extent(1), hd = cfg_.hidden;
    if (ct == nn::ComputeType::fp32) {
      B::run(ops::gemm<float>{.ta = Trans::no,
                              .tb = Trans::yes,
                              .m = t,
                              .n = vl,
                              .k = hd,
                              .alpha = 1.0f,
                              .a = hop.f32.data(),
                              .lda = hd,
                              .b = head_->value.data(),
                              .ldb = hd,
                              .beta = 0.0f,
                              .c = logits.data(),
                              .ldc = vl});
    } else {
      nn::detail::with_half(ct, [&]<class T>(T) {
        B::run(ops::gemm<T, float>{.ta = Trans::no,
                                   .tb = Trans::yes,
                                   .m = t,
                                   .n = vl,
                                   .k = hd,
                                   .alpha = 1.0f,
                                   .a = hop.template half<T>(),
                                   .lda = hd,
                                   .b = head16_.template get<B, T>(*head_),
                                   .ldb = hd,
                                   .beta = 0.0f,
                                   .c = logits.data(),
                                   .ldc = vl});
      });
    }
    if (!vocab_mask_.empty())
      B::run(ops::bias_add_forward{
          .rows = logits.extent(0), .cols = logits.extent(1), .bias = vocab_mask_.data(), .y = logits.data()});
    head_inputs_.put(mb).x = std::move(hop);
    return logits;
  }

 public:
  /**
   * B of micro-batch `mb`: the input gradient (what the previous stage waits for), with the tensor
   * all-reduces. Keeps the head's logit gradient and every projection's inputs for backward_weight;
   * the layer norms' gains and biases get their (cheap) gradients here.
   */
  nn::Act<Replicate> backward_input(const nn::Act<Replicate>& dy, int mb) {
    if (sp_) return blocks_backward_input(blocks_output_gradient<nn::TokenShard>(dy, mb), mb);
    return blocks_backward_input(blocks_output_gradient<Replicate>(dy, mb), mb);
  }
  /** B of the last stage: from this rank's vocab-sharded logit gradient. */
  nn::Act<Replicate> backward_input(const nn::Act<nn::FeatureShard>& dlogits, int mb) {
    if (sp_) return blocks_backward_input(blocks_output_gradient<nn::TokenShard>(dlogits, mb), mb);
    return blocks_backward_input(blocks_output_gradient<Replicate>(dlogits, mb), mb);
  }

  /**
   * W of micro-batch `mb`: the head's `dE_local += dlogitsᵀ · h`, every block's projection weight
   * gradients and the embeddings; no communication. The `microbatches`-th W of a step (see
   * on_gradients_final) is the last one, so after it each layer's gradients are final.
   */
  void backward_weight(int mb) {
    const bool final = weights_final();
    if (last_) head_backward_weight(mb, final);
    for (std::size_t i = blocks_.size(); i-- > 0;) block_backward_weight(i, mb, final);
    if (first_) embeddings_backward_weight(mb, final);
  }

  /**
   * Backward of micro-batch `mb` (hidden-state gradient, or the last stage's logit gradient): B and W of the head,
   * then of each block from the last, then of the embeddings, so that each projection's kept operands are freed
   * as soon as its weight gradient is made (a stage's split B then W would hold every block's at once) and each
   * group's gradients are final, for the data-parallel buckets, as early as they can be. The same arithmetic as
   * `backward_input` followed by `backward_weight`.
   */
  template <class G>
    requires std::same_as<G, Replicate> || std::same_as<G, nn::FeatureShard> nn::Act<Replicate> backward(
        const nn::Act<G>& dy, int mb) {
      if (sp_) return unit_by_unit_backward<nn::TokenShard>(dy, mb);
      return unit_by_unit_backward<Replicate>(dy, mb);
    }

  void drop(int mb) {
    if (embed_) embed_->drop(mb);
    for (auto& b : blocks_) b->drop(mb);
    if (last_) {
      with_final_norm([&](auto& norm) { norm.drop(mb); });
      head_inputs_.drop(mb);
      head_pending_.drop(mb);
    }
    embed_pending_.drop(mb);
  }

  /** Every parameter this stage updates (the tied copy included, once). */
  std::vector<nn::Parameter*> parameters() {
    std::vector<nn::Parameter*> ps;
    if (first_) nn::detail::append(ps, embedding_parameters());
    for (auto& b : blocks_) nn::detail::append(ps, b->parameters());
    if (last_) {
      nn::detail::append(ps, final_norm_parameters());
      if (head_ == &head_copy_ || head_ == &head_own_) ps.push_back(head_);
    }
    return ps;
  }
  /** This stage's parameters under their stable names (docs/train_gpt.md), the head's tied copy excluded. */
  std::vector<std::pair<std::string, nn::Parameter*>> named_parameters() {
    std::vector<std::pair<std::string, nn::Parameter*>> out;
    for (auto* p : norm_parameters()) out.emplace_back(p->name, p);
    return out;
  }
  /** Parameters counted in the global gradient norm: all but the tied copy (its gradient equals the original's). */
  std::vector<nn::Parameter*> norm_parameters() {
    auto ps = parameters();
    std::erase(ps, &head_copy_);
    return ps;
  }

  /**
   * @brief Calls `hook(params)` as soon as a group of this stage's gradients is final — after the weight
   * gradient part (backward_weight, or the W half of a whole backward) of the `microbatches`-th
   * micro-batch of a step, layer by layer — so data-parallel buckets can start reducing them while the
   * backward continues. Under zero-bubble schedules that is the step's last W on this stage, whatever
   * its micro-batch. Call `begin_step()` before each step.
   *
   * With the count known (`microbatches` > 0, even with an empty hook), a sequence-parallel stage's layer
   * norms stop all-reducing their gain and bias gradients over the tensor group in every backward: each
   * group's norms are summed in one all-reduce when its gradients become final, before `hook` sees them (once
   * per step, as Megatron-LM finalises its sequence-parallel gradients). The gradients must start each step at
   * zero, as the trainer's zeroing leaves them.
   */
  void on_gradients_final(GradientsFinalHook hook, int microbatches) {
    hook_ = std::move(hook);
    microbatches_ = microbatches;
    if (sp_ && microbatches > 0 && !norms_deferred_) {
      norms_deferred_ = true;
      for (auto& b : blocks_) block_norms_.push_back(b->defer_norm_gradient_reduction());
      if (last_) with_final_norm<nn::TokenShard>([](auto& norm) { norm.defer_gradient_reduction(true); });
    }
  }
  void begin_step() { weights_done_ = 0; }

  /**
   * Every block's recomputation: `selective` drops the attention core's probabilities; `full` makes each block keep
   * only its input (the trainer's full recomputation is the pipeline executor's instead, per stage: it keeps the
   * stage input and reruns the stage's forward).
   */
  void set_recompute(nn::Recompute r) {
    for (auto& b : blocks_) b->set_recompute(r);
  }
  /**
   * Each block's own recomputation, in block order (a per-block mix: a `full` block keeps only its input and reruns
   * its forward before its backward, while the stage's other blocks keep theirs).
   */
  void set_block_recompute(const std::vector<nn::Recompute>& modes) {
    require(modes.size() == blocks_.size(), "GptPipelinePart: ", modes.size(),
            " per-block recomputation modes for a stage of ", blocks_.size(), " blocks; give one mode per block");
    for (std::size_t i = 0; i < modes.size(); ++i) blocks_[i]->set_recompute(modes[i]);
  }

  /**
   * @brief ZeRO-3's hook point: `hook(unit, next, begin)` is called with `begin` = true just before a unit of
   * this stage's parameters (`units()`) is used — a forward, or the input-gradient part of a backward — and
   * with false right after; `next` is the unit this pass uses after it (`no_unit` when none), so its
   * parameters can be gathered while this one computes. The weight-gradient part (W) reads no weights, so it
   * is not announced. Empty: nothing is called (the parameters are always in place).
   */
  using UnitHook = std::function<void(std::size_t unit, std::size_t next, bool begin)>;
  static constexpr std::size_t no_unit = std::size_t(-1);
  void on_unit_use(UnitHook hook) { unit_hook_ = std::move(hook); }
  /**
   * The units the passes use whole, in forward order: the embeddings (first stage: token and position
   * tables), each block, and the head (last stage: the final norm and the tied head weight, unless the head
   * is the tied copy, which is not sharded).
   */
  std::vector<std::vector<nn::Parameter*>> units() {
    std::vector<std::vector<nn::Parameter*>> out;
    if (first_) out.push_back(embedding_parameters());
    for (auto& b : blocks_) out.push_back(b->parameters());
    if (last_) {
      out.push_back(final_norm_parameters());
      if (head_ != &head_copy_) out.back().push_back(head_);
    }
    return out;
  }
  /** d(objective)/d(each MoE block's load-balancing loss) in this rank's backward (see MoeTransformerBlock). */
  void set_moe_aux_gradient(float g) {
    for (auto& b : blocks_) b->set_aux_gradient(g);
  }
  /** Where every MoE block's backward adds its load-balancing loss and dropped count (rank memory). */
  void set_moe_statistics(const parallel::MoeStatistics& s) {
    for (auto& b : blocks_) b->set_statistics(s);
  }

  [[nodiscard]] bool is_first() const { return first_; }
  [[nodiscard]] bool is_last() const { return last_; }
  [[nodiscard]] std::size_t block_count() const { return blocks_.size(); }
  /** The token embedding shard (first stage) — the head of a single-stage model shares it. */
  [[nodiscard]] nn::Parameter* token_embedding() { return first_ ? embed_->parameters()[0] : nullptr; }
  /** The head's weight (last stage): the embedding itself, or the tied copy. */
  [[nodiscard]] nn::Parameter* head_weight() { return last_ ? head_ : nullptr; }
  [[nodiscard]] bool head_is_copy() const { return last_ && head_ == &head_copy_; }
  [[nodiscard]] nn::VocabParallelCrossEntropy<C, B>& loss() { return *ce_; }
  [[nodiscard]] const GptConfig& config() const { return cfg_; }
  /** The tensor-parallel group this stage was built over. */
  [[nodiscard]] C& tensor_group() { return *tp_; }

 private:
  struct HeadInput {
    nn::detail::GemmOperand x;  ///< the final norm's output, 16-bit under Autocast
  };
  /** The embedding's output gradient, kept from B for W. */
  struct EmbedGrad {
    nn::Act<Replicate> dy;
  };

  /** Unit indices (see units()): the embeddings are unit 0 on the first stage, then the blocks, then the head. */
  [[nodiscard]] std::size_t block_unit(std::size_t i) const { return (first_ ? 1 : 0) + i; }
  [[nodiscard]] std::size_t head_unit() const { return block_unit(blocks_.size()); }
  /** Runs `f` between the unit hook's begin and end of `unit` (just `f` without a hook). */
  template <class F>
  auto use_unit(std::size_t unit, std::size_t next, F&& f) {
    if (!unit_hook_) return f();
    unit_hook_(unit, next, true);
    auto out = f();
    unit_hook_(unit, next, false);
    return out;
  }

  [[nodiscard]] std::vector<nn::Parameter*> final_norm_parameters() {
    return with_final_norm([](auto& norm) { return norm.parameters(); });
  }
  /** The token table, and GPT-2's position table (Llama has none). */
  [[nodiscard]] std::vector<nn::Parameter*> embedding_parameters() {
    std::vector<nn::Parameter*> ps{embed_->parameters()[0]};
    if (!cfg_.is_llama()) ps.push_back(&pos_);
    return ps;
  }
  /** `f(norm)` on the final norm of the blocks' layout `L`: LayerNorm (GPT-2) or RMSNorm (Llama). */
  template <class L, class F>
  decltype(auto) with_final_norm(F&& f) {
    if constexpr (mpar::detail::llama_kernel_backend<B>) {
      if (cfg_.is_llama()) {
        if constexpr (std::is_same_v<L, nn::TokenShard>)
          return f(*final_rms_sp_);
        else
          return f(*final_rms_);
      }
    }
    if constexpr (std::is_same_v<L, nn::TokenShard>)
      return f(*final_ln_sp_);
    else
      return f(*final_ln_);
  }
  /** `with_final_norm` in this stage's layout, for what does not depend on it (parameters, freeing a micro-batch). */
  template <class F>
  decltype(auto) with_final_norm(F&& f) {
    return sp_ ? with_final_norm<nn::TokenShard>(f) : with_final_norm<Replicate>(f);
  }

  /**
   * The embeddings (first stage) and the blocks: tokens or hidden states in, the last block's hidden states out, as
   * `Act<L>` (`TokenShard` under sequence parallelism: the replicated input is split into the tensor ranks' blocks
   * of tokens after the embeddings' sum, as Megatron-LM's embedding does).
   */
  template <class L>
  nn::Act<L> hidden(const nn::Act<Replicate>& x, int mb) {
    const std::size_t after_blocks = last_ ? head_unit() : no_unit;
    nn::Act<L> h = [&] {
      if constexpr (std::is_same_v<L, nn::TokenShard>) {
        if (!first_) return nn::ScatterTokens::forward<B>(*tp_, x, "GptPipelinePart");
        return nn::ScatterTokens::forward<B>(*tp_, use_unit(0, block_unit(0), [&] { return embed(x, mb); }),
                                             "GptPipelinePart (embeddings)");
      } else {
        return first_ ? use_unit(0, block_unit(0), [&] { return embed(x, mb); }) : nn::backend_copy<B>(x);
      }
    }();
    for (std::size_t i = 0; i < blocks_.size(); ++i)
      h = use_unit(block_unit(i), i + 1 < blocks_.size() ? block_unit(i + 1) : after_blocks,
                   [&] { return blocks_[i]->forward(h, mb); });
    return h;
  }
  /** B of the blocks (and, first stage, the embeddings' pending gradient); the first stage returns a zero token gradient. */
  template <class L>
  nn::Act<Replicate> blocks_backward_input(nn::Act<L> dy_blocks, int mb) {
    for (std::size_t i = blocks_.size(); i-- > 0;)
      dy_blocks = use_unit(block_unit(i), i > 0 ? block_unit(i - 1) : no_unit,
                           [&] { return blocks_[i]->backward_input(dy_blocks, mb); });
    return stage_input_gradient(std::move(dy_blocks), mb);
  }
  /**
   * The gradient of the stage's input from its first block's (whole rows again under sequence parallelism); the
   * first stage keeps it for the embeddings' W and returns a placeholder (token ids have no gradient).
   */
  template <class L>
  nn::Act<Replicate> stage_input_gradient(nn::Act<L> dy_blocks, int mb) {
    nn::Act<Replicate> dy = [&] {
      if constexpr (std::is_same_v<L, nn::TokenShard>)
        return nn::ScatterTokens::backward<B>(*tp_, std::move(dy_blocks));  // whole rows for the stage's input
      else
        return std::move(dy_blocks);
    }();
    if (first_) {
      const std::size_t t = dy.extent(0);
      embed_pending_.put(mb).dy = std::move(dy);
      // A placeholder (token ids have no gradient); nobody reads it, so a stream-ordered backend leaves it unwritten.
      if constexpr (mpar::host_reads_rank_memory<B>)
        return nn::Act<Replicate>(nn::Activation({t, 1}));
      else
        return nn::Act<Replicate>(nn::Activation({t, 1}, uninitialized));
    }
    return dy;
  }

  /** B of the head and the final layer norm: vocab-sharded logit gradient in, the last block's output gradient out. */
  template <class L>
  nn::Act<L> head_backward_input(const nn::Act<nn::FeatureShard>& dy, int mb) {
    auto saved = head_inputs_.take(mb, "GptPipelinePart head");
    const std::size_t t = dy.extent(0), vl = dy.extent(1), h = cfg_.hidden;
    require(saved.x.rows == t && vl == head_->local_box[0].extent, "GptPipelinePart head: logit gradient is ", t, "x",
            vl, ", expected ", saved.x.rows, "x", head_->local_box[0].extent);
    // dh = dlogits · E_local: this rank's vocabulary shard's contribution, summed by f's backward. In the type
    // the forward used: under Autocast the logit gradient is converted once and kept (16-bit) for W.
    nn::Act<nn::TensorPartial> dh(nn::Activation({t, h}, uninitialized));
    const nn::ComputeType ct = saved.x.type;
    nn::detail::GemmOperand dy_op = nn::detail::make_operand<B>(dy.tensor(), ct);  // fp32: a copy, kept for W
    if (ct == nn::ComputeType::fp32) {
      B::run(ops::gemm<float>{.ta = Trans::no,
                              .tb = Trans::no,
                              .m = t,
                              .n = h,
                              .k = vl,
                              .alpha = 1.0f,
                              .a = dy.data(),
                              .lda = vl,
                              .b = head_->value.data(),
                              .ldb = h,
                              .beta = 0.0f,
                              .c = dh.data(),
                              .ldc = h});
    } else {
      nn::detail::with_half(ct, [&]<class T>(T) {
        B::run(ops::gemm<T, float>{.ta = Trans::no,
                                   .tb = Trans::no,
                                   .m = t,
                                   .n = h,
                                   .k = vl,
                                   .alpha = 1.0f,
                                   .a = dy_op.template half<T>(),
                                   .lda = vl,
                                   .b = head16_.template get<B, T>(*head_),
                                   .ldb = h,
                                   .beta = 0.0f,
                                   .c = dh.data(),
                                   .ldc = h});
      });
    }
    head_pending_.put(mb) = {std::move(saved.x), std::move(dy_op)};  // kept for W
    nn::Act<L> dn = [&] {
      if constexpr (std::is_same_v<L, nn::TokenShard>)
        return nn::GatherTokens::backward<B>(*tp_, std::move(dh), "GptPipelinePart head");
      else
        return nn::CopyToTensorRegion::backward<B>(*tp_, std::move(dh));
    }();
    return with_final_norm<L>([&](auto& norm) { return norm.backward(dn, mb); });
  }

  /**
   * The gradient of the last block's output, in the blocks' layout `L`: the last stage's head and final norm B from
   * the logit gradient; another stage's received gradient (under sequence parallelism this rank's rows of it).
   */
  template <class L, class G>
  nn::Act<L> blocks_output_gradient(const nn::Act<G>& dy, int mb) {
    if constexpr (std::same_as<G, nn::FeatureShard>) {
      require(last_,
              "GptPipelinePart: only the last stage takes a logit gradient; pass the hidden-state gradient "
              "(Act<Replicate>)");
      return use_unit(head_unit(), head_unit() - 1, [&] { return head_backward_input<L>(dy, mb); });
    } else {
      require(!last_,
              "GptPipelinePart: the last stage's output gradient is the vocab-sharded logit gradient "
              "(Act<FeatureShard>)");
      if constexpr (std::is_same_v<L, nn::TokenShard>)
        return nn::GatherTokensReplicatedGrad::backward<B>(*tp_, dy, "GptPipelinePart");
      else
        return nn::backend_copy<B>(dy);
    }
  }
  /** Counts a micro-batch's W: whether it is the step's last, after which each group's gradients are final. */
  bool weights_final() {
    const bool final = weights_done_ + 1 == microbatches_;
    ++weights_done_;
    return final;
  }
  /**
   * A group's gradients are final: its sequence-parallel norms' shares (`norms`) are summed over the tensor group when
   * they were deferred, then the hook sees the group.
   */
  void gradients_final(const std::vector<nn::Parameter*>& group, const std::vector<nn::Parameter*>& norms) {
    if (norms_deferred_) nn::all_reduce_gradients<B>(*tp_, norms);
    if (hook_) hook_(group);
  }
  /** W of the tied head: `dE_local += dlogitsᵀ · h`. */
  void head_backward_weight(int mb, bool final) {
    auto w =
        head_pending_.take(mb, "GptPipelinePart head backward_weight (no backward_input ran for this micro-batch)");
    const std::size_t t = w.dy.rows, vl = w.dy.cols, h = cfg_.hidden;
    if (w.dy.type == nn::ComputeType::fp32) {
      B::run(ops::gemm<float>{.ta = Trans::yes,
                              .tb = Trans::no,
                              .m = vl,
                              .n = h,
                              .k = t,
                              .alpha = 1.0f,
                              .a = w.dy.f32.data(),
                              .lda = vl,
                              .b = w.x.f32.data(),
                              .ldb = h,
                              .beta = 1.0f,
                              .c = head_->grad.data(),
                              .ldc = h});
    } else {
      nn::detail::with_half(w.dy.type, [&]<class T>(T) {
        B::run(ops::gemm<T, float>{.ta = Trans::yes,
                                   .tb = Trans::no,
                                   .m = vl,
                                   .n = h,
                                   .k = t,
                                   .alpha = 1.0f,
                                   .a = w.dy.template half<T>(),
                                   .lda = vl,
                                   .b = w.x.template half<T>(),
                                   .ldb = h,
                                   .beta = 1.0f,
                                   .c = head_->grad.data(),
                                   .ldc = h});
      });
    }
    if (final) {
      std::vector<nn::Parameter*> group = final_norm_parameters();
      if (head_ == &head_own_) group.push_back(head_);  // untied: final here, not with the embedding
      gradients_final(group, final_norm_parameters());
    }
  }
  void block_backward_weight(std::size_t i, int mb, bool final) {
    blocks_[i]->backward_weight(mb);
    if (final) gradients_final(blocks_[i]->parameters(), norms_deferred_ ? block_norms_[i] : no_norms);
  }
  void embeddings_backward_weight(int mb, bool final) {
    auto e = embed_pending_.take(
        mb, "GptPipelinePart embedding backward_weight (no backward_input ran for this micro-batch)");
    embed_backward(std::move(e.dy), mb, final);
  }
  /** `backward` with the blocks' hidden states in layout `L`. */
  template <class L, class G>
  nn::Act<Replicate> unit_by_unit_backward(const nn::Act<G>& dy, int mb) {
    nn::Act<L> d = blocks_output_gradient<L>(dy, mb);
    const bool final = weights_final();
    if (last_) head_backward_weight(mb, final);
    for (std::size_t i = blocks_.size(); i-- > 0;) {
      d = use_unit(block_unit(i), i > 0 ? block_unit(i - 1) : no_unit,
                   [&] { return blocks_[i]->backward_input(d, mb); });
      block_backward_weight(i, mb, final);
    }
    nn::Act<Replicate> dx = stage_input_gradient(std::move(d), mb);
    if (first_) embeddings_backward_weight(mb, final);
    return dx;
  }

  nn::Act<Replicate> embed(const nn::Act<Replicate>& x, int mb) {
    require(x.extent(1) == 1, "GptPipelinePart: the first stage takes token ids as a [tokens, 1] activation, got ",
            x.extent(0), "x", x.extent(1));
    const std::size_t n = x.extent(0);
    nn::Act<Replicate> h = [&] {
      if (std::size_t(mb) < rank_tokens_.size() && rank_tokens_[std::size_t(mb)].size == n)
        return embed_->embed(rank_tokens_[std::size_t(mb)], mb);  // in rank memory: the activation is not read
      std::vector<std::int32_t> tokens(n);
      if (std::size_t(mb) < host_tokens_.size() && host_tokens_[std::size_t(mb)].size() == n) {
        tokens = host_tokens_[std::size_t(mb)];  // given by set_tokens: the activation's values are not read
      } else {
        for (std::size_t i = 0; i < n; ++i) tokens[i] = std::int32_t(x.data()[i]);
        note_host_access(x.tensor().bytes());
      }
      return embed_->embed(std::span<const std::int32_t>(tokens), mb);
    }();
    if (cfg_.is_llama()) return h;  // rotary positions, applied to q and k inside each block's attention
    // h[b, s, :] += position[s, :]: with each sequence a row of seq x hidden values, the position table is
    // that row's bias, so one bias addition covers the micro-batch. Under cp the row is the rank's two
    // chunks, and the bias their rows of the table.
    const std::size_t seq = cfg_.seq / cp_, block = seq * cfg_.hidden;
    require(n % seq == 0, "GptPipelinePart: ", n, " tokens are not whole sequences of ", seq,
            cp_ > 1 ? " (this context rank's share of each sequence)" : "");
    if (cp_ == 1) {
      B::run(ops::bias_add_forward{.rows = n / seq, .cols = block, .bias = pos_.value.data(), .y = h.data()});
    } else {
      nn::Activation table({seq, cfg_.hidden}, uninitialized);
      // The two chunks' rows of the table in one strided copy (the second chunk lies after the first).
      const std::size_t half = block / 2;
      B::run(ops::copy_2d<float>{.rows = 2,
                                 .cols = half,
                                 .src = pos_.value.data() + position_chunk(0) * half,
                                 .src_ld = (position_chunk(1) - position_chunk(0)) * half,
                                 .dst = table.data(),
                                 .dst_ld = half});
      B::run(ops::bias_add_forward{.rows = n / seq, .cols = block, .bias = table.data(), .y = h.data()});
    }
    return h;  // the position embedding is replicated: the sum stays Replicate
  }
  /** The global chunk index of this context rank's `a`-th chunk (0: chunk r, 1: chunk 2 cp - 1 - r). */
  [[nodiscard]] std::size_t position_chunk(std::size_t a) const { return a == 0 ? cp_rank_ : 2 * cp_ - 1 - cp_rank_; }
  void embed_backward(nn::Act<Replicate> dy, int mb, bool final) {
    const std::size_t seq = cfg_.seq / cp_, block = seq * cfg_.hidden;
    if (cfg_.is_llama()) {
      // no position table
    } else if (cp_ == 1) {
      B::run(ops::bias_add_backward{.rows = dy.extent(0) / seq,
                                    .cols = block,
                                    .dy = dy.data(),
                                    .dbias = pos_.grad.data()});  // the sum over sequences
    } else {
      // The sum over sequences of the rank's two chunks, added into their rows of the table's gradient.
      nn::Activation g({seq, cfg_.hidden}, uninitialized);
      B::run(ops::zero<float>{.n = g.size(), .x = g.data()});
      B::run(ops::bias_add_backward{.rows = dy.extent(0) / seq, .cols = block, .dy = dy.data(), .dbias = g.data()});
      const std::size_t half = block / 2;
      for (std::size_t a = 0; a < 2; ++a)
        B::run(ops::bias_add_forward{
            .rows = 1, .cols = half, .bias = g.data() + a * half, .y = pos_.grad.data() + position_chunk(a) * half});
    }
    embed_->backward(std::move(dy), mb);  // moved: the typed backward takes it by value
    // The embedding of a single-stage model is also the head: its gradient is final only here.
    if (final && hook_) hook_(embedding_parameters());
  }

  C* tp_;
  GptConfig cfg_;
  bool first_, last_;
  bool sp_ = false;  ///< GptConfig::sequence_parallel: the blocks and the final norm work on token shards
  std::size_t cp_ = 1, cp_rank_ = 0;  ///< context-parallel size and this rank's place in the ring
  nn::TokenCoordinates tokens_;       ///< the blocks' dropout keys (set_token_coordinates)
  std::optional<nn::VocabParallelEmbedding<C, false, B>> embed_;
  nn::Parameter pos_;
  std::vector<std::unique_ptr<C>> own_groups_;  // size-1 MoE groups when none were given (declared before the blocks)
  std::vector<std::unique_ptr<detail::GptBlock>> blocks_;
  std::optional<nn::LayerNorm<Replicate, nn::NoComm, B>> final_ln_;  ///< without sequence parallelism
  std::optional<nn::LayerNorm<nn::TokenShard, C, B>> final_ln_sp_;   ///< with it
  /// Llama's final norm, without and with sequence parallelism (nothing on a backend without its kernels).
  template <class Norm>
  using IfLlamaKernels = std::conditional_t<mpar::detail::llama_kernel_backend<B>, Norm, std::monostate>;
  std::optional<IfLlamaKernels<nn::RMSNorm<Replicate, nn::NoComm, B>>> final_rms_;
  std::optional<IfLlamaKernels<nn::RMSNorm<nn::TokenShard, C, B>>> final_rms_sp_;
  nn::Parameter head_own_;  ///< Llama's untied head
  nn::Parameter head_copy_;
  nn::Parameter* head_ = nullptr;
  std::optional<nn::VocabParallelCrossEntropy<C, B>> ce_;
  std::vector<std::vector<std::int32_t>> host_tokens_;  ///< set_tokens: host ids per micro-batch (first stage)
  std::vector<nn::RankTokens> rank_tokens_;             ///< set_tokens: ids in rank memory per micro-batch
  Buffer<float> vocab_mask_;  ///< 0 for real ids, -1e30 for this rank's padding columns; empty when it has none
  nn::MicroBatchCache<HeadInput> head_inputs_;
  nn::MicroBatchCache<nn::detail::WeightGradOperands> head_pending_;  // final-norm output and logit gradient
  nn::HalfWeight head16_;  // the head's 16-bit weight inside an Autocast scope
  nn::MicroBatchCache<EmbedGrad> embed_pending_;
  GradientsFinalHook hook_;
  UnitHook unit_hook_;  ///< ZeRO-3's gathers (see on_unit_use)
  int microbatches_ = 0, weights_done_ = 0;
  bool norms_deferred_ = false;  ///< sequence parallelism: the norms' gradients are summed once per step
  std::vector<std::vector<nn::Parameter*>> block_norms_;  ///< per block, the norm parameters summed then
  inline static const std::vector<nn::Parameter*> no_norms;
};

}  // namespace mpar::models
