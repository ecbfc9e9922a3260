// The stream-ordered backend contract (backend/backend.hpp), over HostBackend (synchronous: the
// contract holds trivially) and the stream-emulating backends (operations on a worker thread per
// rank; DiscreteHostBackend's rank memory faults when the host touches it). Built into test_backend,
// whose tests run under ThreadSanitizer too (label tsan): there a host read of rank memory that no
// event or synchronize() orders after the producing operation is a reported data race.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdint>
#include <exception>
#include <future>
#include <latch>
#include <optional>
#include <thread>
#include <type_traits>
#include <vector>

#include <mpar/backend/host/host_backend.hpp>
#include <mpar/backend/stream/host_access_trace.hpp>
#include <mpar/backend/stream/stream_backend.hpp>

using namespace mpar;

namespace {

/** Runs `f` on a fresh thread (a rank with its own stream and memory resource) and returns its result. */
template <class F>
auto on_rank(F f) {
  using R = decltype(f());
  std::optional<R> out;
  std::exception_ptr error;
  std::thread t([&] {
    try {
      out.emplace(f());
    } catch (...) {
      error = std::current_exception();
    }
  });
  t.join();
  if (error) std::rethrow_exception(error);
  return std::move(*out);
}

std::vector<float> ramp(std::size_t n, float start) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = start + 0.25f * float(i);
  return v;
}

template <class B>
inline constexpr bool is_stream_backend = !std::is_same_v<B, HostBackend>;

}  // namespace

TEMPLATE_TEST_CASE("backend contract: operations in issue order, results on the host after an event wait",
                   "[backend][stream]", HostBackend, StreamHostBackend, DiscreteHostBackend) {
  using B = TestType;
  const std::size_t n = 1000;
  const std::vector<float> v = ramp(n, -3.0f);
  struct Out {
    std::vector<float> after_double, after_triple, sum;
    bool done_after_wait = false;
  };
  const Out out = on_rank([&] {
    B::init_rank();
    Buffer<float> x = B::template allocate<float>(n), y = B::template allocate<float>(n);
    typename B::template pinned_buffer<float> h1(n), h2(n), h3(n);
    B::template copy_from_host_async<float>(n, v.data(), x.data());
    B::run(ops::scale{.n = n, .factor = 2.0f, .x = x.data()});
    B::template copy_to_host_async<float>(n, x.data(), h1.data());  // must see 2v, not 6v
    B::run(ops::scale{.n = n, .factor = 3.0f, .x = x.data()});
    B::template copy_to_host_async<float>(n, x.data(), h2.data());
    B::run(ops::add{.n = n, .x = x.data(), .z = x.data(), .y = y.data()});
    B::template copy_to_host_async<float>(n, y.data(), h3.data());
    typename B::event_type e;
    B::record_event(e);
    B::wait_event(e);
    Out o;
    o.done_after_wait = B::event_done(e);
    o.after_double.assign(h1.data(), h1.data() + n);
    o.after_triple.assign(h2.data(), h2.data() + n);
    o.sum.assign(h3.data(), h3.data() + n);
    return o;
  });
  CHECK(out.done_after_wait);
  for (std::size_t i = 0; i < n; ++i) {
    INFO("element " << i);
    REQUIRE(out.after_double[i] == 2.0f * v[i]);  // exact: scaling by 2 and 3 and doubling are exact here
    REQUIRE(out.after_triple[i] == 6.0f * v[i]);
    REQUIRE(out.sum[i] == 12.0f * v[i]);
  }
}

