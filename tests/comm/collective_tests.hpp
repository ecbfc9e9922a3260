#pragma once
// Collective tests written once over any `communicator`: each function runs on every rank of a
// group and records failures in a Checker (Catch2's assertions are not thread-safe, so the
// threads driver checks the collected failures on the main thread after the ranks joined).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "mpar/comm/communicator.hpp"
#include "mpar/comm/detail/comm_element.hpp"
#include "mpar/comm/mesh_comms.hpp"
#include "mpar/core/error.hpp"

namespace mpar::test {

struct Checker {
  std::vector<std::string> failures;
  template <class... Parts>
  void expect(bool ok, Parts&&... parts) {
    if (!ok && failures.size() < 16) failures.push_back(detail::cat(std::forward<Parts>(parts)...));
  }
};

inline constexpr ReduceOp all_ops[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min};

/** Counts worth testing on p ranks: empty, smaller than p, uneven, and large uneven. */
inline std::vector<std::size_t> test_counts(int p) {
  const auto q = std::size_t(p);
  std::vector<std::size_t> c{0, 1, q + 1, 3 * q - 1, 1031};
  if (q <= 4) c.push_back(5000);  // large counts cost time, not coverage, on oversubscribed cores
  if (q > 2) c.push_back(q - 1);
  return c;
}

/** Small integers: sums, maxima and minima are exact in every element type. */
template <class T>
T value(int rank, std::size_t i, int salt) {
  return T(float(int((std::size_t(rank) * 7 + i * 3 + std::size_t(salt) * 5) % 17) - 8));
}

/** The serial reference: fold over ranks 0..p-1 in compute precision, then round to T. */
template <class T>
T reference(int p, std::size_t i, ReduceOp op, int salt) {
  using A = compute_type_t<T>;
  A acc = A(value<T>(0, i, salt));
  for (int q = 1; q < p; ++q) {
    const A v = A(value<T>(q, i, salt));
    acc = op == ReduceOp::max ? std::max(acc, v) : op == ReduceOp::min ? std::min(acc, v) : acc + v;
  }
  if (op == ReduceOp::avg) acc /= A(p);
  return T(acc);
}

template <class T>
bool close(T got, T want) {
  const double g = double(compute_type_t<T>(got)), w = double(compute_type_t<T>(want));
  const double tol = std::is_same_v<T, double>  ? 1e-12
                     : std::is_same_v<T, float> ? 1e-6
                     : std::is_same_v<T, bf16>  ? 1.0 / 128
                                                : 1.0 / 1024;
  return std::abs(g - w) <= tol * std::max(1.0, std::abs(w));
}

template <class T>
std::string where(const char* op, int rank, int p, std::size_t n, std::size_t i) {
  return detail::cat(op, "<", dtype_name_v<T>, ">: rank ", rank, " of ", p, ", n=", n, ", element ", i);
}

template <class T, class Comm>
void check_all_reduce(Comm& c, Checker& ck) {
  const int p = c.size(), r = c.rank();
  int salt = 0;
  for (std::size_t n : test_counts(p))
    for (ReduceOp op : all_ops) {
      ++salt;
      std::vector<T> buf(n);
      for (std::size_t i = 0; i < n; ++i) buf[i] = value<T>(r, i, salt);
      c.all_reduce(std::span<T>(buf), op);
      for (std::size_t i = 0; i < n; ++i)
        ck.expect(close(buf[i], reference<T>(p, i, op, salt)), where<T>("all_reduce", r, p, n, i), " op ",
                  reduce_op_name(op), ": got ", float(buf[i]), ", want ", float(reference<T>(p, i, op, salt)));
    }
}

template <class T, class Comm>
void check_reduce_scatter_and_reduce(Comm& c, Checker& ck) {
  const int p = c.size(), r = c.rank();
  int salt = 100;
  for (std::size_t n : test_counts(p))
    for (ReduceOp op : all_ops) {
      ++salt;
      std::vector<T> send(n);
      for (std::size_t i = 0; i < n; ++i) send[i] = value<T>(r, i, salt);
      const Block b = block_of(n, std::size_t(p), std::size_t(r));
      std::vector<T> recv(b.extent, T(99.0f));
      c.reduce_scatter(send, std::span<T>(recv), op);
      for (std::size_t i = 0; i < b.extent; ++i)
        ck.expect(close(recv[i], reference<T>(p, b.offset + i, op, salt)),
                  where<T>("reduce_scatter", r, p, n, b.offset + i), " op ", reduce_op_name(op));
      const int root = int(n % std::size_t(p));
      std::vector<T> out(r == root ? n : 0, T(99.0f));
      c.reduce(send, std::span<T>(out), op, root);
      if (r == root)
        for (std::size_t i = 0; i < n; ++i)
          ck.expect(close(out[i], reference<T>(p, i, op, salt)), where<T>("reduce", r, p, n, i), " op ",
                    reduce_op_name(op));
    }
}

template <class T, class Comm>
void check_data_movement(Comm& c, Checker& ck) {
  const int p = c.size(), r = c.rank();
  const auto P = std::size_t(p);
  int salt = 200;
  for (std::size_t n : test_counts(p)) {
    ++salt;
    const Block b = block_of(n, P, std::size_t(r));
    // all_gather, out of place and in place (send is this rank's block of recv)
    std::vector<T> mine(b.extent), all(n, T(99.0f));
    for (std::size_t i = 0; i < b.extent; ++i) mine[i] = value<T>(0, b.offset + i, salt);
    c.all_gather(mine, std::span<T>(all));
    for (std::size_t i = 0; i < n; ++i) ck.expect(all[i] == value<T>(0, i, salt), where<T>("all_gather", r, p, n, i));
    std::vector<T> inplace(n, T(99.0f));
    std::copy(mine.begin(), mine.end(), inplace.begin() + std::ptrdiff_t(b.offset));
    c.all_gather(std::span<const T>(inplace).subspan(b.offset, b.extent), std::span<T>(inplace));
    for (std::size_t i = 0; i < n; ++i)
      ck.expect(inplace[i] == value<T>(0, i, salt), where<T>("all_gather in place", r, p, n, i));
    // broadcast from the first, a middle and the last root
    for (int root : {0, p / 2, p - 1}) {
      std::vector<T> buf(n);
      for (std::size_t i = 0; i < n; ++i) buf[i] = value<T>(r, i, salt);
      c.broadcast(std::span<T>(buf), root);
      for (std::size_t i = 0; i < n; ++i)
        ck.expect(buf[i] == value<T>(root, i, salt), where<T>("broadcast", r, p, n, i), " root ", root);
    }
    // gather / scatter with the last rank as root
    const int root = p - 1;
    std::vector<T> gathered(r == root ? n : 0, T(99.0f));
    c.gather(mine, std::span<T>(gathered), root);
    if (r == root)
      for (std::size_t i = 0; i < n; ++i)
        ck.expect(gathered[i] == value<T>(0, i, salt), where<T>("gather", r, p, n, i));
    std::vector<T> full(r == root ? n : 0), part(b.extent, T(99.0f));
    for (std::size_t i = 0; i < full.size(); ++i) full[i] = value<T>(5, i, salt);
    c.scatter(full, std::span<T>(part), root);
    for (std::size_t i = 0; i < b.extent; ++i)
      ck.expect(part[i] == value<T>(5, b.offset + i, salt), where<T>("scatter", r, p, n, b.offset + i));
    // all_to_all with equal blocks of n/p (rounded down) elements
    const std::size_t blk = n / P;
    std::vector<T> a2a_send(blk * P), a2a_recv(blk * P, T(99.0f));
    for (std::size_t i = 0; i < a2a_send.size(); ++i) a2a_send[i] = value<T>(r, i, salt);
    c.all_to_all(a2a_send, std::span<T>(a2a_recv));
    for (int q = 0; q < p; ++q)
      for (std::size_t j = 0; j < blk; ++j)
        ck.expect(a2a_recv[std::size_t(q) * blk + j] == value<T>(q, std::size_t(r) * blk + j, salt),
                  where<T>("all_to_all", r, p, n, std::size_t(q) * blk + j));
    // all_to_all_v: rank r sends (r + q + n) % 4 elements to rank q
    std::vector<std::size_t> sc(P), rc(P);
    for (int q = 0; q < p; ++q) {
      sc[std::size_t(q)] = std::size_t(r + q + int(n)) % 4;
      rc[std::size_t(q)] = std::size_t(q + r + int(n)) % 4;
    }
    std::size_t stot = 0, rtot = 0;
    for (int q = 0; q < p; ++q) stot += sc[std::size_t(q)], rtot += rc[std::size_t(q)];
    std::vector<T> vs(stot), vr(rtot, T(99.0f));
    // element j of the segment for rank q encodes (sender r, receiver q, j)
    for (std::size_t off = 0, q = 0; q < P; off += sc[q], ++q)
      for (std::size_t j = 0; j < sc[q]; ++j) vs[off + j] = T(float(r * 16 + int(q) * 4 + int(j)));
    c.all_to_all_v(vs, std::span<const std::size_t>(sc), std::span<T>(vr), std::span<const std::size_t>(rc));
    for (std::size_t off = 0, q = 0; q < P; off += rc[q], ++q)
      for (std::size_t j = 0; j < rc[q]; ++j)
        ck.expect(vr[off + j] == T(float(int(q) * 16 + r * 4 + int(j))), where<T>("all_to_all_v", r, p, n, off + j));
  }
}

template <class T, class Comm>
void check_point_to_point(Comm& c, Checker& ck) {
  const int p = c.size(), r = c.rank();
  if (p < 2) return;
  const int next = (r + 1) % p, prev = (r + p - 1) % p;
  // Everybody sends first: eager/buffered sends must not deadlock.
  for (std::size_t n : {std::size_t(0), std::size_t(3), std::size_t(70000)}) {
    std::vector<T> out(n), in(n, T(99.0f));
    for (std::size_t i = 0; i < n; ++i) out[i] = value<T>(r, i, 7);
    c.send(std::span<const T>(out), next, 11);
    c.recv(std::span<T>(in), prev, 11);
    for (std::size_t i = 0; i < n; ++i)
      ck.expect(in[i] == value<T>(prev, i, 7), where<T>("send/recv ring", r, p, n, i));
  }
  // Tags select among messages from the same peer; receives posted before the sends.
  std::vector<T> a(5), b(6), x(5), y(6);
  for (std::size_t i = 0; i < 5; ++i) x[i] = value<T>(r, i, 1);
  for (std::size_t i = 0; i < 6; ++i) y[i] = value<T>(r, i, 2);
  auto rb = c.irecv(std::span<T>(b), prev, 2);
  auto ra = c.irecv(std::span<T>(a), prev, 1);
  auto sa = c.isend(std::span<const T>(x), next, 1);
  auto sb = c.isend(std::span<const T>(y), next, 2);
  ra.wait();
  rb.wait();
  sa.wait();
  sb.wait();
  ck.expect(ra.test() && rb.test(), "irecv: test() false after wait()");
  for (std::size_t i = 0; i < 5; ++i) ck.expect(a[i] == value<T>(prev, i, 1), where<T>("irecv tag 1", r, p, 5, i));
  for (std::size_t i = 0; i < 6; ++i) ck.expect(b[i] == value<T>(prev, i, 2), where<T>("irecv tag 2", r, p, 6, i));
}

template <class T, class Comm>
void check_async(Comm& c, Checker& ck) {
  const int p = c.size(), r = c.rank();
  const std::size_t n = 100003;
  std::vector<T> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = value<T>(r, i, 3);
  auto req = c.iall_reduce(std::span<T>(x), ReduceOp::sum);
  const Block b = block_of(n, std::size_t(p), std::size_t(r));
  std::vector<T> mine(b.extent), all(n), part(b.extent);
  for (std::size_t i = 0; i < b.extent; ++i) mine[i] = value<T>(1, b.offset + i, 4);
  std::vector<T> src(n);
  for (std::size_t i = 0; i < n; ++i) src[i] = value<T>(r, i, 5);
  auto g = c.iall_gather(mine, std::span<T>(all));
  auto rs = c.ireduce_scatter(src, std::span<T>(part), ReduceOp::max);
  (void)req.test();
  req.wait();
  g.wait();
  rs.wait();
  ck.expect(req.test() && g.test() && rs.test(), "async: test() false after wait()");
  for (std::size_t i = 0; i < n; i += 97)
    ck.expect(close(x[i], reference<T>(p, i, ReduceOp::sum, 3)), where<T>("iall_reduce", r, p, n, i));
  for (std::size_t i = 0; i < n; i += 97) ck.expect(all[i] == value<T>(1, i, 4), where<T>("iall_gather", r, p, n, i));
  for (std::size_t i = 0; i < b.extent; ++i)
    ck.expect(close(part[i], reference<T>(p, b.offset + i, ReduceOp::max, 5)), where<T>("ireduce_scatter", r, p, n, i));
  // A blocking collective may be issued while an asynchronous one is in flight (issue order).
  std::vector<T> y(7, T(1.0f)), z(5, T(2.0f));
  auto r2 = c.iall_reduce(std::span<T>(y), ReduceOp::sum);
  c.all_reduce(std::span<T>(z), ReduceOp::sum);
  r2.wait();
  ck.expect(float(y[0]) == float(p) && float(z[4]) == float(2 * p), "async then blocking: got ", float(y[0]), ", ",
            float(z[4]));
}

template <class Comm>
void check_split(Comm& c, Checker& ck) {
  const int p = c.size(), r = c.rank();
  // Two colors; keys reverse the order inside each group.
  Comm sub = c.split(r % 2, -r);
  std::vector<int> members;
  for (int q = r % 2; q < p; q += 2) members.push_back(q);
  std::reverse(members.begin(), members.end());
  const int want_rank = int(std::find(members.begin(), members.end(), r) - members.begin());
  ck.expect(sub.size() == int(members.size()), "split: size ", sub.size(), ", want ", members.size());
  ck.expect(sub.rank() == want_rank, "split: rank ", sub.rank(), ", want ", want_rank);
  std::vector<double> v{double(r), 1.0};
  sub.all_reduce(std::span<double>(v), ReduceOp::sum);
  double want = 0;
  for (int q : members) want += q;
  ck.expect(v[0] == want && v[1] == double(members.size()), "split all_reduce: got ", v[0], ", want ", want);
  // Groups are independent: the parent still works, and a split of a split too.
  Comm subsub = sub.split(0, sub.rank());
  std::vector<float> w{1.0f};
  subsub.all_reduce(std::span<float>(w), ReduceOp::sum);
  c.all_reduce(std::span<float>(w), ReduceOp::sum);
  float want_w = 0;  // every rank contributes the size of its own group
  for (int q = 0; q < p; ++q) want_w += float(q % 2 == 0 ? (p + 1) / 2 : p / 2);
  ck.expect(w[0] == want_w, "split of split: got ", w[0]);
}

template <class Comm>
void check_mesh_comms(Comm& world, Checker& ck, std::size_t tp, std::size_t pp, std::size_t dp) {
  DynamicMesh mesh(tp, pp, dp, std::size_t(1));
  auto mc = make_mesh_comms(world, mesh);
  const MeshCoord co = mesh.coord(std::size_t(world.rank()));
  ck.expect(mc.tensor.size() == int(tp) && mc.tensor.rank() == int(co.tensor), "mesh tensor group: size ",
            mc.tensor.size(), " rank ", mc.tensor.rank());
  ck.expect(mc.pipeline.size() == int(pp) && mc.pipeline.rank() == int(co.pipeline), "mesh pipeline group");
  ck.expect(mc.data.size() == int(dp) && mc.data.rank() == int(co.data), "mesh data group");
  ck.expect(mc.expert.size() == 1 && mc.expert.rank() == 0, "mesh expert group");
  ck.expect(mc.world.size() == world.size() && mc.world.rank() == world.rank(), "mesh world");
  // The sum of world ranks over each axis group equals the sum over the expected members.
  for (MeshAxis a : {MeshAxis::tensor, MeshAxis::pipeline, MeshAxis::data}) {
    std::vector<double> v{double(world.rank())};
    mc.axis(a).all_reduce(std::span<double>(v), ReduceOp::sum);
    double want = 0;
    for (std::size_t k = 0; k < mesh.size(a); ++k) {
      MeshCoord m = co;
      (a == MeshAxis::tensor ? m.tensor : a == MeshAxis::pipeline ? m.pipeline : m.data) = k;
      want += double(mesh.rank(m));
    }
    ck.expect(v[0] == want, "mesh ", axis_name(a), " all_reduce: got ", v[0], ", want ", want);
  }
}

/**
 * Integer elements whose floating-point round trip is lossy: int64 beyond 2^53 with odd low bits and both
 * signs, int32 beyond 2^24 and negative, uint32 and uint64 near the top of their range (sums wrap). Values stay
 * small enough that a signed sum over 8 ranks does not overflow.
 */
template <class T>
T int_value(int rank, std::size_t i, int salt) {
  const auto k = std::uint64_t(rank) * 1000003u + std::uint64_t(i) * 7919u + std::uint64_t(salt) * 131u;
  const bool negative = (i + std::size_t(rank)) % 3 == 1;
  if constexpr (std::is_same_v<T, std::int64_t>) {
    const std::int64_t m = (std::int64_t(1) << 58) + std::int64_t(2 * (k % 100000) + 1);
    return negative ? -m : m;
  } else if constexpr (std::is_same_v<T, std::int32_t>) {
    const std::int32_t m = (std::int32_t(1) << 26) + std::int32_t(2 * (k % 100000) + 1);
    return negative ? -m : m;
  } else if constexpr (std::is_same_v<T, std::uint64_t>) {
    return ~std::uint64_t(0) - 2 * k;
  } else {
    return ~std::uint32_t(0) - std::uint32_t(2 * (k % 1000000));
  }
}

/** The plain loop: op over ranks 0..p-1 in the integer type itself (unsigned sums wrap). */
template <class T>
T int_reference(int p, std::size_t i, ReduceOp op, int salt) {
  T acc = int_value<T>(0, i, salt);
  for (int q = 1; q < p; ++q) {
    const T v = int_value<T>(q, i, salt);
    acc = op == ReduceOp::max ? std::max(acc, v) : op == ReduceOp::min ? std::min(acc, v) : T(acc + v);
  }
  return acc;
}

template <class T, class Comm>
void check_integer_type(Comm& c, Checker& ck) {
  const int p = c.size(), r = c.rank();
  const auto P = std::size_t(p);
  const auto name = detail::comm_dtype_name_v<T>;
  auto at = [&](const char* op, std::size_t n, std::size_t i) {
    return detail::cat(op, "<", name, ">: rank ", r, " of ", p, ", n=", n, ", element ", i);
  };
  auto owner = [&](std::size_t n, std::size_t i) {  // the rank whose block of n elements holds element i
    int q = 0;
    while (block_of(n, P, std::size_t(q)).offset + block_of(n, P, std::size_t(q)).extent <= i) ++q;
    return q;
  };
  int salt = 300;
  for (std::size_t n : {std::size_t(0), std::size_t(1), P + 1, std::size_t(1031)})
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min}) {
      ++salt;
      std::vector<T> buf(n), send(n);
      for (std::size_t i = 0; i < n; ++i) buf[i] = send[i] = int_value<T>(r, i, salt);
      c.all_reduce(std::span<T>(buf), op);
      for (std::size_t i = 0; i < n; ++i)
        ck.expect(buf[i] == int_reference<T>(p, i, op, salt), at("all_reduce", n, i), " op ", reduce_op_name(op),
                  ": got ", buf[i], ", want ", int_reference<T>(p, i, op, salt));
      const Block b = block_of(n, P, std::size_t(r));
      std::vector<T> part(b.extent, T(7));
      c.reduce_scatter(std::span<const T>(send), std::span<T>(part), op);
      for (std::size_t i = 0; i < b.extent; ++i)
        ck.expect(part[i] == int_reference<T>(p, b.offset + i, op, salt), at("reduce_scatter", n, b.offset + i), " op ",
                  reduce_op_name(op), ": got ", part[i]);
      const int root = int(n % P);
      std::vector<T> out(r == root ? n : 0, T(7));
      c.reduce(std::span<const T>(send), std::span<T>(out), op, root);
      for (std::size_t i = 0; i < out.size(); ++i)
        ck.expect(out[i] == int_reference<T>(p, i, op, salt), at("reduce", n, i), " op ", reduce_op_name(op));
      // Data movement of the same values: every bit must arrive.
      std::vector<T> all(n, T(7));
      c.all_gather(std::span<const T>(send).subspan(b.offset, b.extent), std::span<T>(all));
      for (std::size_t i = 0; i < n; ++i)
        ck.expect(all[i] == int_value<T>(owner(n, i), i, salt), at("all_gather", n, i), ": got ", all[i]);
      std::vector<T> bc(n);
      for (std::size_t i = 0; i < n; ++i) bc[i] = int_value<T>(r, i, salt + 1);
      c.broadcast(std::span<T>(bc), p - 1);
      for (std::size_t i = 0; i < n; ++i)
        ck.expect(bc[i] == int_value<T>(p - 1, i, salt + 1), at("broadcast", n, i), ": got ", bc[i]);
      std::vector<T> gathered(r == 0 ? n : 0, T(7)), scattered(b.extent, T(7));
      c.gather(std::span<const T>(send).subspan(b.offset, b.extent), std::span<T>(gathered), 0);
      for (std::size_t i = 0; i < gathered.size(); ++i)
        ck.expect(gathered[i] == int_value<T>(owner(n, i), i, salt), at("gather", n, i), ": got ", gathered[i]);
      c.scatter(std::span<const T>(r == 0 ? bc : std::vector<T>{}), std::span<T>(scattered), 0);
      for (std::size_t i = 0; i < b.extent; ++i)
        ck.expect(scattered[i] == int_value<T>(p - 1, b.offset + i, salt + 1), at("scatter", n, b.offset + i));
      const std::size_t blk = n / P;
      std::vector<T> a2a(blk * P), a2a_out(blk * P, T(7));
      for (std::size_t i = 0; i < a2a.size(); ++i) a2a[i] = int_value<T>(r, i, salt);
      c.all_to_all(std::span<const T>(a2a), std::span<T>(a2a_out));
      for (std::size_t q = 0; q < P; ++q)
        for (std::size_t j = 0; j < blk; ++j)
          ck.expect(a2a_out[q * blk + j] == int_value<T>(int(q), std::size_t(r) * blk + j, salt),
                    at("all_to_all", n, q * blk + j));
    }
  // Point to point, every rank sending first, and the asynchronous collectives.
  if (p > 1) {
    const int next = (r + 1) % p, prev = (r + p - 1) % p;
    std::vector<T> out(70), in(70, T(7));
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = int_value<T>(r, i, 9);
    c.send(std::span<const T>(out), next, 21);
    c.recv(std::span<T>(in), prev, 21);
    for (std::size_t i = 0; i < in.size(); ++i)
      ck.expect(in[i] == int_value<T>(prev, i, 9), at("send/recv", in.size(), i), ": got ", in[i]);
  }
  std::vector<T> x(257), src(257), part(block_of(257, P, std::size_t(r)).extent);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = src[i] = int_value<T>(r, i, 10);
  auto a = c.iall_reduce(std::span<T>(x), ReduceOp::sum);
  auto rs = c.ireduce_scatter(std::span<const T>(src), std::span<T>(part), ReduceOp::min);
  a.wait();
  rs.wait();
  for (std::size_t i = 0; i < x.size(); ++i)
    ck.expect(x[i] == int_reference<T>(p, i, ReduceOp::sum, 10), at("iall_reduce", x.size(), i));
  const Block pb = block_of(257, P, std::size_t(r));
  for (std::size_t i = 0; i < pb.extent; ++i)
    ck.expect(part[i] == int_reference<T>(p, pb.offset + i, ReduceOp::min, 10),
              at("ireduce_scatter", 257, pb.offset + i));
}

