#pragma once
/**
 * @file The pipeline executor: runs a schedule's programs on real ranks, over any communicator.
 *
 * One Executor per pipeline rank holds that rank's chunks (V stages) and replays its program:
 * forwards and backwards call the stages; sends are `isend` (they return at once, so the next
 * compute overlaps the transfer). A send's buffers are freed once its transfer completes, and a
 * rank's n-th send first waits for its (n-w)-th, w = `ExecutorOptions::sends_in_flight`, so sends
 * hold a few boundary tensors, not one per micro-batch. A host stage tests the sends in flight at
 * every action and frees those done; on a stream-ordered stage the window's wait (which orders the
 * compute stream, not the host) releases them, and rank memory is freed in stream order after it.
 * How receives are posted
 * depends on how the communicator matches messages (`PointToPoint`):
 * - `posted` (tag matching: threads, MPI): every receive header of the step is posted as `irecv`
 *   when the step starts, so by the time a stage needs its input the message is usually there.
 *   The programs are verified with SendMode::buffered — exactly these semantics.
 * - `grouped` (in-order matching without tags: NCCL, `ordered_point_to_point`): each run of
 *   consecutive sends and receives in the program is posted together, headers and payloads, and
 *   issued as one group. Since a receive is posted with its size before anything arrived, the
 *   activation shape must be known up front (`microbatch_tokens` and the stage's `in_features()` or
 *   `boundary_cols`), as Megatron's `tensor_shape`. The programs are verified with
 *   SendMode::grouped; programs built with CommPlacement::ordered pass it.
 *
 * Every message is a small header followed by the payload. The header (kind, micro-batch, shape,
 * element type, sender) is checked against what the receiver expects before the payload is read: a
 * mismatch throws naming both ranks, the micro-batch and both shapes, instead of hanging or
 * silently reading garbage.
 *
 * Loss: the last stage turns each micro-batch's output into its mean loss and dL/dy; the executor
 * scales dL/dy by 1/M, so accumulated gradients are those of the mean over the global batch (for
 * equal micro-batches), and reports the mean loss on every rank. With `ExecutorOptions::loss_on_host`
 * false the loss function keeps the loss in rank memory itself (GptTrainer accumulates it into the
 * step's statistics with `B::accumulate`) and the executor neither sums nor broadcasts it.
 *
 * Host waits on a stage whose backend returns at once (a `backend_type` whose memory the host must
 * not read): none per message when the shapes are known up front (`microbatch_tokens` and the
 * activation width). Received headers are copied to pinned host memory on the rank's stream and
 * checked once those copies are done — at the next step's start, or when the caller's own per-step
 * wait has passed them (`check_received_headers()`) — so a mismatch is named one step late, not
 * before its payload is read; sent headers are staged in pinned memory reused once the stream has
 * passed the previous step's copies. The step then starts without a barrier (on such a backend the
 * host's times measure issue, not work).
 */
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "mpar/backend/rank_transfer.hpp"
#include "mpar/comm/communicator.hpp"
#include "mpar/comm/host_memory_communicator.hpp"
#include "mpar/core/error.hpp"
#include "mpar/core/host_access.hpp"
#include "mpar/core/memory_resource.hpp"
#include "mpar/nn/backend_copy.hpp"
#include "mpar/pipeline/action.hpp"
#include "mpar/pipeline/detail/part_calls.hpp"
#include "mpar/pipeline/pipeline_part.hpp"
#include "mpar/pipeline/timeline.hpp"
#include "mpar/pipeline/verifier.hpp"

