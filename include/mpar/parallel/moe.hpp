#pragma once
/**
 * @file A top-k gated mixture-of-experts MLP with experts spread over the expert axis (GShard, arXiv
 * 2006.16668; Switch Transformer, arXiv 2101.03961).
 *
 * Per rank, for its local tokens x [T, d]:
 * 1. gate: probs = softmax(x Wg) [T, E]; each token picks its k most probable experts (ties: lower index);
 * 2. capacity: each expert accepts at most C = ceil(capacity_factor * k * T / E) assignments *from this rank*
 *    (capacity_factor <= 0: unlimited, i.e. C = T). First choices of all tokens are served before second
 *    choices, tokens in index order; a dropped assignment contributes nothing (the block's residual connection
 *    carries the token), and `dropped()` counts them;
 * 3. dispatch: every expert has C slots per source rank, filled with its accepted tokens (index order) and
 *    zero rows after them; the E C rows travel to the experts' ranks by one `all_to_all` over the expert
 *    group (expert e lives on expert rank e / (E / EP)). The sizes are static (GShard's and Megatron's
 *    capacity-bounded dispatch), so no count crosses to the host; the price is the empty slots' rows;
 * 4. experts: out = gelu(x W1[e]) W2[e] over all their slots (an empty slot's zero row gives zero);
 * 5. combine: results travel back by `all_to_all`; y_t = sum_j probs[t, e_j] * out_{t,j} (the gate
 *    probability of each accepted choice, not renormalised over the k choices).
 * Every step is a backend operation or a stream-ordered collective on rank memory (routing: `moe_route`,
 * `moe_gate_stats`, `moe_aux_loss`, `moe_slots`, `moe_gate_backward`: backend/ops/token_routing.hpp); the forward and
 * backward never wait for the stream. `aux_loss()` and `dropped()` are host reads, for callers that want them;
 * a training step collects both in rank memory through `set_statistics`.
 * Load-balancing loss (Switch): aux = alpha * E * sum_e f_e P_e, f_e the fraction of the k*T assignments
 * (before capacity) that chose e, P_e the mean gate probability of e — both over the tokens of the *whole
 * token group* (one small all_reduce), so it does not depend on how tokens are spread over ranks; f is not
 * differentiated, as in Switch. The token group defaults to the expert group; inside a model trained with
 * data parallelism as well it is every rank that holds a part of the same micro-batch (data x expert).
 *
 * Several micro-batches may be in flight (pipeline schedules): `forward(..., mb)` keeps what backward
 * needs per micro-batch `mb`, `backward(..., mb)` takes it, `drop(mb)` frees it early.
 *
 * Mixed precision: inside an `nn::Autocast` scope the experts' six GEMMs per expert (two forward, four
 * backward) take 16-bit operands with fp32 accumulation — the activations converted right before each
 * product, the weights the optimizer's 16-bit copies (`nn::HalfWeight`) — as the dense layers do. The gate's
 * product, its softmax and the routing stay fp32: the top-k choice is a discrete decision that a rounded
 * logit could flip, and it must not depend on the layout.
 *
 * Gradients: expert weights receive every token routed to them from every rank, so they are complete on
 * their owner. The gate weight is replicated: its gradient is this rank's share and must be summed (or
 * averaged, as data parallelism does) over the ranks that hold different tokens.
 *
 * Tensor parallelism inside the experts (an `expert_tensor` group of size etp > 1; Megatron-Core's expert tensor
 * parallelism): the ranks of that group route the same tokens (they are the tensor ranks of one attention, whose
 * output is replicated over them), so each keeps a `d_ff / etp` slice of every expert — W1's columns and W2's rows,
 * as a dense MLP's column- and row-parallel pair — and computes its part of every slot's output. One all-reduce of
 * the slots' partial outputs over the group (before the combine's exchange) and one of the slots' partial input
 * gradients (before the backward's) complete them; the gate and the routing stay replicated. Expert weights and
 * their optimizer states shrink by etp, and the expert GEMMs are split instead of repeated on every tensor rank.
 */
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "mpar/backend/detail/routing_backend.hpp"
#include "mpar/backend/host/host_backend.hpp"
#include "mpar/backend/host/kernels.hpp"
#include "mpar/backend/rank_transfer.hpp"
#include "mpar/comm/communicator.hpp"
#include "mpar/core/error.hpp"
#include "mpar/nn/activation.hpp"
#include "mpar/nn/autocast.hpp"
#include "mpar/nn/half_weight.hpp"
#include "mpar/nn/linear.hpp"  // detail::with_half
#include "mpar/nn/parameter.hpp"