TEMPLATE_TEST_CASE("backend contract: a reduction (sum_squares) accumulates into rank memory, read after a wait",
                   "[backend][stream]", HostBackend, StreamHostBackend, DiscreteHostBackend) {
  using B = TestType;
  const std::size_t n = 257;
  const std::vector<float> v = ramp(n, -1.0f);
  const double start = 0.5;  // sum_squares adds to what the accumulator holds
  double want = start;
  for (float a : v) want += double(a) * double(a);
  want += want - start;  // issued twice: the second adds the same sum again
  const double got = on_rank([&] {
    B::init_rank();
    Buffer<float> x = B::template allocate<float>(n);
    Buffer<double> acc = B::template allocate<double>(1);
    B::template copy_from_host_async<float>(n, v.data(), x.data());
    B::template copy_from_host_async<double>(1, &start, acc.data());
    B::run(ops::scale{
        .n = n, .factor = -1.0f, .x = x.data()});  // ordered before the sums: the sign does not change them, NaN would
    B::run(ops::sum_squares{.n = n, .x = x.data(), .acc = acc.data()});
    B::run(ops::sum_squares{.n = n, .x = x.data(), .acc = acc.data()});
    typename B::template pinned_buffer<double> host(1);
    B::template copy_to_host_async<double>(1, acc.data(), host.data());
    typename B::event_type done;
    B::record_event(done);
    B::wait_event(done);
    return host.data()[0];
  });
  CHECK(got == Approx(want).epsilon(1e-12));
}

TEMPLATE_TEST_CASE("backend contract: accumulate adds a scaled sum into a double of rank memory (the step's losses)",
                   "[backend][stream]", HostBackend, StreamHostBackend, DiscreteHostBackend) {
  using B = TestType;
  // Values exact in binary, so the hand result is exact: 2 + 2 (0.5 + 0.25 + 1) = 5.5, then + 0.5 * 3 = 7.
  const std::vector<float> v{0.5f, 0.25f, 1.0f, 3.0f};
  const double start = 2.0;
  const double got = on_rank([&] {
    B::init_rank();
    Buffer<float> x = B::template allocate<float>(v.size());
    Buffer<double> acc = B::template allocate<double>(1);
    B::template copy_from_host_async<float>(v.size(), v.data(), x.data());
    B::template copy_from_host_async<double>(1, &start, acc.data());
    B::run(ops::accumulate{.n = 3, .x = x.data(), .scale = 2.0, .acc = acc.data()});
    B::run(ops::accumulate{.n = 1, .x = x.data() + 3, .scale = 0.5, .acc = acc.data()});  // after the first: both add
    typename B::template pinned_buffer<double> host(1);
    B::template copy_to_host_async<double>(1, acc.data(), host.data());
    typename B::event_type done;
    B::record_event(done);
    B::wait_event(done);
    return host.data()[0];
  });
  CHECK(got == 7.0);
}

TEMPLATE_TEST_CASE("stream backends: fresh rank memory is NaN, so a missing zeroing shows", "[backend][stream]",
                   StreamHostBackend, DiscreteHostBackend) {
  using B = TestType;
  const std::size_t rows = 3, cols = 50;
  struct Out {
    std::vector<float> f;
    std::vector<double> d;
    std::vector<bf16> h;
    std::vector<float> bias_grad_unzeroed, bias_grad_zeroed;
  };
  const Out out = on_rank([&] {
    B::init_rank();
    Out o;
    o.f.resize(cols);
    o.d.resize(cols);
    o.h.resize(cols);
    Buffer<float> f = B::template allocate<float>(cols);
    Buffer<double> d = B::template allocate<double>(cols);
    Buffer<bf16> h = B::template allocate<bf16>(cols);
    B::template copy_to_host_async<float>(cols, f.data(), o.f.data());
    B::template copy_to_host_async<double>(cols, d.data(), o.d.data());
    B::template copy_to_host_async<bf16>(cols, h.data(), o.h.data());
    // A bias gradient accumulates: forgetting to zero its buffer first must poison the result.
    const std::vector<float> ones(rows * cols, 1.0f), zeros(cols, 0.0f);
    Buffer<float> dy = B::template allocate<float>(rows * cols), acc = B::template allocate<float>(cols),
                  acc0 = B::template allocate<float>(cols);
    B::template copy_from_host_async<float>(rows * cols, ones.data(), dy.data());
    B::template copy_from_host_async<float>(cols, zeros.data(), acc0.data());
    B::run(ops::bias_add_backward{.rows = rows, .cols = cols, .dy = dy.data(), .dbias = acc.data()});
    B::run(ops::bias_add_backward{.rows = rows, .cols = cols, .dy = dy.data(), .dbias = acc0.data()});
    o.bias_grad_unzeroed.resize(cols);
    o.bias_grad_zeroed.resize(cols);
    B::template copy_to_host_async<float>(cols, acc.data(), o.bias_grad_unzeroed.data());
    B::template copy_to_host_async<float>(cols, acc0.data(), o.bias_grad_zeroed.data());
    B::synchronize();
    return o;
  });
  for (std::size_t i = 0; i < cols; ++i) {
    INFO("element " << i);
    REQUIRE(std::isnan(out.f[i]));
    REQUIRE(std::isnan(out.d[i]));
    REQUIRE(std::isnan(float(out.h[i])));
    REQUIRE(std::isnan(out.bias_grad_unzeroed[i]));
    REQUIRE(out.bias_grad_zeroed[i] == float(rows));
  }
}