namespace mpar::pipeline {

/** @brief How the executor posts point-to-point messages (see the file comment). */
enum class PointToPoint {
  automatic,  ///< `grouped` for an `ordered_point_to_point` communicator, else `posted`
  posted,     ///< every receive posted at step start, matched by tag (needs a tag-matching communicator)
  grouped,    ///< each run of sends and receives issued as one group, in program order (NCCL's semantics)
};

/**
 * @brief Which weight version a micro-batch of an asynchronous (PipeDream-2BW) program runs on, when the
 * program calls an optimizer. Either way a micro-batch's backward uses its forward's weights and two versions
 * suffice (M >= P).
 */
enum class WeightVersions {
  /// The version current on its stage at its forward (PipeDream-2BW's rule): on the first stages the
  /// micro-batches of batch t+1 that enter before batch t's update see the older weights, the rest the newer.
  at_forward,
  /// Batch b (counted from the program's start) runs on W(max(b-1, 0)) on every stage, the weights before
  /// batch b-1's update, and each update applies to the newest version: W(b+1) = update(W(b), g(W(b-1))).
  /// One version per batch, so a single-rank run with the delay done by hand is its reference (GptTrainer's
  /// 2bw semantics), and still no flush between batches.
  per_batch,
};

/**
 * @brief PipeDream-2BW's older weight version kept by the caller instead of by the executor (whose own copy is a
 * host copy of `Parameter::value`): e.g. `train::WeightLag`, whose copies are operations on the rank's stream.
 * With it the optimizer callback zeroes the gradients itself, and under per-batch versions a program may start
 * with an older version in place: its first batch then runs on that version, continuing a previous program's lag.
 */
struct CallerWeightVersions {
  std::function<bool()> has_older;     ///< an older version exists (checked when a program starts)
  std::function<void()> keep_current;  ///< at an optimizer step, before it: the current weights become the older
  std::function<void()> swap;          ///< exchanges the current and the older version in place
  [[nodiscard]] bool given() const { return bool(has_older) && bool(keep_current) && bool(swap); }
};

/** @brief Executor options. */
struct ExecutorOptions {
  /** Activation recomputation per local chunk (missing entries: false): keep only the stage input, rerun the forward before the backward. */
  std::vector<bool> recompute;
  /** Rows (tokens) of every micro-batch, checked on each received activation; 0 = take them from the header. */
  std::size_t microbatch_tokens = 0;
  /** Columns of every activation between stages when the stage has no `in_features()`; 0 = take them from the header. */
  std::size_t boundary_cols = 0;
  PointToPoint p2p = PointToPoint::automatic;
  /** Asynchronous programs with an optimizer: which version each micro-batch uses (see WeightVersions). */
  WeightVersions versions = WeightVersions::at_forward;
  /** Asynchronous programs with an optimizer: the older version kept by the caller (empty: by the executor). */
  CallerWeightVersions caller_versions;
  /**
   * Send buffers (activations and gradients, each with its header) a rank keeps in flight at most: its n-th send
   * first waits for its (n-w)-th to complete (a host stage also frees each completed send at its next action).
   * The executor widens w (doubling) until the verifier proves the programs deadlock-free with it — with each
   * rank's n-th send waiting for its (n-w)-th to be received (lazy interleaved 1F1B needs 2); `sends_in_flight()`
   * says the w in effect. With grouped point-to-point a group's sends are posted together, so up to max(w, its
   * sends).
   */
  std::size_t sends_in_flight = 2;
  /**
   * Whether the loss function's return values are the losses: summed on the host and broadcast from the last
   * stage (StepStats::loss). False: the loss function keeps them in rank memory itself (e.g. `B::accumulate`
   * into the step's statistics) and its return value is ignored; StepStats::loss is NaN.
   */
  bool loss_on_host = true;
};

/** @brief An optimizer step over this rank's parameters (values updated in place from their grads). */
using OptimizerFn = std::function<void(const std::vector<nn::Parameter*>&)>;

/** @brief One rank's measurements of one step (seconds). */
struct StepStats {
  int rank = 0;
  double wall = 0;           ///< step start (after a barrier) to the last send's completion
  double compute = 0;        ///< forwards, backwards, optimizer
  double communication = 0;  ///< issuing sends and copying received payloads
  double idle = 0;           ///< wall - compute - communication: waiting for messages (the bubble)
  double bubble_ratio = 0;   ///< (wall - compute) / wall
  double loss = 0;           ///< mean loss over the step's micro-batches (the same on every rank)
  double throughput = 0;     ///< micro-batches per second
  Timeline timeline;         ///< this rank's events, times in seconds on the process-wide steady clock
};

namespace detail {
inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
/** Message header: what the receiver checks before it reads the payload. */
enum HeaderField : std::size_t { h_magic, h_kind, h_mb, h_rows, h_cols, h_dtype, h_src_rank, h_src_stage, h_size };
inline constexpr float header_magic = 7177.0f;
inline constexpr float dtype_f32 = 1.0f;
/** A stage's backend (`backend_type`), or HostBackend for a stage without one. */
template <class S>
struct stage_backend {
  using type = HostBackend;
};
template <class S>
  requires requires { typename S::backend_type; }
struct stage_backend<S> {
  using type = typename S::backend_type;
};
}  // namespace detail

/**
 * @brief Runs `programs` for one pipeline rank over `comm` (the pipeline group: size P, rank = pipeline rank),
 * with `chunks[c]` the stage object of local chunk c.
 */
template <pipeline_part Stage, communicator Comm>
class Executor {
  // Every stage of a pipeline is a `Stage`, so the tensor one sends is read by the next as its input.
  static_assert(std::is_same_v<output_layout_t<Stage>, input_layout_t<Stage>>,
                "pipeline::Executor: the stage type returns a layout (output_layout_t<Stage>) other than the one it "
                "takes (input_layout_t<Stage>); every pipeline stage has this type, so the next stage would misread "
                "the tensor it receives. Fix: end the stage in the layout it starts with (e.g. a RowParallel after a "
                "ColumnParallel, or AllReduce after a Partial output); a last stage that returns something else to the "
                "loss declares it as loss_layout and returns it from forward_to_loss");

 public:
  /** The micro-batches entering stage 0, in the layout it declares. */
  using input_type = nn::Act<input_layout_t<Stage>>;
  /** The loss on the last stage's output, in the layout it declares for the loss. */
  using loss_type = LossFn<loss_layout_t<Stage>>;
  using request_type = decltype(std::declval<Comm&>().irecv(std::span<float>{}, 0, 0));