namespace mpar::parallel {

/** @brief Sizes and routing settings of a mixture-of-experts MLP. */
struct MoeConfig {
  std::size_t d_model = 0, d_ff = 0, experts = 0, top_k = 1;
  double capacity_factor = 1.25;  ///< <= 0: no capacity limit, no dropped tokens
  float aux_loss_weight = 0.01f;  ///< alpha of the load-balancing loss
  std::uint64_t seed = 0;         ///< initialisation seed
  std::uint64_t first_id = 0;     ///< parameter ids first_id (gate), +1 (W1), +2 (W2)
  double init_std = 0.02;
};

/** @brief Where `MoeMlp::backward` adds each micro-batch's statistics (rank memory; null: not collected). */
struct MoeStatistics {
  double* aux = nullptr;  ///< += aux_scale * the load-balancing loss
  double aux_scale = 1.0;
  double* dropped = nullptr;  ///< += dropped_scale * the assignments this rank dropped
  double dropped_scale = 1.0;
};

/**
 * @brief The mixture-of-experts MLP over an expert group `Comm` (EP = group size, experts divisible by it),
 * computing on backend `B` (the GEMMs, softmax, GeLU, the routing decisions and the row moves around the
 * all-to-all), stream-ordered: no host read of rank memory in forward or backward.
 * Parameters: `gate` [d, E] replicated, `w1` [E, d, f] and `w2` [E, f, d] sharded on dimension 0 over the
 * expert axis, and with an expert tensor group of etp ranks also on f (W1's dimension 2, W2's dimension 1); all
 * initialised sharding-independently, so every EP and etp starts from the same weights.
 */
template <communicator Comm, backend B = HostBackend>
class MoeMlp {
  static_assert(mpar::detail::routing_backend<B>,
                "mpar::parallel::MoeMlp<Comm, B>: backend B does not run the token-routing operations "
                "(ops::gather_rows, ops::moe_route, ...: backend/ops/token_routing.hpp). Fix: use HostBackend, "
                "StreamHostBackend, DiscreteHostBackend or CudaBackend, or give B a run(op) for them");