TEMPLATE_TEST_CASE("stream backends: an operation returns before it runs; an event says when it has",
                   "[backend][stream]", StreamHostBackend, DiscreteHostBackend) {
  using B = TestType;
  const std::size_t n = 64;
  const std::vector<float> v = ramp(n, 1.0f);
  struct Out {
    bool done_while_blocked = true, done_after = false;
    std::vector<float> h;
  };
  const Out out = on_rank([&] {
    B::init_rank();
    std::latch gate(1);
    // The stream's worker blocks in this operation until the host opens the gate: everything issued
    // after it is queued, not run, so its calls must return with the event not yet passed.
    B::stream()->enqueue("blocked", [&gate] { gate.wait(); });
    Buffer<float> x = B::template allocate<float>(n);
    Out o;
    o.h.assign(n, -7.0f);
    B::template copy_from_host_async<float>(n, v.data(), x.data());
    B::run(ops::scale{.n = n, .factor = 0.5f, .x = x.data()});
    B::template copy_to_host_async<float>(n, x.data(), o.h.data());
    typename B::event_type e;
    B::record_event(e);
    o.done_while_blocked = B::event_done(e);
    gate.count_down();
    B::wait_event(e);
    o.done_after = B::event_done(e);
    return o;
  });
  CHECK_FALSE(out.done_while_blocked);
  CHECK(out.done_after);
  for (std::size_t i = 0; i < n; ++i) REQUIRE(out.h[i] == 0.5f * v[i]);
}

TEMPLATE_TEST_CASE("stream backends: a buffer dropped while operations on it are queued is reused only after them",
                   "[backend][stream]", StreamHostBackend, DiscreteHostBackend) {
  using B = TestType;
  const std::size_t n = 300;
  const std::vector<float> v = ramp(n, 2.0f);
  const std::vector<float> h = on_rank([&] {
    B::init_rank();
    std::latch gate(1);
    B::stream()->enqueue("blocked", [&gate] { gate.wait(); });
    std::vector<float> result(n, -7.0f);
    {
      Buffer<float> temp = B::template allocate<float>(n);
      B::template copy_from_host_async<float>(n, v.data(), temp.data());
      B::template copy_to_host_async<float>(n, temp.data(), result.data());
    }  // freed here, before the worker has run the copies
    // Same size class: a block freed at once would come back here and be NaN-filled now, before the
    // copies above ran.
    Buffer<float> next = B::template allocate<float>(n);
    gate.count_down();
    B::synchronize();
    return result;
  });
  for (std::size_t i = 0; i < n; ++i) REQUIRE(h[i] == v[i]);
}