  Executor(Comm& comm, Programs programs, std::vector<Stage*> chunks, ExecutorOptions options = {})
      : comm_(comm), prog_(std::move(programs)), chunks_(std::move(chunks)), opt_(std::move(options)) {
    const auto& c = prog_.config;
    require(comm_.size() == c.stages, "pipeline::Executor: communicator '", comm_.name(), "' has ", comm_.size(),
            " ranks but the schedule has P = ", c.stages);
    require_reaches_rank_memory<typename detail::stage_backend<Stage>::type>(comm_, "pipeline::Executor");
    require(int(chunks_.size()) == c.chunks, "pipeline::Executor: rank ", comm_.rank(), " got ", chunks_.size(),
            " stage objects but the schedule has V = ", c.chunks, " chunks per rank");
    for (std::size_t i = 0; i < chunks_.size(); ++i)
      require(chunks_[i] != nullptr, "pipeline::Executor: chunk ", i, " on rank ", comm_.rank(), " is null");
    grouped_ = opt_.p2p == PointToPoint::grouped ||
               (opt_.p2p == PointToPoint::automatic && mpar::detail::ordered_point_to_point<Comm>);
    if constexpr (mpar::detail::ordered_point_to_point<Comm>)
      require(grouped_, "pipeline::Executor: communicator '", comm_.name(),
              "' matches point-to-point messages in issue order without tags, so receives cannot be posted at step "
              "start; use PointToPoint::grouped (the default for it)");
    if (grouped_) {
      require(opt_.microbatch_tokens > 0, "pipeline::Executor: rank ", comm_.rank(),
              " posts receives with their size before they arrive (grouped point-to-point); set "
              "ExecutorOptions::microbatch_tokens");
      for (std::size_t k = 0; k < chunks_.size(); ++k)
        require(activation_cols(int(k)) > 0, "pipeline::Executor: rank ", comm_.rank(),
                " posts receives with their size before they arrive (grouped point-to-point), but the width of chunk ",
                k, "'s input is unknown; set ExecutorOptions::boundary_cols or give the stage in_features()");
      const VerifyReport rep = verify(prog_, SendMode::grouped);
      if (!rep.ok)
        throw config_error("pipeline schedule " + std::string(prog_.schedule) + " (P=" + std::to_string(c.stages) +
                           ", M=" + std::to_string(c.microbatches) + ", V=" + std::to_string(c.chunks) +
                           ") cannot run with grouped, in-order point-to-point messages (communicator '" +
                           comm_.name() + "'): " + rep.error + ". Build the programs with CommPlacement::ordered.");
      report_ = rep;
    } else {
      report_ = verify_or_throw(prog_);
    }
    require(opt_.sends_in_flight >= 1,
            "pipeline::Executor: ExecutorOptions::sends_in_flight is 0; a send needs its "
            "buffer in flight until the transfer completes, so allow at least 1");
    window_ = opt_.sends_in_flight;
    if (!grouped_) {
      // Grouped programs passed a stricter check (a rank waits for each group to complete), so any window is
      // safe there; with tag matching a send's wait can block on a receive the peer reaches later.
      std::size_t most = 0;  // sends of the longest-sending rank: a window this wide never binds
      for (const auto& rp : prog_.ranks)
        most = std::max<std::size_t>(
            most, std::size_t(std::count_if(rp.begin(), rp.end(), [](const Action& a) { return is_send(a.op); })));
      while (window_ < most && !verify(prog_, SendMode::buffered, window_).ok) window_ *= 2;
    }
    opt_.recompute.resize(chunks_.size(), false);
    if constexpr (!detail::droppable_part<Stage>)
      for (bool r : opt_.recompute)
        require(!r, "pipeline::Executor: recomputation needs a stage with drop(mb) to free its saved activations");
    for (auto* ch : chunks_) {
      auto ps = ch->parameters();
      params_.insert(params_.end(), ps.begin(), ps.end());
    }
  }
  /**
   * The same with the rank's chunks held in one vector, chunk c at `chunks[c]`, which the caller keeps, unmoved,
   * while the executor lives. A vector, not a span: `{&a, &b}` would make a span of the range [&a, &b).
   */
  Executor(Comm& comm, Programs programs, std::vector<Stage>& chunks, ExecutorOptions options = {})
      : Executor(comm, std::move(programs), addresses(chunks), std::move(options)) {}

  [[nodiscard]] const Programs& programs() const { return prog_; }
  [[nodiscard]] const VerifyReport& report() const { return report_; }
  [[nodiscard]] const std::vector<nn::Parameter*>& parameters() const { return params_; }
  /** @brief The send window in effect (ExecutorOptions::sends_in_flight, widened where the programs need it). */
  [[nodiscard]] std::size_t sends_in_flight() const { return window_; }
  /** @brief PipeDream-2BW: optimizer steps applied on this rank so far (the current weight version). */
  [[nodiscard]] int weight_version() const { return version_; }