 public:
  /**
   * `token_group` (optional): the ranks whose tokens together make up the batch the load-balancing
   * statistics are taken over; it must contain this rank's expert group. Default: the expert group.
   * `expert_tensor` (optional): the group each expert's `d_ff` is split over — the whole tensor group of the
   * attention before the MoE, whose ranks route the same tokens (a gradient norm counts a weight sharded over it
   * once per tensor rank). Default: none, every rank keeps whole experts.
   */
  MoeMlp(const MoeConfig& config, Comm& expert_group, const std::string& name = "moe", Comm* token_group = nullptr,
         Comm* expert_tensor = nullptr)
      : cfg_(config), comm_(&expert_group), tokens_comm_(token_group ? token_group : &expert_group),
        expert_tensor_(expert_tensor && expert_tensor->size() > 1 ? expert_tensor : nullptr), name_(name) {
    const auto ep = std::size_t(comm_->size()), r = std::size_t(comm_->rank());
    const std::size_t etp = expert_tensor_ ? std::size_t(expert_tensor_->size()) : 1,
                      et_rank = expert_tensor_ ? std::size_t(expert_tensor_->rank()) : 0;
    require(cfg_.d_model > 0 && cfg_.d_ff > 0 && cfg_.experts > 0, "MoeMlp '", name,
            "': d_model, d_ff and experts must be positive");
    require(cfg_.top_k >= 1 && cfg_.top_k <= cfg_.experts, "MoeMlp '", name, "': top_k = ", cfg_.top_k,
            " must be between 1 and the number of experts (", cfg_.experts, ")");
    require(tokens_comm_->size() % comm_->size() == 0, "MoeMlp '", name, "': the token group '", tokens_comm_->name(),
            "' has ", tokens_comm_->size(), " ranks, which cannot contain the expert group of ", comm_->size());
    require(cfg_.experts % ep == 0, "MoeMlp '", name, "': ", cfg_.experts, " experts do not divide over the ", ep,
            " ranks of expert group '", comm_->name(), "'; choose a multiple of the expert axis size");
    require(cfg_.d_ff % etp == 0, "MoeMlp '", name, "': the experts' width d_ff = ", cfg_.d_ff,
            " does not split over the ", etp, " ranks of expert tensor group '",
            expert_tensor_ ? expert_tensor_->name() : std::string(), "'; choose an --ffn that is a multiple of ", etp,
            ", or keep whole experts (expert tensor size 1)");
    local_experts_ = cfg_.experts / ep;
    local_ff_ = cfg_.d_ff / etp;
    const std::size_t d = cfg_.d_model, f = cfg_.d_ff, e = cfg_.experts;
    const Block mine{r * local_experts_, local_experts_}, my_ff{et_rank * local_ff_, local_ff_};
    // `ff_dim`: the dimension split over the expert tensor group (none for the gate).
    auto setup = [&](nn::Parameter& p, const std::string& n, std::uint64_t id, std::vector<std::size_t> shape,
                     bool sharded, std::size_t ff_dim) {
      p.name = name + "." + n;
      p.id = id;
      p.global_shape = shape;
      for (std::size_t k = 0; k < shape.size(); ++k)
        p.local_box.push_back(sharded && k == 0 ? mine : sharded && k == ff_dim ? my_ff : Block{0, shape[k]});
      p.layout = !sharded  ? "Replicate"
                 : etp > 1 ? "Shard<0, expert> Shard<" + std::to_string(ff_dim) + ", tensor>"
                           : "Shard<0, expert>";
      p.sharded_over_tensor = sharded && etp > 1;
      p.initialise<B>(cfg_.seed, InitSpec::normal(cfg_.init_std));
    };
    setup(gate_, "gate.weight", cfg_.first_id, {d, e}, false, 0);
    setup(w1_, "experts.w1", cfg_.first_id + 1, {e, d, f}, true, 2);
    setup(w2_, "experts.w2", cfg_.first_id + 2, {e, f, d}, true, 1);
  }

  [[nodiscard]] std::vector<nn::Parameter*> parameters() { return {&gate_, &w1_, &w2_}; }
  [[nodiscard]] nn::Parameter& gate() { return gate_; }
  [[nodiscard]] nn::Parameter& w1() { return w1_; }
  [[nodiscard]] nn::Parameter& w2() { return w2_; }
  [[nodiscard]] std::size_t local_experts() const { return local_experts_; }
  /** The width of this rank's slice of each expert: d_ff / etp. */
  [[nodiscard]] std::size_t local_ff() const { return local_ff_; }
  [[nodiscard]] const MoeConfig& config() const { return cfg_; }
  /** The per-expert capacity of the last forward (assignments accepted from this rank). */
  [[nodiscard]] std::size_t capacity() const { return last_capacity_; }
  /**
   * The per-expert capacity for `tokens` tokens on this rank: `ceil(capacity_factor * k * tokens / E)`, or
   * `tokens` without a limit (a token picks an expert at most once). Every expert exchanges exactly this many
   * rows with every rank, empty slots included.
   */
  [[nodiscard]] std::size_t capacity_for(std::size_t tokens) const {
    return cfg_.capacity_factor > 0
               ? std::size_t(std::ceil(cfg_.capacity_factor * double(cfg_.top_k * tokens) / double(cfg_.experts)))
               : tokens;
  }
  /**
   * Assignments dropped by the capacity limit in the last forward, on this rank. A host read of rank memory
   * (on a stream-ordered backend: a wait); a training step collects it through `set_statistics` instead.
   */
  [[nodiscard]] std::size_t dropped() const {
    return last_.empty() ? 0 : std::size_t(mpar::read_from_rank<B>(last_.data() + 1));
  }
  /** The load-balancing loss of the last forward (identical on every rank of the token group); a host read. */
  [[nodiscard]] float aux_loss() const { return last_.empty() ? 0.0f : mpar::read_from_rank<B>(last_.data()); }