/** Every collective and point-to-point call on std::int32_t, std::int64_t, std::uint32_t and std::uint64_t. */
template <class Comm>
void check_integers(Comm& c, Checker& ck) {
  check_integer_type<std::int64_t>(c, ck);
  check_integer_type<std::int32_t>(c, ck);
  check_integer_type<std::uint64_t>(c, ck);
  check_integer_type<std::uint32_t>(c, ck);
}

template <class Comm>
void check_everything(Comm& c, Checker& ck) {
  check_all_reduce<float>(c, ck);
  check_all_reduce<double>(c, ck);
  check_all_reduce<bf16>(c, ck);
  check_all_reduce<f16>(c, ck);
  check_reduce_scatter_and_reduce<float>(c, ck);
  check_reduce_scatter_and_reduce<double>(c, ck);
  check_reduce_scatter_and_reduce<bf16>(c, ck);
  check_reduce_scatter_and_reduce<f16>(c, ck);
  check_data_movement<float>(c, ck);
  check_data_movement<double>(c, ck);
  check_data_movement<bf16>(c, ck);
  check_data_movement<f16>(c, ck);
  check_point_to_point<float>(c, ck);
  check_point_to_point<bf16>(c, ck);
  check_async<float>(c, ck);
  check_async<f16>(c, ck);
  check_integers(c, ck);
  check_split(c, ck);
  c.barrier();
}

}  // namespace mpar::test