  /**
   * @brief Runs one step (the whole program). `inputs[mb]` are the micro-batches (needed on the rank
   * holding stage 0; others may pass an empty vector); `loss` runs on the rank holding the last stage;
   * `optimizer` (optional) runs at each optimizer_step action — without one, gradients stay
   * accumulated in Parameter::grad for the caller.
   */
  StepStats step(const std::vector<input_type>& inputs, const loss_type& loss, const OptimizerFn& optimizer = {}) {
    const auto& c = prog_.config;
    const int r = comm_.rank(), S = c.total_stages(), N = c.total_microbatches();
    if (holds_stage(0))
      require(int(inputs.size()) >= N, "pipeline::Executor: rank ", r, " holds the first stage and needs ", N,
              " micro-batch inputs, got ", inputs.size());
    if (holds_stage(S - 1))
      require(bool(loss), "pipeline::Executor: rank ", r, " holds the last stage and needs a loss");
    act_.clear();
    grad_.clear();
    saved_.clear();
    fwd_version_.clear();
    stash_.clear();
    weights_change_ = bool(optimizer);
    first_version_ = version_;
    starts_lagged_ = weights_change_ && prog_.asynchronous && opt_.versions == WeightVersions::per_batch &&
                     opt_.caller_versions.given() && opt_.caller_versions.has_older();
    out_shape_.clear();
    sends_.clear();
    sends_posted_ = 0;
    StepStats st;
    st.rank = r;
    st.timeline.config = c;
    double loss_sum = 0;

    check_received_headers();  // the previous step's (a stream-ordered stage's), before their staging is reused
    send_slot_ = 0;
    if constexpr (host_headers) comm_.barrier();  // a stream-ordered stage's host times measure issue: no barrier
    const double t0 = detail::now_seconds();
    const auto& prog = prog_.ranks[std::size_t(r)];
    // In rank memory, like every buffer handed to the communicator (a device communicator reads only that).
    Buffer<float> headers;
    std::vector<request_type> header_reqs;
    std::vector<std::size_t> header_of(prog.size(), 0);
    if (!grouped_) {
      // Post every receive header of the step now, so they land while this rank computes.
      std::size_t nrecv = 0;
      for (const auto& a : prog) nrecv += is_recv(a.op) ? 1 : 0;
      headers = uninitialized_buffer<float>(nrecv * detail::h_size);  // the receives write them
      header_reqs.reserve(nrecv);
      for (std::size_t i = 0, k = 0; i < prog.size(); ++i)
        if (is_recv(prog[i].op)) {
          header_of[i] = k;
          header_reqs.push_back(comm_.irecv(std::span<float>(headers.data() + k * detail::h_size, detail::h_size),
                                            prog[i].peer, tag_of(prog[i], r, 0)));
          ++k;
        }
    }

    for (std::size_t i = 0; i < prog.size(); ++i) {
      const Action& a = prog[i];
      const int s = global_stage(c, r, a.chunk);
      Stage& stage = *chunks_[std::size_t(a.chunk)];
      const double t_start = detail::now_seconds();
      // On a stream-ordered stage `test()` would order the compute stream after each send (and after whatever its
      // communication stream runs first, a data-parallel bucket's reduction) at once; the window's wait does so later.
      if constexpr (host_headers) release_completed_sends();
      if (grouped_ && (is_send(a.op) || is_recv(a.op))) {
        i = exchange_group(prog, i, st) - 1;
        continue;
      }
      Lane lane = Lane::compute;
      double t_work = t_start;
      switch (a.op) {
        case Op::forward: {
          Boundary x = s == 0 ? input_copy(inputs[std::size_t(a.mb)].tensor()) : take(act_, s, a.mb, "activation", a);
          fwd_version_[{a.chunk, a.mb}] = forward_version(a);
          Boundary y;
          with_version(a, [&] { y = detail::forward(stage, x, a.mb, s == S - 1); });
          if (opt_.recompute[std::size_t(a.chunk)]) {
            if constexpr (detail::droppable_part<Stage>) stage.drop(a.mb);
            saved_[{s, a.mb}] = std::move(x);
          }
          if (s == S - 1) {
            Boundary dy;
            const auto y_shape = y.shape();
            const double l = detail::loss<Stage>(loss, std::move(y), a.mb, dy);  // moved: the output is the loss's now
            if (opt_.loss_on_host) loss_sum += l;
            require(dy.shape() == y_shape, "pipeline::Executor: the loss wrote a gradient of shape ", dy.extent(0), "x",
                    dy.extent(1), " for an output of shape ", y_shape[0], "x", y_shape[1]);
            const float scale = 1.0f / float(c.microbatches);
            if constexpr (requires { typename Stage::backend_type; }) {
              // The stage's backend scales its gradient where it lives (no host pass over the logits).
              Stage::backend_type::run(ops::scale{.n = dy.size(), .factor = scale, .x = dy.data()});
            } else {
              for (auto& v : dy.values()) v *= scale;
              note_host_access(2 * dy.bytes());
            }
            grad_[{s, a.mb}] = std::move(dy);
          } else {
            out_shape_[{s, a.mb}] = y.shape();
            act_[{s + 1, a.mb}] = std::move(y);
          }
          break;
        }
        case Op::backward:
        case Op::backward_input: {
          Boundary dy = take(grad_, s, a.mb, "gradient", a);
          if (opt_.recompute[std::size_t(a.chunk)]) {
            Boundary x = take(saved_, s, a.mb, "saved input", a);
            with_version(a, [&] { (void)detail::forward(stage, x, a.mb, s == S - 1); });
          }
          Boundary dx;
          with_version(a, [&] {
            // A split action runs only B; a whole backward is the stage's own `backward` (B and W as it orders
            // them, e.g. unit by unit so that each layer's kept operands are freed early).
            if constexpr (detail::split_backward_part<Stage>)
              if (a.op == Op::backward_input) {
                dx = detail::backward_input(stage, std::move(dy), a.mb, s == S - 1);
                return;
              }
            dx = detail::backward(stage, std::move(dy), a.mb, s == S - 1);
          });
          if (s > 0) grad_[{s - 1, a.mb}] = std::move(dx);
          break;
        }
        case Op::backward_weight:
          if constexpr (detail::split_backward_part<Stage>) with_version(a, [&] { stage.backward_weight(a.mb); });
          break;
        case Op::optimizer_step:
          if (prog_.asynchronous && optimizer) {
            // 2BW: keep the version in-flight micro-batches still need for their backward. Without an
            // optimizer the weights do not change inside the program (the caller steps after it, as
            // GptTrainer does), so there is nothing to keep and no copy is made.
            if (opt_.caller_versions.given()) {
              opt_.caller_versions.keep_current();
            } else {
              stash_.clear();
              for (auto* p : params_) stash_.push_back(p->value);
            }
          }
          if (optimizer) {
            optimizer(params_);
            if (!opt_.caller_versions.given())
              for (auto* p : params_) p->zero_grad();
          }
          ++version_;
          break;
        case Op::send_activation:
        case Op::send_gradient: {
          lane = Lane::communication;
          wait_for_send_window(sends_posted_);
          t_work = detail::now_seconds();  // before this: waiting for an earlier send (idle)
          post_send(a, r, s);
          break;
        }
        case Op::recv_activation:
        case Op::recv_gradient: {
          lane = Lane::communication;
          header_reqs[header_of[i]].wait();
          t_work = detail::now_seconds();  // before this: waiting (idle); after: reading the payload
          const bool g = a.op == Op::recv_gradient;
          const float* header = headers.data() + header_of[i] * detail::h_size;
          Shape<2> shape{};
          if (const auto known = expected_shape(a, s, g)) {  // a stream-ordered stage: checked later, no wait
            shape = *known;
            defer_header_check(header, a, s, g);
          } else {
            const auto h = header_on_host(header);
            shape = check_header(std::span<const float, detail::h_size>(h), a, r, s, g);
          }
          Boundary buf(shape, uninitialized);  // the receive writes it
          comm_.recv(std::span<float>(buf.span()), a.peer, tag_of(a, r, 1));
          (g ? grad_ : act_)[{s, a.mb}] = std::move(buf);
          break;
        }
      }
      const double t_end = detail::now_seconds();
      // A receive's event spans its wait too (the trace shows what a rank waited for); only the
      // part after the header arrived counts as communication work.
      st.timeline.events.push_back({r, lane, a, t_start, t_end});
      (lane == Lane::compute ? st.compute : st.communication) += t_end - t_work;
    }
    for (auto& p : sends_)
      for (auto& q : p.reqs) q.wait();
    sends_.clear();
    if constexpr (!host_headers) {
      if (!checks_.empty() || send_slot_ > 0) {  // the staged headers' copies: done once the stream passes this
        B_::record_event(staged_);
        staged_pending_ = true;
      }
    }
    // Every rank reports the same mean loss (computed on the last stage's rank).
    st.loss = opt_.loss_on_host ? broadcast_loss(loss_sum / double(N), stage_rank(c, S - 1))
                                : std::numeric_limits<double>::quiet_NaN();
    st.wall = detail::now_seconds() - t0;
    st.idle = std::max(0.0, st.wall - st.compute - st.communication);
    st.bubble_ratio = st.wall > 0 ? (st.wall - st.compute) / st.wall : 0;
    st.throughput = st.wall > 0 ? N / st.wall : 0;
    return st;
  }