  /**
   * Sets where each backward adds its micro-batch's load-balancing loss and dropped count (`B::accumulate`,
   * no host read): a training step's statistics. The memory must outlive the backward passes.
   */
  void set_statistics(const MoeStatistics& sinks) { sinks_ = sinks; }

  /** Frees what the forward of micro-batch `mb` kept for its backward. */
  void drop(int mb) { saved_.drop(mb); }

  /**
   * The layout the MoE takes on the tensor axis: whole token rows, the same on every tensor rank
   * (`Replicate`); over the expert (token) group each rank passes its own tokens. True for `Replicate`;
   * any other layout stops compilation here with what to do.
   */
  template <class L>
  static constexpr bool check_input() {
    static_assert(std::is_same_v<L, Replicate>,
                  "mpar::parallel::MoeMlp (a mixture of experts) needs whole token rows, the same on every tensor rank "
                  "(Replicate), but is fed another layout (see L above): the gate scores every feature of a token, and "
                  "a Partial row would be routed by a partial sum. Fix: reduce a Partial input first "
                  "(RowReduce::all_reduce, AllReduce), gather a feature shard (GatherFeatures) or token shards "
                  "(GatherTokens) before the MoE");
    return std::is_same_v<L, Replicate>;
  }
  /** Typed forward of micro-batch `mb`: `Act<Replicate>` rows `[tokens, d]` in, the MoE's output rows out. */
  template <class L>
  nn::Act<Replicate> forward(const nn::Act<L>& x, int mb = 0) {
    if constexpr (check_input<L>()) {
      nn::Act<Replicate> y(nn::Activation({x.extent(0), x.extent(1)}, uninitialized));  // forward writes it all
      forward(std::span<const float>(x.data(), x.size()), x.extent(0), std::span<float>(y.data(), y.size()), mb);
      return y;
    } else {
      return nn::Act<Replicate>{};  // refused above, with the message
    }
  }
  /** Typed backward of micro-batch `mb`: the output gradient (Replicate) in, the input gradient out (see backward). */
  nn::Act<Replicate> backward(const nn::Act<Replicate>& dy, float aux_grad = 1.0f, int mb = 0) {
    nn::Act<Replicate> dx(nn::Activation({dy.extent(0), dy.extent(1)}, uninitialized));  // backward writes it all
    backward(std::span<const float>(dy.data(), dy.size()), std::span<float>(dx.data(), dx.size()), aux_grad, mb);
    return dx;
  }

