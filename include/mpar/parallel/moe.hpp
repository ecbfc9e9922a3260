#pragma once
/**
 * @file A top-k gated mixture-of-experts MLP with experts spread over the expert axis (GShard, arXiv
 * 2006.16668; Switch Transformer, arXiv 2101.03961).
 *
 * Per rank, for its local tokens x [T, d]:
 * 1. gate: probs = softmax(x Wg) [T, E]; each token picks its k most probable experts (ties: lower index);
 * 2. capacity: each expert accepts at most C = ceil(capacity_factor * k * T / E) assignments *from this rank*
 *    (capacity_factor <= 0: unlimited). First choices of all tokens are served before second choices, tokens
 *    in index order; a dropped assignment contributes nothing (the block's residual connection carries the
 *    token), and `dropped()` counts them;
 * 3. dispatch: accepted tokens travel to the rank holding their expert by `all_to_all_v` over the expert group
 *    (expert e lives on expert rank e / (E / EP));
 * 4. experts: out = gelu(x W1[e]) W2[e];
 * 5. combine: results travel back by `all_to_all_v`; y_t = sum_j probs[t, e_j] * out_{t,j} (the gate
 *    probability of each accepted choice, not renormalised over the k choices).
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
 * product, the weights once per scope (`nn::HalfWeight`) — as the dense layers do. The gate's product, its
 * softmax and the routing stay fp32: the top-k choice is a discrete decision that a rounded logit could
 * flip, and it must not depend on the layout.
 *
 * Gradients: expert weights receive every token routed to them from every rank, so they are complete on
 * their owner. The gate weight is replicated: its gradient is this rank's share and must be summed (or
 * averaged, as data parallelism does) over the ranks that hold different tokens.
 */
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "mpar/backend/host/host_backend.hpp"
#include "mpar/backend/host/kernels.hpp"
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

/**
 * @brief The mixture-of-experts MLP over an expert group `Comm` (EP = group size, experts divisible by it),
 * computing on backend `B` (the gate and expert GEMMs, softmax and GeLU; routing and the row
 * permutations around the all-to-all are host loops over the rank's memory).
 * Parameters: `gate` [d, E] replicated, `w1` [E, d, f] and `w2` [E, f, d] sharded on dimension 0 over the
 * expert axis; all initialised sharding-independently, so EP = 1, 2, 4 start from the same weights.
 */
template <communicator Comm, backend B = HostBackend>
class MoeMlp {
 public:
  /**
   * `token_group` (optional): the ranks whose tokens together make up the batch the load-balancing
   * statistics are taken over; it must contain this rank's expert group. Default: the expert group.
   */
  MoeMlp(const MoeConfig& config, Comm& expert_group, const std::string& name = "moe", Comm* token_group = nullptr)
      : cfg_(config), comm_(&expert_group), tokens_comm_(token_group ? token_group : &expert_group), name_(name) {
    const auto ep = std::size_t(comm_->size()), r = std::size_t(comm_->rank());
    require(cfg_.d_model > 0 && cfg_.d_ff > 0 && cfg_.experts > 0, "MoeMlp '", name,
            "': d_model, d_ff and experts must be positive");
    require(cfg_.top_k >= 1 && cfg_.top_k <= cfg_.experts, "MoeMlp '", name, "': top_k = ", cfg_.top_k,
            " must be between 1 and the number of experts (", cfg_.experts, ")");
    require(tokens_comm_->size() % comm_->size() == 0, "MoeMlp '", name, "': the token group '", tokens_comm_->name(),
            "' has ", tokens_comm_->size(), " ranks, which cannot contain the expert group of ", comm_->size());
    require(cfg_.experts % ep == 0, "MoeMlp '", name, "': ", cfg_.experts, " experts do not divide over the ", ep,
            " ranks of expert group '", comm_->name(), "'; choose a multiple of the expert axis size");
    local_experts_ = cfg_.experts / ep;
    const std::size_t d = cfg_.d_model, f = cfg_.d_ff, e = cfg_.experts;
    const Block mine{r * local_experts_, local_experts_};
    auto setup = [&](nn::Parameter& p, const std::string& n, std::uint64_t id, std::vector<std::size_t> shape,
                     bool sharded) {
      p.name = name + "." + n;
      p.id = id;
      p.global_shape = shape;
      for (std::size_t k = 0; k < shape.size(); ++k)
        p.local_box.push_back(sharded && k == 0 ? mine : Block{0, shape[k]});
      p.layout = sharded ? "Shard<0, expert>" : "Replicate";
      p.sharded_over_tensor = false;
      p.initialise(cfg_.seed, InitSpec::normal(cfg_.init_std));
    };
    setup(gate_, "gate.weight", cfg_.first_id, {d, e}, false);
    setup(w1_, "experts.w1", cfg_.first_id + 1, {e, d, f}, true);
    setup(w2_, "experts.w2", cfg_.first_id + 2, {e, f, d}, true);
  }