 private:
  /** Whether the host reads and writes the message headers in rank memory directly (HostBackend, or a stage without a backend). */
  static constexpr bool host_headers = [] {
    if constexpr (requires { typename Stage::backend_type; })
      return mpar::host_reads_rank_memory<typename Stage::backend_type>;
    else
      return true;
  }();
  /** The address of each chunk of a range, in order. */
  static std::vector<Stage*> addresses(std::span<Stage> chunks) {
    std::vector<Stage*> out;
    for (Stage& c : chunks) out.push_back(&c);
    return out;
  }
  /** A received header as host values: read directly, or through the stream-ordered copy and a wait. */
  static std::array<float, detail::h_size> header_on_host(const float* p) {
    std::array<float, detail::h_size> h{};
    if constexpr (host_headers)
      std::copy_n(p, detail::h_size, h.begin());
    else
      mpar::copy_to_host<typename Stage::backend_type>(p, h.data(), detail::h_size);
    return h;
  }
  /** The stage's backend, or HostBackend for a stage without one (whose headers the host reads directly). */
  using B_ = typename detail::stage_backend<Stage>::type;

 public:
  /**
   * @brief Checks the headers a stream-ordered stage received in the last step (see the file comment): waits
   * for their copies only if the stream has not passed them yet — after the caller's own per-step wait (the
   * trainer's statistics read) it has, so this costs no host synchronisation. Throws as a receive would, naming
   * both ranks, the micro-batch and both shapes. Runs at every step's start too; a no-op for host stages.
   */
  void check_received_headers() {
    if constexpr (!host_headers) {
      if (!staged_pending_) return;
      if (!B_::event_done(staged_)) B_::wait_event(staged_);
      staged_pending_ = false;
      const auto checks = std::move(checks_);
      checks_.clear();
      for (const auto& ch : checks) {
        std::array<float, detail::h_size> h{};
        std::copy_n(recv_staging_->data() + ch.slot * detail::h_size, detail::h_size, h.begin());
        check_header(std::span<const float, detail::h_size>(h), ch.action, comm_.rank(), ch.stage, ch.gradient,
                     ch.expected);  // throws on a mismatch; the shape it returns is `ch.expected`
      }
    }
  }

 private:
  /**
   * The shape a receive must have when a stream-ordered stage knows it without reading the header (the
   * micro-batch's tokens and the activation width, or the shape of the output a gradient belongs to); none for a
   * host stage, or when it is not known up front.
   */
  std::optional<Shape<2>> expected_shape(const Action& a, int s, bool grad) const {
    if constexpr (host_headers) {
      return std::nullopt;
    } else {
      if (grad) {
        const auto it = out_shape_.find({s, a.mb});
        if (it != out_shape_.end()) return it->second;
        return std::nullopt;
      }
      const std::size_t cols = activation_cols(a.chunk);
      if (opt_.microbatch_tokens == 0 || cols == 0) return std::nullopt;
      return Shape<2>{opt_.microbatch_tokens, cols};
    }
  }
  /** Copies a received header (rank memory) to pinned host memory on the stream, to be checked later. */
  void defer_header_check(const float* header, const Action& a, int s, bool grad) {
    if constexpr (!host_headers) {
      const std::size_t slot = checks_.size();
      if (!recv_staging_)  // once: a slot per receive of the program, reused every step
        recv_staging_ =
            std::make_unique<typename B_::template pinned_buffer<float>>(actions_of(is_recv) * detail::h_size);
      B_::template copy_to_host_async<float>(detail::h_size, header, recv_staging_->data() + slot * detail::h_size);
      checks_.push_back({slot, a, s, grad, expected_shape(a, s, grad).value_or(Shape<2>{})});
    } else {
      (void)header, (void)a, (void)s, (void)grad;
    }
  }

