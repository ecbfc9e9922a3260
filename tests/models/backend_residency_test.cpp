// Every pointer the layers, the GPT stages and the trainer pass to a backend operation must point
// into memory from the rank's memory resource. On CUDA that is what makes it reachable from the
// kernels: a scratch std::vector would be ordinary host memory, and a device kernel would fault on
// it. `ResidencyCheckedBackend` is the host backend plus that check on every call, so the CPU test
// suite proves the memory discipline of the GPU path for every layout it runs here.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <mpar/models/gpt_trainer.hpp>
#include <mpar/mpar.hpp>

#include "gpt_test_config.hpp"

using namespace mpar;

namespace {

/** Host memory that remembers every live allocation, so a pointer can be traced to it. */
class TrackingResource final : public MemoryResource {
 public:
  [[nodiscard]] void* allocate(std::size_t bytes) override {
    void* p = ::operator new(bytes ? bytes : 1);
    std::lock_guard lock(m_);
    live_[reinterpret_cast<std::uintptr_t>(p)] = bytes ? bytes : 1;
    return p;
  }
  void deallocate(void* p, std::size_t) noexcept override {
    {
      std::lock_guard lock(m_);
      live_.erase(reinterpret_cast<std::uintptr_t>(p));
    }
    ::operator delete(p);
  }
  [[nodiscard]] const char* name() const noexcept override { return "tracking"; }
  /** True if `p` lies inside a live allocation of this resource. */
  [[nodiscard]] bool owns(const void* p) const {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    std::lock_guard lock(m_);
    auto it = live_.upper_bound(a);
    if (it == live_.begin()) return false;
    --it;
    return a < it->first + it->second;
  }