  /**
   * y [tokens, d] = MoE(x [tokens, d]) for micro-batch `mb`. Collective over the expert and token groups; every
   * rank of the expert group passes the same number of tokens (the exchange's sizes follow from it).
   */
  void forward(std::span<const float> x, std::size_t tokens, std::span<float> y, int mb = 0) {
    State& st = saved_.put(mb);
    st.type = nn::autocast_type();  // read once: the backward uses what the forward used
    const std::size_t d = cfg_.d_model, E = cfg_.experts, k = cfg_.top_k;
    require(x.size() == tokens * d && y.size() == tokens * d, "MoeMlp::forward on expert rank ", comm_->rank(),
            ": x has ", x.size(), " and y ", y.size(), " elements; ", tokens, " tokens of width ", d, " need ",
            tokens * d);
    const std::size_t C = capacity_for(tokens), slots = E * C;
    st.tokens = tokens;
    st.capacity = C;
    st.x = uninitialized_buffer<float>(tokens * d);
    B::run(ops::copy<float>{.n = tokens * d, .src = x.data(), .dst = st.x.data()});
    // 1. gate (fp32)
    Buffer<float> logits = uninitialized_buffer<float>(tokens * E);
    B::run(ops::gemm<float>{.ta = Trans::no,
                            .tb = Trans::no,
                            .m = tokens,
                            .n = E,
                            .k = d,
                            .alpha = 1.0f,
                            .a = st.x.data(),
                            .lda = d,
                            .b = gate_.value.data(),
                            .ldb = E,
                            .beta = 0.0f,
                            .c = logits.data(),
                            .ldc = E});
    st.probs = uninitialized_buffer<float>(tokens * E);
    B::run(ops::softmax_forward{.rows = tokens, .cols = E, .x = logits.data(), .y = st.probs.data()});
    // 2. the routing decisions (top-k, capacity, routing order), in rank memory
    Buffer<std::int32_t> choice = uninitialized_buffer<std::int32_t>(tokens * k),
                         route = uninitialized_buffer<std::int32_t>(tokens * k),
                         route_token = uninitialized_buffer<std::int32_t>(tokens * k),
                         used = uninitialized_buffer<std::int32_t>(E), routed = uninitialized_buffer<std::int32_t>(1);
    Buffer<std::uint8_t> accepted = uninitialized_buffer<std::uint8_t>(tokens * k);
    Buffer<float> route_weight = uninitialized_buffer<float>(tokens * k);
    B::run(ops::moe_route{.tokens = tokens,
                          .experts = E,
                          .k = k,
                          .capacity = C,
                          .probs = st.probs.data(),
                          .choice = choice.data(),
                          .accepted = accepted.data(),
                          .route = route.data(),
                          .route_token = route_token.data(),
                          .route_weight = route_weight.data(),
                          .used = used.data(),
                          .routed = routed.data()});
    // load-balancing statistics summed over the token group (the dropped count, last, stays this rank's)
    st.stats = uninitialized_buffer<float>(2 * E + 2);
    B::run(ops::moe_gate_stats{.tokens = tokens,
                               .experts = E,
                               .k = k,
                               .probs = st.probs.data(),
                               .choice = choice.data(),
                               .routed = routed.data(),
                               .stats = st.stats.data()});
    tokens_comm_->all_reduce(std::span<float>(st.stats.data(), 2 * E + 1), ReduceOp::sum);
    st.aux = uninitialized_buffer<float>(1);
    B::run(ops::moe_aux_loss{
        .experts = E, .k = k, .alpha = cfg_.aux_loss_weight, .stats = st.stats.data(), .aux = st.aux.data()});
    // 3. dispatch: C slots per expert, empty ones zero rows, so the exchange's sizes are static
    st.slot_token = uninitialized_buffer<std::int32_t>(slots);
    st.slot_weight = uninitialized_buffer<float>(slots);
    B::run(ops::moe_slots{.experts = E,
                          .capacity = C,
                          .used = used.data(),
                          .route_token = route_token.data(),
                          .route_weight = route_weight.data(),
                          .slot_token = st.slot_token.data(),
                          .slot_weight = st.slot_weight.data()});
    Buffer<float> send = uninitialized_buffer<float>(slots * d), expert_in = uninitialized_buffer<float>(slots * d);
    B::run(
        ops::gather_rows{.rows = slots, .d = d, .index = st.slot_token.data(), .src = st.x.data(), .dst = send.data()});
    comm_->all_to_all(std::span<const float>(send), std::span<float>(expert_in));
    // 4. experts (with an expert tensor group: this rank's d_ff slice, then the slots' outputs summed over it)
    Buffer<float> expert_out = uninitialized_buffer<float>(slots * d);
    run_experts(st, expert_in, expert_out);
    if (expert_tensor_) expert_tensor_->all_reduce(std::span<float>(expert_out), ReduceOp::sum);
    // 5. combine
    st.out = uninitialized_buffer<float>(slots * d);
    comm_->all_to_all(std::span<const float>(expert_out), std::span<float>(st.out));
    B::run(ops::zero<float>{.n = tokens * d, .x = y.data()});
    B::run(ops::scatter_add_rows{.rows = slots,
                                 .d = d,
                                 .index = st.slot_token.data(),
                                 .weight = st.slot_weight.data(),
                                 .src = st.out.data(),
                                 .dst = y.data()});
    // what aux_loss() and dropped() read, if asked
    if (last_.empty()) last_ = uninitialized_buffer<float>(2);
    B::run(ops::copy<float>{.n = 1, .src = st.aux.data(), .dst = last_.data()});
    B::run(ops::copy<float>{.n = 1, .src = st.stats.data() + 2 * E + 1, .dst = last_.data() + 1});
    last_capacity_ = C;
  }