  /** The first stage's input, copied by the stage's backend where the host must not touch rank memory. */
  static Boundary input_copy(const Boundary& x) {
    if constexpr (requires { typename Stage::backend_type; })
      if constexpr (!mpar::host_reads_rank_memory<typename Stage::backend_type>)
        return nn::backend_copy<typename Stage::backend_type>(x);
    return x;
  }
  /**
   * The last stage's mean loss on every rank. A stage on a backend whose operations return at once (a
   * `backend_type` other than HostBackend's memory) passes it through rank memory with the stream-ordered
   * copies, since its communicator is ordered with the rank's stream.
   */
  double broadcast_loss(double loss, int root) {
    if (comm_.size() == 1) return loss;  // one stage: nothing to send
    if constexpr (requires { typename Stage::backend_type; }) {
      using B = typename Stage::backend_type;
      if constexpr (!mpar::host_reads_rank_memory<B>) {
        Buffer<double> l = B::template allocate<double>(1);
        mpar::copy_to_rank<B>(&loss, l.data(), 1);
        comm_.broadcast(std::span<double>(l), root);
        mpar::copy_to_host<B>(l.data(), &loss, 1);
        return loss;
      }
    }
    Buffer<double> l{loss};
    comm_.broadcast(std::span<double>(l), root);
    return l[0];
  }

  struct PendingSend {
    std::size_t index = 0;  ///< the how-many-th send of the step
    Buffer<float> header;
    Boundary payload;
    std::vector<request_type> reqs;
  };

  /** Frees the sends whose transfers completed (a host stage: the host may free what the transfer has read). */
  void release_completed_sends() {
    std::erase_if(sends_, [](PendingSend& p) {
      return std::all_of(p.reqs.begin(), p.reqs.end(), [](request_type& q) { return bool(q.test()); });
    });
  }
  /**
   * Before send number `next`: waits for, and frees, the sends the window no longer admits (those numbered
   * `next - sends_in_flight()` and earlier). On a stream-ordered communicator the wait orders the compute stream,
   * and with it the buffers' stream-ordered free, after the transfer, without blocking the host.
   */
  void wait_for_send_window(std::size_t next) {
    while (!sends_.empty() && sends_.front().index + window_ <= next) {
      for (auto& q : sends_.front().reqs) q.wait();
      sends_.pop_front();
    }
  }
  using Key = std::pair<int, int>;  // (stage, micro-batch) or (chunk, micro-batch)

  [[nodiscard]] bool holds_stage(int s) const { return stage_rank(prog_.config, s) == comm_.rank(); }

  /** Posts header and payload of a send action; both stay alive until the transfer completes (see the file comment). */
  void post_send(const Action& a, int r, int s) {
    const bool g = a.op == Op::send_gradient;
    const int dst = g ? s - 1 : s + 1;
    auto& pending = sends_.emplace_back();
    pending.index = sends_posted_++;
    pending.payload = take(g ? grad_ : act_, dst, a.mb, g ? "gradient" : "activation", a);
    const std::array<float, detail::h_size> header{detail::header_magic,
                                                   g ? 1.0f : 0.0f,
                                                   float(a.mb),
                                                   float(pending.payload.extent(0)),
                                                   float(pending.payload.extent(1)),
                                                   detail::dtype_f32,
                                                   float(r),
                                                   float(s)};
    static_assert(detail::h_size == 8, "the header list above has one value per header field");
    if constexpr (host_headers) {
      pending.header.assign(header.begin(), header.end());
    } else {
      // Rank memory the host must not write: the stream-ordered copy from pinned staging, a slot per send of the
      // program, rewritten only in a later step after the stream has passed this copy (check_received_headers).
      if (!send_staging_)
        send_staging_ =
            std::make_unique<typename B_::template pinned_buffer<float>>(actions_of(is_send) * detail::h_size);
      float* staged = send_staging_->data() + send_slot_++ * detail::h_size;
      std::copy(header.begin(), header.end(), staged);
      pending.header = uninitialized_buffer<float>(detail::h_size);
      B_::template copy_from_host_async<float>(detail::h_size, staged, pending.header.data());
    }
    pending.reqs.push_back(comm_.isend(std::span<const float>(pending.header), a.peer, tag_of(a, r, 0)));
    pending.reqs.push_back(comm_.isend(std::span<const float>(pending.payload.span()), a.peer, tag_of(a, r, 1)));
  }

  /** Input width of local chunk `c`: the stage's in_features() when it has one, else ExecutorOptions::boundary_cols. */
  [[nodiscard]] std::size_t activation_cols(int c) const {
    if constexpr (requires(Stage & st) {
                    { st.in_features() } -> std::convertible_to<std::size_t>;
                  })
      return chunks_[std::size_t(c)]->in_features();
    else
      return opt_.boundary_cols;
  }