 private:
  mutable std::mutex m_;
  std::map<std::uintptr_t, std::size_t> live_;
};

TrackingResource& tracking() {
  static TrackingResource r;
  return r;
}

/** HostBackend whose every operation first checks that its pointer arguments are rank memory. */
struct ResidencyCheckedBackend : HostBackend {
  static void init_rank() {
    HostBackend::init_rank();
    set_current_memory_resource(tracking());
  }
  // Every operation object (backend/ops/: the optimizer's weights, gradients, AdamW moments, SGD momentum and ZeRO
  // blocks, the GEMMs, the layers' elementwise and row kernels, the embedding and the vocabulary-parallel loss, MoE routing, the Llama-class kernels): its rank-memory operands, numbered in each_operand's order.
  template <class Op>
    requires supports<HostBackend, Op>
  static void run(const Op& op) {
    Op operands = op;
    int position = 0;
    operands.each_operand([&](auto* p) {
      ++position;
      require(p == nullptr || tracking().owns(p), "ResidencyCheckedBackend: operand ", position, " of ", Op::name,
              " points outside the rank's memory resource (a device kernel could not read it)");
    });
    HostBackend::run(op);
  }
};
static_assert(backend<ResidencyCheckedBackend>);

template <class S>
inline constexpr bool is_data_span = false;
template <class T, std::size_t N>
inline constexpr bool is_data_span<std::span<T, N>> = !std::is_same_v<std::remove_const_t<T>, std::size_t>;

/** Throws when a data span handed to a collective is not rank memory (NCCL reads and writes device memory only). */
template <class... A>
void check_spans(const char* op, int rank, const A&... args) {
  int position = 0;
  auto one = [&](const auto& a) {
    ++position;
    if constexpr (is_data_span<std::decay_t<decltype(a)>>)
      require(a.empty() || tracking().owns(a.data()), "ResidencyCheckedCommunicator: rank ", rank, ", argument ",
              position, " of ", op, " (", a.size(), " elements) is outside the rank's memory resource");
  };
  (one(args), ...);
}

/**
 * A communicator that checks every data buffer of every call before forwarding it: what the trainer
 * sends and receives must be rank memory, so that on CUDA the communicator can be NCCL.
 */
template <communicator Comm>
class ResidencyCheckedCommunicator {
 public:
  explicit ResidencyCheckedCommunicator(Comm inner) : inner_(std::move(inner)) {}
  [[nodiscard]] int rank() const { return inner_.rank(); }
  [[nodiscard]] int size() const { return inner_.size(); }
  [[nodiscard]] std::string name() const { return inner_.name(); }
  void barrier() { inner_.barrier(); }
  [[nodiscard]] ResidencyCheckedCommunicator split(int color, int key) {
    return ResidencyCheckedCommunicator(inner_.split(color, key));
  }
#define MPAR_TEST_CHECKED_COMM(op)           \
  template <class... A>                      \
  decltype(auto) op(A&&... a) {              \
    check_spans(#op, rank(), a...);          \
    return inner_.op(std::forward<A>(a)...); \
  }
  MPAR_TEST_CHECKED_COMM(all_reduce)
  MPAR_TEST_CHECKED_COMM(broadcast)
  MPAR_TEST_CHECKED_COMM(reduce)
  MPAR_TEST_CHECKED_COMM(all_gather)
  MPAR_TEST_CHECKED_COMM(reduce_scatter)
  MPAR_TEST_CHECKED_COMM(gather)
  MPAR_TEST_CHECKED_COMM(scatter)
  MPAR_TEST_CHECKED_COMM(all_to_all)
  MPAR_TEST_CHECKED_COMM(all_to_all_v)
  MPAR_TEST_CHECKED_COMM(send)
  MPAR_TEST_CHECKED_COMM(recv)
  MPAR_TEST_CHECKED_COMM(iall_reduce)
  MPAR_TEST_CHECKED_COMM(iall_gather)
  MPAR_TEST_CHECKED_COMM(ireduce_scatter)
  MPAR_TEST_CHECKED_COMM(isend)
  MPAR_TEST_CHECKED_COMM(irecv)
#undef MPAR_TEST_CHECKED_COMM

 private:
  Comm inner_;
};
static_assert(communicator<ResidencyCheckedCommunicator<ThreadsCommunicator>>);

/** The model tests' small GPT, with dropout, for 3 steps. */
models::GptTrainConfig config(std::size_t tp, std::size_t pp, std::size_t dp, const std::string& schedule) {
  models::GptTrainConfig c = testing::small_gpt(tp, pp, dp, schedule);
  c.model.dropout = 0.1;
  c.steps = 3;
  c.warmup = 1;
  return c;
}

/** The losses of `c.steps` steps; with the checked backend, every collective's buffers are checked too. */
template <backend B>
std::vector<double> losses(const models::GptTrainConfig& c, const std::string& save_to = "") {
  std::vector<double> out;
  std::mutex m;
  run_threads(int(c.world_size()), [&](ThreadsCommunicator& threads) {
    using Comm = std::conditional_t<std::is_same_v<B, HostBackend>, ThreadsCommunicator,
                                    ResidencyCheckedCommunicator<ThreadsCommunicator>>;
    B::init_rank();  // as a CUDA rank does before anything else: its memory first
    Comm world(threads);
    models::GptTrainer<Comm, B> tr(world, c, testing::gpt_dataset());
    std::vector<double> mine;
    for (std::size_t s = 0; s < c.steps; ++s) mine.push_back(tr.train_step().loss);
    if (!save_to.empty()) (void)tr.save(save_to);
    std::lock_guard lock(m);
    if (world.rank() == 0) out = mine;
    set_current_memory_resource(detail::host_memory_resource());
  });
  return out;
}

}  // namespace

TEST_CASE(
    "backend residency: every pointer the GPT trainer passes to its backend (layers and optimizer) or its "
    "communicators is rank memory",
    "[models][backend]") {
  struct Layout {
    std::size_t tp, pp, dp;
    const char* schedule;
    bool recompute, moe, zero1_f16_save = false, sgd = false;
  };
  for (const Layout l : {Layout{1, 1, 1, "1f1b", false, false}, Layout{2, 2, 1, "zb_h1", false, false},
                         Layout{2, 1, 2, "1f1b", true, false}, Layout{1, 2, 2, "interleaved_1f1b", false, false},
                         Layout{1, 2, 1, "1f1b", false, true}, Layout{1, 1, 2, "1f1b", false, false, true},
                         Layout{2, 1, 1, "1f1b", false, false, false, true}}) {
    auto c = config(l.tp, l.pp, l.dp, l.schedule);
    c.recompute = l.recompute;
    if (l.moe) {  // mixture of experts in every other block, experts spread over ep = 2
      c.ep = 2;
      c.model.experts = 4;
      c.model.moe_every = 2;
      c.model.moe_capacity = 0;  // unlimited: no token dropped
    }
    if (l.zero1_f16_save) {  // ZeRO-1, dynamic loss scaling, and a checkpoint written at the end
      c.zero = parallel::ZeroStage::optimizer_states;
      c.precision = parallel::Precision::f16;
      c.clip = 1.0;
    }
    if (l.sgd) c.optimizer = parallel::UpdateRule::sgd;  // momentum buffers instead of AdamW moments
    if (std::string(l.schedule) == "interleaved_1f1b") c.chunks = 2;
    INFO("tp=" << l.tp << " pp=" << l.pp << " dp=" << l.dp << " " << l.schedule << (l.recompute ? " recompute" : "")
               << (l.moe ? " moe ep=2" : "") << (l.zero1_f16_save ? " zero1 f16 save" : "") << (l.sgd ? " sgd" : ""));
    const std::string save =
        l.zero1_f16_save ? (std::filesystem::temp_directory_path() / "mpar-residency-ckpt").string() : "";
    const auto checked = losses<ResidencyCheckedBackend>(c, save);  // throws on a pointer outside rank memory
    if (!save.empty()) std::filesystem::remove_all(save);
    // The check only observes: the arithmetic is the host backend's, so the losses are identical.
    CHECK(checked == losses<HostBackend>(c));
  }
}

/** The message `f()` throws, or "" when it returns (made on a rank thread; asserted on the main thread). */
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST_CASE("backend residency: a scratch std::vector handed to a backend operation is caught", "[models][backend]") {
  std::string fine = "not run", caught;
  run_threads(1, [&](ThreadsCommunicator&) {
    ResidencyCheckedBackend::init_rank();
    nn::Activation x({2, 4}, 1.0f);
    std::vector<float> host_only(8);
    fine = error_of([&] {
      ResidencyCheckedBackend::run(ops::gelu_forward{.n = x.size(), .x = x.data(), .y = x.data()});
    });  // rank memory
    caught = error_of(
        [&] { ResidencyCheckedBackend::run(ops::gelu_forward{.n = x.size(), .x = x.data(), .y = host_only.data()}); });
    set_current_memory_resource(detail::host_memory_resource());
  });
  CHECK(fine.empty());
  CHECK_THAT(caught, Catch::Contains("operand 2 of gelu_forward points outside the rank's memory resource"));
}

TEST_CASE("backend residency: optimizer states allocated outside the rank's memory are caught", "[models][backend]") {
  std::string fine = "not run", adam_error, sgd_error;
  run_threads(1, [&](ThreadsCommunicator&) {
    ResidencyCheckedBackend::init_rank();
    nn::Parameter p;
    p.name = "w";
    p.global_shape = {8};
    p.local_box = {Block{0, 8}};
    p.layout = "Replicate";
    p.value.assign(8, 1.0f);
    p.grad.assign(8, 0.5f);
    optim::AdamW<ResidencyCheckedBackend> adam({&p}, {});
    optim::Sgd<ResidencyCheckedBackend> sgd({&p}, {});
    fine = error_of([&] {  // moments and momentum in rank memory: fine
      adam.step();
      sgd.step();
    });
    // The same optimizers constructed under plain heap memory (before a rank's init, say): refused when they zero
    // their moments and momentum there, their first operation on those buffers.
    {
      ScopedMemoryResource heap(detail::host_memory_resource());
      adam_error = error_of([&] { optim::AdamW<ResidencyCheckedBackend> heap_adam({&p}, {}); });
      sgd_error = error_of([&] { optim::Sgd<ResidencyCheckedBackend> heap_sgd({&p}, {}); });
    }
    set_current_memory_resource(detail::host_memory_resource());
  });
  CHECK(fine.empty());
  CHECK_THAT(adam_error, Catch::Contains("operand 1 of zero points outside"));
  CHECK_THAT(sgd_error, Catch::Contains("operand 1 of zero points outside"));
}