  /**
   * dx [tokens, d] from dy [tokens, d]; accumulates parameter gradients. `aux_grad` is the gradient of the
   * total loss with respect to `aux_loss()` (usually 1); this rank adds the share of its own tokens.
   * Collective over the expert group; takes (frees) what forward kept for micro-batch `mb`, and adds the
   * micro-batch's load-balancing loss and dropped count to the statistics sinks, if set.
   */
  void backward(std::span<const float> dy, std::span<float> dx, float aux_grad = 1.0f, int mb = 0) {
    State st = saved_.take(mb, "MoeMlp '" + name_ + "'");
    const std::size_t d = cfg_.d_model, E = cfg_.experts, k = cfg_.top_k, T = st.tokens, C = st.capacity, slots = E * C;
    require(dy.size() == T * d && dx.size() == T * d, "MoeMlp::backward on expert rank ", comm_->rank(), ": dy has ",
            dy.size(), " and dx ", dx.size(), " elements; the forward had ", T, " tokens of width ", d);
    // combine: d out_s = w_s dy_t;  d w_s = <dy_t, out_s> (empty slots: zero rows, zero dots)
    Buffer<float> dout = uninitialized_buffer<float>(slots * d), dot = uninitialized_buffer<float>(slots);
    B::run(ops::scatter_add_rows_backward{.rows = slots,
                                          .d = d,
                                          .index = st.slot_token.data(),
                                          .weight = st.slot_weight.data(),
                                          .dy = dy.data(),
                                          .src = st.out.data(),
                                          .dsrc = dout.data(),
                                          .dot = dot.data()});
    Buffer<float> expert_dout = uninitialized_buffer<float>(slots * d),
                  expert_dx = uninitialized_buffer<float>(slots * d);
    comm_->all_to_all(std::span<const float>(dout), std::span<float>(expert_dout));
    backward_experts(st, expert_dout, expert_dx);
    if (expert_tensor_) expert_tensor_->all_reduce(std::span<float>(expert_dx), ReduceOp::sum);
    Buffer<float> dxin = uninitialized_buffer<float>(slots * d);
    comm_->all_to_all(std::span<const float>(expert_dx), std::span<float>(dxin));
    B::run(ops::zero<float>{.n = T * d, .x = dx.data()});
    B::run(ops::scatter_add_rows{
        .rows = slots, .d = d, .index = st.slot_token.data(), .src = dxin.data(), .dst = dx.data()});  // weight 1
    // gate: the combine weights' gradients and the load-balancing loss's, d aux / d probs[t, e] = alpha E f_e / G
    Buffer<float> dprobs = uninitialized_buffer<float>(T * E), dlogits = uninitialized_buffer<float>(T * E);
    B::run(ops::moe_gate_backward{.tokens = T,
                                  .experts = E,
                                  .k = k,
                                  .capacity = C,
                                  .slot_token = st.slot_token.data(),
                                  .dot = dot.data(),
                                  .aux_grad = aux_grad,
                                  .alpha = cfg_.aux_loss_weight,
                                  .stats = st.stats.data(),
                                  .dprobs = dprobs.data()});
    B::run(
        ops::softmax_backward{.rows = T, .cols = E, .y = st.probs.data(), .dy = dprobs.data(), .dx = dlogits.data()});
    B::run(ops::gemm<float>{.ta = Trans::yes,
                            .tb = Trans::no,
                            .m = d,
                            .n = E,
                            .k = T,
                            .alpha = 1.0f,
                            .a = st.x.data(),
                            .lda = d,
                            .b = dlogits.data(),
                            .ldb = E,
                            .beta = 1.0f,
                            .c = gate_.grad.data(),
                            .ldc = E});
    B::run(ops::gemm<float>{.ta = Trans::no,
                            .tb = Trans::yes,
                            .m = T,
                            .n = d,
                            .k = E,
                            .alpha = 1.0f,
                            .a = dlogits.data(),
                            .lda = E,
                            .b = gate_.value.data(),
                            .ldb = E,
                            .beta = 1.0f,
                            .c = dx.data(),
                            .ldc = d});
    // statistics: once per micro-batch (here, not in the forward a recomputation repeats)
    if (sinks_.aux) B::run(ops::accumulate{.n = 1, .x = st.aux.data(), .scale = sinks_.aux_scale, .acc = sinks_.aux});
    if (sinks_.dropped)
      B::run(ops::accumulate{
          .n = 1, .x = st.stats.data() + 2 * E + 1, .scale = sinks_.dropped_scale, .acc = sinks_.dropped});
  }