  [[nodiscard]] std::vector<nn::Parameter*> parameters() { return {&gate_, &w1_, &w2_}; }
  [[nodiscard]] nn::Parameter& gate() { return gate_; }
  [[nodiscard]] nn::Parameter& w1() { return w1_; }
  [[nodiscard]] nn::Parameter& w2() { return w2_; }
  [[nodiscard]] std::size_t local_experts() const { return local_experts_; }
  [[nodiscard]] const MoeConfig& config() const { return cfg_; }
  /** The per-expert capacity of the last forward (assignments accepted from this rank). */
  [[nodiscard]] std::size_t capacity() const { return last_capacity_; }
  /** Assignments dropped by the capacity limit in the last forward, on this rank. */
  [[nodiscard]] std::size_t dropped() const { return last_dropped_; }
  /** The load-balancing loss of the last forward (identical on every rank of the token group). */
  [[nodiscard]] float aux_loss() const { return last_aux_; }

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
      nn::Act<Replicate> y(nn::Activation({x.extent(0), x.extent(1)}));
      forward(std::span<const float>(x.data(), x.size()), x.extent(0), std::span<float>(y.data(), y.size()), mb);
      return y;
    } else {
      return nn::Act<Replicate>{};  // refused above, with the message
    }
  }
  /** Typed backward of micro-batch `mb`: the output gradient (Replicate) in, the input gradient out (see backward). */
  nn::Act<Replicate> backward(const nn::Act<Replicate>& dy, float aux_grad = 1.0f, int mb = 0) {
    nn::Act<Replicate> dx(nn::Activation({dy.extent(0), dy.extent(1)}));
    backward(std::span<const float>(dy.data(), dy.size()), std::span<float>(dx.data(), dx.size()), aux_grad, mb);
    return dx;
  }

  /** y [tokens, d] = MoE(x [tokens, d]) for micro-batch `mb`. Collective over the expert and token groups. */
  void forward(std::span<const float> x, std::size_t tokens, std::span<float> y, int mb = 0) {
    State& st = saved_.put(mb);
    auto& [tokens_, capacity_, dropped_, recv_rows_, global_tokens_, aux_, x_, probs_, out_, frac_, choice_, route_,
           rows_from_, send_elems_, recv_elems_, accepted_, ex_in_, ex_h_, route_token_, route_weight_, type_] = st;
    type_ = nn::autocast_type();  // read once: the backward uses what the forward used
    const std::size_t d = cfg_.d_model, E = cfg_.experts, k = cfg_.top_k, ep = std::size_t(comm_->size());
    require(x.size() == tokens * d && y.size() == tokens * d, "MoeMlp::forward on expert rank ", comm_->rank(),
            ": x has ", x.size(), " and y ", y.size(), " elements; ", tokens, " tokens of width ", d, " need ",
            tokens * d);
    tokens_ = tokens;
    x_.assign(x.begin(), x.end());
    // 1. gate
    Buffer<float> logits(tokens * E);
    B::template gemm<float>(Trans::no, Trans::no, tokens, E, d, 1.0f, x_.data(), d, gate_.value.data(), E, 0.0f,
                            logits.data(), E);
    probs_.assign(tokens * E, 0.0f);
    B::softmax_forward(tokens, E, logits.data(), probs_.data());
    choice_.assign(tokens * k, 0);
    std::vector<std::size_t> order(E);
    for (std::size_t t = 0; t < tokens; ++t) {
      std::iota(order.begin(), order.end(), std::size_t(0));
      const float* pr = &probs_[t * E];
      std::partial_sort(order.begin(), order.begin() + std::ptrdiff_t(k), order.end(),
                        [&](std::size_t a, std::size_t b) { return pr[a] > pr[b] || (pr[a] == pr[b] && a < b); });
      for (std::size_t j = 0; j < k; ++j) choice_[t * k + j] = order[j];
    }
    // load-balancing statistics over the whole group: assignment counts, probability sums, token count
    Buffer<float> stats(2 * E + 1, 0.0f);
    for (std::size_t t = 0; t < tokens; ++t) {
      for (std::size_t j = 0; j < k; ++j) stats[choice_[t * k + j]] += 1.0f;
      for (std::size_t e = 0; e < E; ++e) stats[E + e] += probs_[t * E + e];
    }
    stats[2 * E] = float(tokens);
    tokens_comm_->all_reduce(std::span<float>(stats), ReduceOp::sum);
    global_tokens_ = double(stats[2 * E]);
    frac_.assign(E, 0.0f);
    double aux = 0.0;
    if (global_tokens_ > 0)
      for (std::size_t e = 0; e < E; ++e) {
        frac_[e] = float(double(stats[e]) / (global_tokens_ * double(k)));
        aux += double(frac_[e]) * double(stats[E + e]) / global_tokens_;
      }
    aux_ = float(double(cfg_.aux_loss_weight) * double(E) * aux);
    // 2. capacity, first choices first
    capacity_ = cfg_.capacity_factor > 0 ? std::size_t(std::ceil(cfg_.capacity_factor * double(k * tokens) / double(E)))
                                         : tokens * k;
    std::vector<std::size_t> used(E, 0);
    accepted_.assign(tokens * k, false);
    dropped_ = 0;
    for (std::size_t j = 0; j < k; ++j)
      for (std::size_t t = 0; t < tokens; ++t) {
        const std::size_t e = choice_[t * k + j];
        if (used[e] < capacity_) {
          ++used[e];
          accepted_[t * k + j] = true;
        } else {
          ++dropped_;
        }
      }
    // 3. dispatch: rows grouped by expert (hence by destination rank), tokens in index order within an expert
    route_.clear();
    for (std::size_t e = 0; e < E; ++e)
      for (std::size_t t = 0; t < tokens; ++t)
        for (std::size_t j = 0; j < k; ++j)
          if (choice_[t * k + j] == e && accepted_[t * k + j]) route_.push_back(t * k + j);
    // The routing decisions are small host loops; the rows (d wide) move through the backend.
    route_token_.resize(route_.size());
    route_weight_.resize(route_.size());
    for (std::size_t i = 0; i < route_.size(); ++i) {
      const std::size_t t = route_[i] / k;
      route_token_[i] = std::int32_t(t);
      route_weight_[i] = probs_[t * E + choice_[route_[i]]];
    }
    Buffer<float> send(route_.size() * d);
    B::gather_rows(route_.size(), d, route_token_.data(), x_.data(), send.data());
    exchange_counts(st, used, ep);
    Buffer<float> expert_in(recv_rows_ * d);
    comm_->all_to_all_v(std::span<const float>(send), send_elems_, std::span<float>(expert_in), recv_elems_);
    // 4. experts
    Buffer<float> expert_out(recv_rows_ * d);
    run_experts(st, expert_in, expert_out);
    // 5. combine
    out_.assign(route_.size() * d, 0.0f);
    comm_->all_to_all_v(std::span<const float>(expert_out), recv_elems_, std::span<float>(out_), send_elems_);
    std::fill(y.begin(), y.end(), 0.0f);
    B::scatter_add_rows(route_.size(), d, route_token_.data(), route_weight_.data(), out_.data(), y.data());
    last_capacity_ = capacity_;
    last_dropped_ = dropped_;
    last_aux_ = aux_;
  }

  /**
   * dx [tokens, d] from dy [tokens, d]; accumulates parameter gradients. `aux_grad` is the gradient of the
   * total loss with respect to `aux_loss()` (usually 1); this rank adds the share of its own tokens.
   * Collective over the expert group; takes (frees) what forward kept for micro-batch `mb`.
   */
  void backward(std::span<const float> dy, std::span<float> dx, float aux_grad = 1.0f, int mb = 0) {
    State st = saved_.take(mb, "MoeMlp '" + name_ + "'");
    const auto& [tokens_, capacity_, dropped_, recv_rows_, global_tokens_, aux_, x_, probs_, out_, frac_, choice_,
                 route_, rows_from_, send_elems_, recv_elems_, accepted_, ex_in_, ex_h_, route_token_, route_weight_,
                 type_] = st;
    const std::size_t d = cfg_.d_model, E = cfg_.experts, k = cfg_.top_k, T = tokens_;
    require(dy.size() == T * d && dx.size() == T * d, "MoeMlp::backward on expert rank ", comm_->rank(), ": dy has ",
            dy.size(), " and dx ", dx.size(), " elements; the forward had ", T, " tokens of width ", d);
    // combine: d out_i = w dy_t;  d w = <dy_t, out_i>
    Buffer<float> dprobs(T * E, 0.0f), dout(route_.size() * d), dweight(route_.size());
    B::scatter_add_rows_backward(route_.size(), d, route_token_.data(), route_weight_.data(), dy.data(), out_.data(),
                                 dout.data(), dweight.data());
    for (std::size_t i = 0; i < route_.size(); ++i) dprobs[route_[i] / k * E + choice_[route_[i]]] += dweight[i];
    Buffer<float> expert_dout(recv_rows_ * d), expert_dx(recv_rows_ * d);
    comm_->all_to_all_v(std::span<const float>(dout), send_elems_, std::span<float>(expert_dout), recv_elems_);
    backward_experts(st, expert_dout, expert_dx);
    Buffer<float> dxin(route_.size() * d);
    comm_->all_to_all_v(std::span<const float>(expert_dx), recv_elems_, std::span<float>(dxin), send_elems_);
    std::fill(dx.begin(), dx.end(), 0.0f);
    B::scatter_add_rows(route_.size(), d, route_token_.data(), nullptr, dxin.data(), dx.data());
    // load-balancing loss: d aux / d probs[t, e] = alpha E f_e / T_global for this rank's tokens
    if (global_tokens_ > 0 && aux_grad != 0.0f)
      for (std::size_t t = 0; t < T; ++t)
        for (std::size_t e = 0; e < E; ++e)
          dprobs[t * E + e] +=
              float(double(aux_grad) * cfg_.aux_loss_weight * double(E) * double(frac_[e]) / global_tokens_);
    // gate
    Buffer<float> dlogits(T * E);
    B::softmax_backward(T, E, probs_.data(), dprobs.data(), dlogits.data());
    B::template gemm<float>(Trans::yes, Trans::no, d, E, T, 1.0f, x_.data(), d, dlogits.data(), E, 1.0f,
                            gate_.grad.data(), E);
    B::template gemm<float>(Trans::no, Trans::yes, T, d, E, 1.0f, dlogits.data(), E, gate_.value.data(), E, 1.0f,
                            dx.data(), d);
  }

 private:
  /** What the forward of one micro-batch keeps for its backward (the routing and the expert inputs). */
  struct State {
    std::size_t tokens = 0, capacity = 0, dropped = 0, recv_rows = 0;
    double global_tokens = 0.0;
    float aux = 0.0f;
    Buffer<float> x, probs, out, frac;
    std::vector<std::size_t> choice, route, rows_from, send_elems, recv_elems;
    std::vector<bool> accepted;
    std::vector<Buffer<float>> ex_in, ex_h;
    Buffer<std::int32_t> route_token;              ///< per routed row: its token (rank memory: the row kernels read it)
    Buffer<float> route_weight;                    ///< per routed row: the gate probability it is combined with
    nn::ComputeType type = nn::ComputeType::fp32;  ///< the experts' GEMM operand type of this forward
  };

  /** Tells every expert rank how many rows of each of its experts it will receive from here. */
  void exchange_counts(State& st, const std::vector<std::size_t>& used, std::size_t ep) {
    auto& rows_from_ = st.rows_from;
    auto& send_elems_ = st.send_elems;
    auto& recv_elems_ = st.recv_elems;
    auto& recv_rows_ = st.recv_rows;
    const std::size_t El = local_experts_, d = cfg_.d_model;
    Buffer<float> sent(cfg_.experts), got(cfg_.experts);
    for (std::size_t e = 0; e < cfg_.experts; ++e) sent[e] = float(used[e]);
    comm_->all_to_all(std::span<const float>(sent), std::span<float>(got));
    rows_from_.assign(cfg_.experts, 0);  // [source][local expert]
    for (std::size_t i = 0; i < cfg_.experts; ++i) rows_from_[i] = std::size_t(got[i]);
    send_elems_.assign(ep, 0);
    recv_elems_.assign(ep, 0);
    recv_rows_ = 0;
    for (std::size_t q = 0; q < ep; ++q)
      for (std::size_t l = 0; l < El; ++l) {
        send_elems_[q] += used[q * El + l] * d;
        recv_elems_[q] += rows_from_[q * El + l] * d;
        recv_rows_ += rows_from_[q * El + l];
      }
  }

  /**
   * Rows of local expert `l` sit in the receive buffer at [source][expert] positions: calls
   * `f(l, rows)` with their indices in that buffer, by source (rank memory: the row kernels read it).
   */
  template <class F>
  void for_each_expert(const State& st, F&& f) const {
    const auto& rows_from_ = st.rows_from;
    const std::size_t El = local_experts_, ep = std::size_t(comm_->size());
    for (std::size_t l = 0; l < El; ++l) {
      Buffer<std::int32_t> rows;
      std::size_t row = 0;
      for (std::size_t q = 0; q < ep; ++q)
        for (std::size_t m = 0; m < El; ++m) {
          if (m == l)
            for (std::size_t r = 0; r < rows_from_[q * El + m]; ++r) rows.push_back(std::int32_t(row + r));
          row += rows_from_[q * El + m];
        }
      f(l, rows);
    }
  }

  void run_experts(State& st, const Buffer<float>& in, Buffer<float>& out) {
    const std::size_t d = cfg_.d_model, f = cfg_.d_ff;
    auto& ex_in_ = st.ex_in;
    auto& ex_h_ = st.ex_h;
    ex_in_.assign(local_experts_, {});
    ex_h_.assign(local_experts_, {});
    for_each_expert(st, [&](std::size_t l, const Buffer<std::int32_t>& rows) {
      const std::size_t n = rows.size();
      auto& xi = ex_in_[l];
      xi.resize(n * d);
      B::gather_rows(n, d, rows.data(), in.data(), xi.data());
      auto& h = ex_h_[l];
      h.resize(n * f);
      gemm_xw(st.type, Trans::no, Trans::no, n, f, d, xi, d, w1_, w1_16_, l * d * f, f, 0.0f, h.data(), f);
      Buffer<float> a(n * f), o(n * d);
      B::gelu_forward(n * f, h.data(), a.data());
      gemm_xw(st.type, Trans::no, Trans::no, n, d, f, a, f, w2_, w2_16_, l * f * d, d, 0.0f, o.data(), d);
      B::scatter_rows(n, d, rows.data(), o.data(), out.data());
    });
  }

  void backward_experts(const State& st, const Buffer<float>& dout, Buffer<float>& dx) {
    const std::size_t d = cfg_.d_model, f = cfg_.d_ff;
    const auto& ex_in_ = st.ex_in;
    const auto& ex_h_ = st.ex_h;
    for_each_expert(st, [&](std::size_t l, const Buffer<std::int32_t>& rows) {
      const std::size_t n = rows.size();
      Buffer<float> dy(n * d);
      B::gather_rows(n, d, rows.data(), dout.data(), dy.data());
      const auto& h = ex_h_[l];
      Buffer<float> a(n * f), da(n * f), dh(n * f), dxi(n * d);
      B::gelu_forward(n * f, h.data(), a.data());  // recomputed: cheaper to keep h than both
      gemm_xy(st.type, Trans::yes, Trans::no, f, d, n, a, f, dy, d, &w2_.grad[l * f * d], d);
      gemm_xw(st.type, Trans::no, Trans::yes, n, f, d, dy, d, w2_, w2_16_, l * f * d, d, 0.0f, da.data(), f);
      B::gelu_backward(n * f, h.data(), da.data(), dh.data());
      gemm_xy(st.type, Trans::yes, Trans::no, d, f, n, ex_in_[l], d, dh, f, &w1_.grad[l * d * f], f);
      gemm_xw(st.type, Trans::no, Trans::yes, n, d, f, dh, f, w1_, w1_16_, l * d * f, f, 0.0f, dxi.data(), d);
      B::scatter_rows(n, d, rows.data(), dxi.data(), dx.data());
    });
  }

  /**
   * `C = op(X) op(W_l) + beta C` for an activation X and expert l's block of weight `w` (at `offset`), in
   * operand type `t`: fp32 as is; 16-bit with X converted here and the weight once per Autocast scope.
   */
  void gemm_xw(nn::ComputeType t, Trans tx, Trans tw, std::size_t m, std::size_t n, std::size_t k,
               std::span<const float> x, std::size_t ldx, const nn::Parameter& w, nn::HalfWeight& w16,
               std::size_t offset, std::size_t ldw, float beta, float* c, std::size_t ldc) {
    if (t == nn::ComputeType::fp32) {
      B::template gemm<float>(tx, tw, m, n, k, 1.0f, x.data(), ldx, w.value.data() + offset, ldw, beta, c, ldc);
      return;
    }
    nn::detail::with_half(t, [&]<class T>(T) {
      const Buffer<T> x16 = nn::to_half<B, T>(x);
      B::template gemm<T, float>(tx, tw, m, n, k, 1.0f, x16.data(), ldx, w16.template get<B, T>(w.value) + offset, ldw,
                                 beta, c, ldc);
    });
  }
  /** `C += op(X) op(Y)` for two activations (a weight gradient), in operand type `t` (16-bit: both converted). */
  void gemm_xy(nn::ComputeType t, Trans tx, Trans ty, std::size_t m, std::size_t n, std::size_t k,
               std::span<const float> x, std::size_t ldx, std::span<const float> y, std::size_t ldy, float* c,
               std::size_t ldc) {
    if (t == nn::ComputeType::fp32) {
      B::template gemm<float>(tx, ty, m, n, k, 1.0f, x.data(), ldx, y.data(), ldy, 1.0f, c, ldc);
      return;
    }
    nn::detail::with_half(t, [&]<class T>(T) {
      const Buffer<T> x16 = nn::to_half<B, T>(x), y16 = nn::to_half<B, T>(y);
      B::template gemm<T, float>(tx, ty, m, n, k, 1.0f, x16.data(), ldx, y16.data(), ldy, 1.0f, c, ldc);
    });
  }

  MoeConfig cfg_;
  Comm* comm_;
  Comm* tokens_comm_;
  std::string name_;
  std::size_t local_experts_ = 0;
  nn::Parameter gate_, w1_, w2_;
  nn::HalfWeight w1_16_, w2_16_;  // the expert weights as 16-bit GEMM operands inside an Autocast scope
  nn::MicroBatchCache<State> saved_;
  std::size_t last_capacity_ = 0, last_dropped_ = 0;
  float last_aux_ = 0.0f;
};

}  // namespace mpar::parallel