TEMPLATE_TEST_CASE("backend contract: a failing operation is reported at the next synchronisation, naming it",
                   "[backend][stream]", HostBackend, StreamHostBackend, DiscreteHostBackend) {
  using B = TestType;
  const std::size_t n = 8;
  struct Out {
    std::string message;
    float skipped_copy = 0, later_copy = 0;
  };
  const Out out = on_rank([&] {
    B::init_rank();
    Buffer<float> x = B::template allocate<float>(n), y = B::template allocate<float>(n);
    const std::vector<float> ones(n, 1.0f);
    B::template copy_from_host_async<float>(n, ones.data(), x.data());
    std::vector<float> first(n, -7.0f), later(n, -7.0f);
    Out o;
    const host::DropoutMask bad{.seed = 1, .stream = 2, .p = 1.5, .global_cols = n};
    try {
      B::run(ops::dropout_apply{.mask = bad,
                                .rows = 1,
                                .cols = n,
                                .x = x.data(),
                                .y = y.data()});  // HostBackend throws here, the stream backends later
      B::template copy_to_host_async<float>(n, x.data(), first.data());  // skipped after the failure
      B::synchronize();
    } catch (const std::exception& e) {
      o.message = e.what();
      if (const auto* nested = dynamic_cast<const std::nested_exception*>(&e)) {
        try {
          nested->rethrow_nested();
        } catch (const std::exception& inner) {
          o.message += std::string(" | nested: ") + inner.what();
        }
      }
    }
    o.skipped_copy = first[0];
    // Reported once: the stream runs what is issued afterwards.
    B::template copy_to_host_async<float>(n, x.data(), later.data());
    B::synchronize();
    o.later_copy = later[0];
    return o;
  });
  CHECK_THAT(out.message, Catch::Contains("probability 1.5"));
  if constexpr (is_stream_backend<B>) {
    CHECK_THAT(out.message, Catch::Contains("operation 'dropout_apply'") && Catch::Contains("stream"));
  }
  CHECK(out.skipped_copy == -7.0f);
  CHECK(out.later_copy == 1.0f);
}

TEST_CASE("stream backends: a rank's stream waits for another rank's event without blocking either host",
          "[backend][stream]") {
  using B = StreamHostBackend;
  const std::size_t n = 128;
  const std::vector<float> v = ramp(n, -5.0f);
  std::latch gate(1), consumed(1);
  std::promise<std::pair<float*, B::event_type>> produced;
  std::vector<float> seen(n, -7.0f);
  bool done_before_gate = true;
  std::exception_ptr error;
  std::thread producer([&] {
    try {
      B::init_rank();
      Buffer<float> x = B::allocate<float>(n);
      B::stream()->enqueue("blocked", [&gate] { gate.wait(); });
      B::copy_from_host_async<float>(n, v.data(), x.data());
      B::run(ops::scale{.n = n, .factor = 4.0f, .x = x.data()});
      B::event_type e;
      B::record_event(e);
      produced.set_value({x.data(), e});
      consumed.wait();  // x stays allocated until the consumer's copy has run
      B::synchronize();
    } catch (...) {
      error = std::current_exception();
    }
  });
  std::thread consumer([&] {
    B::init_rank();
    auto [x, e] = produced.get_future().get();
    B::stream_wait_event(e);  // returns at once; the copy below runs only after the producer's scale
    B::copy_to_host_async<float>(n, x, seen.data());
    B::event_type mine;
    B::record_event(mine);
    done_before_gate = B::event_done(mine);
    gate.count_down();
    B::wait_event(mine);
    consumed.count_down();
  });
  consumer.join();
  producer.join();
  if (error) std::rethrow_exception(error);
  CHECK_FALSE(done_before_gate);
  for (std::size_t i = 0; i < n; ++i) REQUIRE(seen[i] == 4.0f * v[i]);
}

TEST_CASE("DiscreteHostBackend: an operation given memory outside rank memory is refused, naming it",
          "[backend][stream]") {
  const std::string message = on_rank([] {
    DiscreteHostBackend::init_rank();
    Buffer<float> y = DiscreteHostBackend::allocate<float>(4);
    std::vector<float> scratch(4, 1.0f);  // ordinary host memory: a device could not read it
    try {
      DiscreteHostBackend::run(ops::add{.n = 4, .x = scratch.data(), .z = scratch.data(), .y = y.data()});
    } catch (const std::exception& e) {
      DiscreteHostBackend::synchronize();
      return std::string(e.what());
    }
    return std::string("no error");
  });
  CHECK_THAT(message, Catch::Contains("argument 1 of add") && Catch::Contains("rank memory"));
}