  /**
   * PointToPoint::grouped: posts the run of sends and receives starting at `prog[first]` — headers
   * and payloads, receives with the sizes they must have — in program order, so an in-order
   * communicator issues them as one group and pairs them with the peers' matching groups (the
   * verifier proved they match). Waits for the receives (which completes the group), checks their
   * headers and files the payloads; a group of sends only is issued at once (test()) and runs on
   * while this rank computes. Returns the index after the run.
   */
  std::size_t exchange_group(const std::vector<Action>& prog, std::size_t first, StepStats& st) {
    const int r = comm_.rank();
    const double t_start = detail::now_seconds();
    std::size_t end = first;
    while (end < prog.size() && (is_send(prog[end].op) || is_recv(prog[end].op))) ++end;
    struct Incoming {
      std::size_t action;
      Boundary payload;
    };
    std::vector<Incoming> incoming;
    std::size_t nrecv = 0;
    for (std::size_t i = first; i < end; ++i) nrecv += is_recv(prog[i].op) ? 1 : 0;
    incoming.reserve(nrecv);  // the posted receives point into these payloads
    Buffer<float> headers = uninitialized_buffer<float>(nrecv * detail::h_size);  // the receives write them
    // The window admits the group's last send: its sends are issued together, so the waits come before it.
    if (const std::size_t nsend = (end - first) - nrecv; nsend > 0) wait_for_send_window(sends_posted_ + nsend - 1);
    std::vector<request_type> reqs;
    for (std::size_t i = first; i < end; ++i) {
      const Action& a = prog[i];
      const int s = global_stage(prog_.config, r, a.chunk);
      if (is_send(a.op)) {
        post_send(a, r, s);
        continue;
      }
      const bool g = a.op == Op::recv_gradient;
      Shape<2> shape{opt_.microbatch_tokens, activation_cols(a.chunk)};
      if (g) {
        const auto it = out_shape_.find({s, a.mb});
        require(it != out_shape_.end(), "pipeline::Executor: rank ", r, " at ", describe(a),
                " receives a gradient for an output it has not produced");
        shape = it->second;
      }
      auto& in = incoming.emplace_back(Incoming{i, Boundary(shape, uninitialized)});  // the receive writes it
      reqs.push_back(
          comm_.irecv(std::span<float>(headers.data() + (incoming.size() - 1) * detail::h_size, detail::h_size), a.peer,
                      tag_of(a, r, 0)));
      reqs.push_back(comm_.irecv(std::span<float>(in.payload.span()), a.peer, tag_of(a, r, 1)));
    }
    const double t_posted = detail::now_seconds();
    if (reqs.empty())
      (void)sends_.back().reqs.back().test();  // issue the group now, so it runs during the next compute
    // Headers first (reqs alternate header, payload): with tag matching, a wrong shape is then named
    // below before the payload transfer fails; on NCCL any wait completes the whole group.
    for (std::size_t k = 0; k < reqs.size(); k += 2) reqs[k].wait();
    const double t_arrived = detail::now_seconds();
    for (std::size_t k = 0; k < incoming.size(); ++k) {
      const Action& a = prog[incoming[k].action];
      const int s = global_stage(prog_.config, r, a.chunk);
      const bool g = a.op == Op::recv_gradient;
      // The expected shape check_header enforces is the posted one (both sizes are known in this mode).
      if constexpr (!host_headers) {
        defer_header_check(headers.data() + k * detail::h_size, a, s, g);  // checked later, no host wait
      } else {
        const auto h = header_on_host(headers.data() + k * detail::h_size);
        (void)check_header(std::span<const float, detail::h_size>(h), a, r, s, g);
      }
      reqs[2 * k + 1].wait();
      (g ? grad_ : act_)[{s, a.mb}] = std::move(incoming[k].payload);
    }
    const double t_end = detail::now_seconds();
    // Posting and checking count as communication work; the wait for the group is idle time (the
    // peers' readiness, and on a device the transfer itself, which runs on the communicator's stream).
    for (std::size_t i = first; i < end; ++i)
      st.timeline.events.push_back({r, Lane::communication, prog[i], t_start, t_end});
    st.communication += (t_posted - t_start) + (t_end - t_arrived);
    return end;
  }

  /** Tags are unique per (message kind, micro-batch, receiving stage, header/payload) within a step. */
  [[nodiscard]] int tag_of(const Action& a, int r, int part) const {
    const int s = global_stage(prog_.config, r, a.chunk);
    const bool grad = a.op == Op::send_gradient || a.op == Op::recv_gradient;
    const int dst = a.op == Op::send_activation ? s + 1 : a.op == Op::send_gradient ? s - 1 : s;
    return ((a.mb * prog_.config.total_stages() + dst) * 2 + (grad ? 1 : 0)) * 2 + part;
  }

  Boundary take(std::map<Key, Boundary>& m, int s, int mb, const char* what, const Action& a) {
    auto it = m.find({s, mb});
    require(it != m.end(), "pipeline::Executor: rank ", comm_.rank(), " at ", describe(a), " has no ", what,
            " of micro-batch ", mb, " for stage ", s);
    Boundary b = std::move(it->second);
    m.erase(it);
    return b;
  }