 private:
  /** What the forward of one micro-batch keeps for its backward (rank memory, but for the sizes). */
  struct State {
    std::size_t tokens = 0, capacity = 0;
    Buffer<float> x, probs, out;
    Buffer<float> stats;                           ///< moe_gate_stats, the first 2E + 1 summed over the token group
    Buffer<float> aux;                             ///< the load-balancing loss [1]
    Buffer<std::int32_t> slot_token;               ///< per slot (expert-major, C per expert): its token, -1 if empty
    Buffer<float> slot_weight;                     ///< per slot: the gate probability it is combined with, 0 if empty
    std::vector<Buffer<float>> ex_in, ex_h;        ///< per local expert: its rows [EP C, d], pre-GeLU [EP C, f/etp]
    nn::ComputeType type = nn::ComputeType::fp32;  ///< the experts' GEMM operand type of this forward
  };

  /**
   * The received rows are [source q][local expert l][C] of `d` values; expert l works on its own rows
   * contiguous, [q][C]. Its block from every source is one strided copy: ep blocks of C d values, El C d
   * apart in the received rows (one operation per expert, not one per source).
   */
  void gather_expert_rows(std::size_t l, std::size_t C, const float* received, float* expert_rows) const {
    const std::size_t d = cfg_.d_model, block = C * d;
    B::run(ops::copy_2d<float>{.rows = std::size_t(comm_->size()),
                               .cols = block,
                               .src = received + l * block,
                               .src_ld = local_experts_ * block,
                               .dst = expert_rows,
                               .dst_ld = block});
  }
  /** The inverse of `gather_expert_rows`: expert l's [q][C] rows back to their places among the received rows. */
  void scatter_expert_rows(std::size_t l, std::size_t C, const float* expert_rows, float* received) const {
    const std::size_t d = cfg_.d_model, block = C * d;
    B::run(ops::copy_2d<float>{.rows = std::size_t(comm_->size()),
                               .cols = block,
                               .src = expert_rows,
                               .src_ld = block,
                               .dst = received + l * block,
                               .dst_ld = local_experts_ * block});
  }

  /** Expert l's rows through its d_ff slice: `out` holds the slots' outputs (partial sums with etp > 1). */
  void run_experts(State& st, const Buffer<float>& in, Buffer<float>& out) {
    const std::size_t d = cfg_.d_model, f = local_ff_, C = st.capacity, n = std::size_t(comm_->size()) * C;
    st.ex_in.assign(local_experts_, {});
    st.ex_h.assign(local_experts_, {});
    if (n == 0) return;
    for (std::size_t l = 0; l < local_experts_; ++l) {
      auto& xi = st.ex_in[l];
      xi = uninitialized_buffer<float>(n * d);
      gather_expert_rows(l, C, in.data(), xi.data());
      auto& h = st.ex_h[l];
      h = uninitialized_buffer<float>(n * f);
      gemm_xw(st.type, Trans::no, Trans::no, n, f, d, xi, d, w1_, w1_16_, l * d * f, f, 0.0f, h.data(), f);
      Buffer<float> a = uninitialized_buffer<float>(n * f), o = uninitialized_buffer<float>(n * d);
      B::run(ops::gelu_forward{.n = n * f, .x = h.data(), .y = a.data()});
      gemm_xw(st.type, Trans::no, Trans::no, n, d, f, a, f, w2_, w2_16_, l * f * d, d, 0.0f, o.data(), d);
      scatter_expert_rows(l, C, o.data(), out.data());
    }
  }