namespace {
const void* volatile expected_fault = nullptr;
void exit_on_fault(int, siginfo_t* info, void*) { _exit(info->si_addr == expected_fault ? 42 : 43); }

/**
 * Runs `touch` in a forked child with a SIGSEGV handler: 42 = faulted at `at`, 43 = faulted
 * elsewhere, 0 = no fault, other = the child failed otherwise.
 */
template <class F>
int child_fault_status(const void* at, F touch) {
  const pid_t pid = fork();
  if (pid == 0) {
    expected_fault = at;
    struct sigaction sa {};
    sa.sa_sigaction = exit_on_fault;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, nullptr);
    touch();
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
}  // namespace

TEST_CASE("DiscreteHostBackend: a host read or write of rank memory faults; the sanctioned copies work",
          "[backend][stream][discrete]") {
  using B = DiscreteHostBackend;
  const std::size_t n = 1024;
  const std::vector<float> v = ramp(n, 0.5f);
  struct Out {
    int read_status = -1, write_status = -1, tensor_status = -1, control_status = -1;
    std::vector<float> back;
  };
  const Out out = on_rank([&] {
    B::init_rank();
    Out o;
    Buffer<float> x = B::allocate<float>(n);
    B::copy_from_host_async<float>(n, v.data(), x.data());
    B::run(ops::scale{.n = n, .factor = -2.0f, .x = x.data()});
    o.back.resize(n);
    B::copy_to_host_async<float>(n, x.data(), o.back.data());
    B::synchronize();
    float* p = x.data() + 17;
    o.read_status = child_fault_status(p, [p] {
      volatile float r = *p;  // the host dereferences rank memory
      (void)r;
    });
    o.write_status = child_fault_status(p, [p] { *static_cast<volatile float*>(p) = 1.0f; });
    // A Tensor created on the rank zero-fills itself on the host: under the discrete check that is a
    // host write of rank memory, so it faults too (layers must allocate with B::allocate instead).
    o.tensor_status = child_fault_status(nullptr, [] { Tensor<float, 1> t({16}); });
    // Control: the same child with ordinary host memory does not fault.
    std::vector<float> host(4, 1.0f);
    float* q = host.data();
    o.control_status = child_fault_status(q, [q] {
      volatile float r = *q;
      (void)r;
    });
    return o;
  });
  CHECK(out.read_status == 42);
  CHECK(out.write_status == 42);
  CHECK(out.tensor_status == 43);  // faults, at the tensor's own (unknown here) address
  CHECK(out.control_status == 0);
  for (std::size_t i = 0; i < n; ++i) REQUIRE(out.back[i] == -2.0f * v[i]);
}

TEST_CASE("HostAccessTrace: with DiscreteHostBackend, every host access of rank memory is recorded and the run goes on",
          "[backend][stream][discrete]") {
  using B = DiscreteHostBackend;
  const std::size_t n = 64;
  const std::vector<float> v = ramp(n, 1.0f);
  const int status = on_rank([&] {
    B::init_rank();
    Buffer<float> x = B::allocate<float>(n);
    B::copy_from_host_async<float>(n, v.data(), x.data());
    B::run(ops::scale{.n = n, .factor = 3.0f, .x = x.data()});
    B::synchronize();
    float* p = x.data();
    // In a child: the trace installs process-wide signal handlers. Exit status: 0 when the two reads
    // saw the values the operation wrote, the write landed, and the trace holds one read site run
    // and one write site, three reads and one write in all; a distinct nonzero status for each failure.
    const pid_t pid = fork();
    if (pid == 0) {
      int code = 0;
      {
        stream::HostAccessTrace trace;
        float got[2];
        for (int i = 0; i < 2; ++i) got[i] = static_cast<volatile float*>(p)[5 + i];  // host reads
        static_cast<volatile float*>(p)[9] = -1.0f;                                   // a host write
        const float back = static_cast<volatile float*>(p)[9];                        // another read
        if (got[0] != 3.0f * v[5] || got[1] != 3.0f * v[6])
          code = 1;
        else if (back != -1.0f)
          code = 2;
        else if (trace.accesses(false) != 3 || trace.accesses(true) != 1)
          code = 3;
        else if (trace.site_count() < 2)
          code = 4;
      }
      _exit(code);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  });
  CHECK(status == 0);
}