  Shape<2> check_header(std::span<const float, detail::h_size> h, const Action& a, int r, int s, bool grad,
                        Shape<2> expected = {}) {
    const std::string what = grad ? "gradient" : "activation";
    require(h[detail::h_magic] == detail::header_magic, "pipeline: rank ", r, " expected the ", what,
            " header of micro-batch ", a.mb, " from rank ", a.peer, " but received something else (tag clash?)");
    const auto rows = std::size_t(h[detail::h_rows]), cols = std::size_t(h[detail::h_cols]);
    const bool kind_ok = (h[detail::h_kind] == 1.0f) == grad && int(h[detail::h_mb]) == a.mb;
    require(kind_ok && h[detail::h_dtype] == detail::dtype_f32 && int(h[detail::h_src_rank]) == a.peer,
            "pipeline: rank ", r, " (stage ", s, ") expected the ", what, " of micro-batch ", a.mb, " (f32) from rank ",
            a.peer, " but received a ", h[detail::h_kind] == 1.0f ? "gradient" : "activation", " of micro-batch ",
            int(h[detail::h_mb]), " from rank ", int(h[detail::h_src_rank]));
    std::size_t want_rows = 0, want_cols = 0;
    if (expected[0] != 0) {  // a deferred check: the shape the payload was received with
      want_rows = expected[0], want_cols = expected[1];
    } else if (grad) {
      // The gradient of this stage's output must have exactly the output's shape.
      auto it = out_shape_.find({s, a.mb});
      if (it != out_shape_.end()) want_rows = it->second[0], want_cols = it->second[1];
    } else {
      want_rows = opt_.microbatch_tokens;
      want_cols = activation_cols(a.chunk);
    }
    require((want_rows == 0 || rows == want_rows) && (want_cols == 0 || cols == want_cols), "pipeline: rank ", r,
            " (stage ", s, ") received from rank ", a.peer, " the ", what, " of micro-batch ", a.mb, " with shape ",
            rows, "x", cols, " f32 but expects ", want_rows ? std::to_string(want_rows) : std::string("*"), "x",
            want_cols ? std::to_string(want_cols) : std::string("*"),
            " f32; the stages on both sides of this boundary disagree");
    return {rows, cols};
  }

  /** The weight version the forward of `a`'s micro-batch uses (see WeightVersions). */
  [[nodiscard]] int forward_version(const Action& a) const {
    if (!prog_.asynchronous || opt_.versions == WeightVersions::at_forward) return version_;
    const int batch = a.mb / prog_.config.microbatches;
    const int v = first_version_ + std::max(batch - 1, starts_lagged_ ? -1 : 0);
    require(v <= version_, "pipeline::Executor: rank ", comm_.rank(), " runs the forward of micro-batch ", a.mb,
            " (batch ", batch, ") on weight version ", v, ", which its update has not produced yet (version ", version_,
            "); per-batch versions need M >= P");
    return v;
  }
  /** Runs `f` with the weights the micro-batch's forward used (2BW keeps one older version). */
  template <class F>
  void with_version(const Action& a, F&& f) {
    const auto it = fwd_version_.find({a.chunk, a.mb});
    const int v = it == fwd_version_.end() ? version_ : it->second;
    if (v == version_ || !weights_change_) {  // without an optimizer in the program every version has the same values
      f();
      return;
    }
    const bool caller = opt_.caller_versions.given();
    require(
        v == version_ - 1 && (caller ? starts_lagged_ || version_ > first_version_ : stash_.size() == params_.size()),
        "pipeline::Executor: rank ", comm_.rank(), " micro-batch ", a.mb, " needs weight version ", v,
        " but only versions ", version_ - 1, " and ", version_, " are kept (2BW needs M >= P)");
    const auto swap = [&] {
      if (caller)
        opt_.caller_versions.swap();
      else
        for (std::size_t k = 0; k < params_.size(); ++k) std::swap(params_[k]->value, stash_[k]);
    };
    swap();
    try {
      f();
    } catch (...) {
      swap();
      throw;
    }
    swap();
  }

  Comm& comm_;
  Programs prog_;
  std::vector<Stage*> chunks_;
  ExecutorOptions opt_;
  VerifyReport report_;
  std::vector<nn::Parameter*> params_;
  std::map<Key, Boundary> act_, grad_, saved_;
  std::map<Key, Shape<2>> out_shape_;
  std::map<Key, int> fwd_version_;
  std::deque<PendingSend> sends_;  ///< the sends in flight, oldest first
  std::size_t sends_posted_ = 0;   ///< sends posted this step
  std::size_t window_ = 1;         ///< ExecutorOptions::sends_in_flight, widened where the programs need it
  std::vector<decltype(nn::Parameter::value)> stash_;
  int version_ = 0;
  int first_version_ = 0;  ///< version_ when the running program started (WeightVersions::per_batch counts from it)
  bool starts_lagged_ = false;   ///< the running program's first batch runs on the caller's older version
  bool weights_change_ = false;  ///< this step runs an optimizer inside the program (2BW keeps the older version then)
  bool grouped_ = false;         ///< PointToPoint::grouped in effect
  // A stream-ordered stage's headers (see the file comment): pinned staging, one slot per message of the program.
  struct DeferredCheck {
    std::size_t slot;
    Action action;
    int stage;
    bool gradient;
    Shape<2> expected;
  };
  /** Actions of this rank's program for which `pred(op)` holds. */
  template <class Pred>
  [[nodiscard]] std::size_t actions_of(Pred pred) const {
    std::size_t n = 0;
    for (const auto& a : prog_.ranks[std::size_t(comm_.rank())]) n += pred(a.op) ? 1 : 0;
    return n;
  }
  std::vector<DeferredCheck> checks_;  ///< received headers staged this step, checked by check_received_headers
  std::unique_ptr<typename B_::template pinned_buffer<float>> recv_staging_, send_staging_;
  std::size_t send_slot_ = 0;
  typename B_::event_type staged_;  ///< after the step's header copies
  bool staged_pending_ = false;
};

}  // namespace mpar::pipeline