  /** The experts' backward through this rank's d_ff slices: `dx` holds partial sums with etp > 1. */
  void backward_experts(const State& st, const Buffer<float>& dout, Buffer<float>& dx) {
    const std::size_t d = cfg_.d_model, f = local_ff_, C = st.capacity, n = std::size_t(comm_->size()) * C;
    if (n == 0) return;
    for (std::size_t l = 0; l < local_experts_; ++l) {
      Buffer<float> dy = uninitialized_buffer<float>(n * d);
      gather_expert_rows(l, C, dout.data(), dy.data());
      const auto& h = st.ex_h[l];
      Buffer<float> a = uninitialized_buffer<float>(n * f), da = uninitialized_buffer<float>(n * f),
                    dh = uninitialized_buffer<float>(n * f), dxi = uninitialized_buffer<float>(n * d);
      B::run(ops::gelu_forward{.n = n * f, .x = h.data(), .y = a.data()});  // recomputed: cheaper to keep h than both
      gemm_xy(st.type, Trans::yes, Trans::no, f, d, n, a, f, dy, d, &w2_.grad[l * f * d], d);
      gemm_xw(st.type, Trans::no, Trans::yes, n, f, d, dy, d, w2_, w2_16_, l * f * d, d, 0.0f, da.data(), f);
      B::run(ops::gelu_backward{.n = n * f, .x = h.data(), .dy = da.data(), .dx = dh.data()});
      gemm_xy(st.type, Trans::yes, Trans::no, d, f, n, st.ex_in[l], d, dh, f, &w1_.grad[l * d * f], f);
      gemm_xw(st.type, Trans::no, Trans::yes, n, d, f, dh, f, w1_, w1_16_, l * d * f, f, 0.0f, dxi.data(), d);
      scatter_expert_rows(l, C, dxi.data(), dx.data());
    }
  }

  /**
   * `C = op(X) op(W_l) + beta C` for an activation X and expert l's block of weight `w` (at `offset`), in
   * operand type `t`: fp32 as is; 16-bit with X converted here and the weight through `w16` (the optimizer's
   * compute copy, else converted once per Autocast scope).
   */
  void gemm_xw(nn::ComputeType t, Trans tx, Trans tw, std::size_t m, std::size_t n, std::size_t k,
               std::span<const float> x, std::size_t ldx, const nn::Parameter& w, nn::HalfWeight& w16,
               std::size_t offset, std::size_t ldw, float beta, float* c, std::size_t ldc) {
    // The same product over fp32 operands or their 16-bit copies (element type In).
    const auto product = [&]<class In>(const In* a, const In* b) {
      B::run(ops::gemm<In, float>{.ta = tx,
                                  .tb = tw,
                                  .m = m,
                                  .n = n,
                                  .k = k,
                                  .a = a,
                                  .lda = ldx,
                                  .b = b,
                                  .ldb = ldw,
                                  .beta = beta,
                                  .c = c,
                                  .ldc = ldc});
    };
    if (t == nn::ComputeType::fp32) return product(x.data(), w.value.data() + offset);
    nn::detail::with_half(t, [&]<class T>(T) {
      const Buffer<T> x16 = nn::to_half<B, T>(x);
      product(x16.data(), w16.template get<B, T>(w) + offset);
    });
  }
  /** `C += op(X) op(Y)` for two activations (a weight gradient), in operand type `t` (16-bit: both converted). */
  void gemm_xy(nn::ComputeType t, Trans tx, Trans ty, std::size_t m, std::size_t n, std::size_t k,
               std::span<const float> x, std::size_t ldx, std::span<const float> y, std::size_t ldy, float* c,
               std::size_t ldc) {
    const auto product = [&]<class In>(const In* a, const In* b) {
      B::run(ops::gemm<In, float>{.ta = tx,
                                  .tb = ty,
                                  .m = m,
                                  .n = n,
                                  .k = k,
                                  .a = a,
                                  .lda = ldx,
                                  .b = b,
                                  .ldb = ldy,
                                  .beta = 1.0f,
                                  .c = c,
                                  .ldc = ldc});
    };
    if (t == nn::ComputeType::fp32) return product(x.data(), y.data());
    nn::detail::with_half(t, [&]<class T>(T) {
      const Buffer<T> x16 = nn::to_half<B, T>(x), y16 = nn::to_half<B, T>(y);
      product(x16.data(), y16.data());
    });
  }

  MoeConfig cfg_;
  Comm* comm_;
  Comm* tokens_comm_;
  Comm* expert_tensor_;  ///< the group each expert's d_ff is split over; null: whole experts
  std::string name_;
  std::size_t local_experts_ = 0, local_ff_ = 0;
  nn::Parameter gate_, w1_, w2_;
  nn::HalfWeight w1_16_, w2_16_;  // the expert weights as 16-bit GEMM operands inside an Autocast scope
  nn::MicroBatchCache<State> saved_;
  std::size_t last_capacity_ = 0;
  Buffer<float> last_;  ///< the last forward's aux loss and dropped count (rank memory)
  MoeStatistics sinks_;
};

}  // namespace mpar::parallel
