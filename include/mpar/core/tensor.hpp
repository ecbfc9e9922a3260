#pragma once
/** @file The tensor concept, a non-owning strided view and an owning host tensor (rank 1-4). */
#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <initializer_list>
#include <ostream>
#include <span>
#include <type_traits>
#include <vector>

#include "mpar/core/dtype.hpp"
#include "mpar/core/error.hpp"
#include "mpar/core/extents.hpp"
#include "mpar/core/host_access.hpp"
#include "mpar/core/memory_resource.hpp"

namespace mpar {

template <std::size_t Rank>
using Shape = std::array<std::size_t, Rank>;

/**
 * @brief A tensor: element type, a rank, per-dimension extents, a data pointer and element access.
 *
 * Requirements: `T::value_type` is an element_type; `T::rank()` is a constant expression in [1, 4];
 * `t.extent(d)` and `t.stride(d)` give sizes and element strides; `t.data()` points at element (0,...);
 * `t(i...)` with `rank()` indices returns the element.
 */
template <class T>
concept tensor = requires(const T& t, std::size_t d) {
  typename T::value_type;
  requires detail::element_type<typename T::value_type>;
  { T::rank() } -> std::convertible_to<std::size_t>;
  requires(T::rank() >= 1 && T::rank() <= 4);
  { t.extent(d) } -> std::convertible_to<std::size_t>;
  { t.stride(d) } -> std::convertible_to<std::ptrdiff_t>;
  {t.data()};
  { t.size() } -> std::convertible_to<std::size_t>;
};

namespace detail {
template <std::size_t R>
constexpr std::array<std::ptrdiff_t, R> row_major_strides(const Shape<R>& s) {
  std::array<std::ptrdiff_t, R> st{};
  std::ptrdiff_t acc = 1;
  for (std::size_t d = R; d-- > 0;) {
    st[d] = acc;
    acc *= std::ptrdiff_t(s[d]);
  }
  return st;
}
template <std::size_t R>
constexpr std::size_t product(const Shape<R>& s) {
  std::size_t n = 1;
  for (auto e : s) n *= e;
  return n;
}
}  // namespace detail

/** @brief A non-owning strided view of `Rank` dimensions over elements of type `T` (may be const). */
template <class T, std::size_t Rank>
  requires(Rank >= 1 && Rank <= 4 && detail::element_type<std::remove_const_t<T>>)
class TensorView {
 public:
  using value_type = std::remove_const_t<T>;
  using element = T;

  TensorView() = default;
  TensorView(T* data, const Shape<Rank>& shape)
      : data_(data), shape_(shape), strides_(detail::row_major_strides(shape)) {}
  TensorView(T* data, const Shape<Rank>& shape, const std::array<std::ptrdiff_t, Rank>& strides)
      : data_(data), shape_(shape), strides_(strides) {}
  /** A view of non-const elements converts to a view of const ones. */
  template <class U>
    requires(std::is_const_v<T>&& std::is_same_v<U, value_type>)
  TensorView(const TensorView<U, Rank>& o) : data_(o.data()), shape_(o.shape()), strides_(o.strides()) {}

  [[nodiscard]] static constexpr std::size_t rank() { return Rank; }
  [[nodiscard]] std::size_t extent(std::size_t d) const { return shape_[d]; }
  [[nodiscard]] std::ptrdiff_t stride(std::size_t d) const { return strides_[d]; }
  [[nodiscard]] const Shape<Rank>& shape() const { return shape_; }
  [[nodiscard]] const std::array<std::ptrdiff_t, Rank>& strides() const { return strides_; }
  [[nodiscard]] std::size_t size() const { return detail::product(shape_); }
  [[nodiscard]] T* data() const { return data_; }
  [[nodiscard]] bool is_contiguous() const { return strides_ == detail::row_major_strides(shape_); }

  template <class... I>
    requires(sizeof...(I) == Rank && (std::is_integral_v<I> && ...))
  [[nodiscard]] T& operator()(I... idx) const {
    const std::array<std::size_t, Rank> i{std::size_t(idx)...};
    std::ptrdiff_t off = 0;
    for (std::size_t d = 0; d < Rank; ++d) off += std::ptrdiff_t(i[d]) * strides_[d];
    return data_[off];
  }

  /** @brief The sub-view `[begin, end)` along `dim`; other dimensions unchanged. */
  [[nodiscard]] TensorView slice(std::size_t dim, std::size_t begin, std::size_t end) const {
    require(dim < Rank && begin <= end && end <= shape_[dim], "TensorView::slice: range [", begin, ", ", end,
            ") along dimension ", dim, " is outside extent ", dim < Rank ? shape_[dim] : 0);
    Shape<Rank> s = shape_;
    s[dim] = end - begin;
    return TensorView(data_ + std::ptrdiff_t(begin) * strides_[dim], s, strides_);
  }

  /** @brief Contiguous elements as a span (only for contiguous views). */
  [[nodiscard]] std::span<T> span() const {
    require(is_contiguous(), "TensorView::span: the view is strided; copy it into a Tensor first");
    return {data_, size()};
  }

 private:
  T* data_ = nullptr;
  Shape<Rank> shape_{};
  std::array<std::ptrdiff_t, Rank> strides_{};
};

/**
 * @brief An owning, contiguous, row-major tensor in the creating thread's memory resource (host
 * memory unless the rank's backend installed another, see core/memory_resource.hpp).
 */
template <detail::element_type T, std::size_t Rank>
  requires(Rank >= 1 && Rank <= 4)
class Tensor {
 public:
  using value_type = T;

  Tensor() = default;
  /** Every element set to `fill` (zero by default) by the host. */
  explicit Tensor(const Shape<Rank>& shape, T fill = T{}) : shape_(shape), data_(detail::product(shape), fill) {
    note_host_access(bytes());
  }
  /**
   * Allocated, not initialised: for a tensor a backend operation overwrites whole before it is read
   * (a GEMM with beta = 0, an elementwise kernel, `B::zero`). The host never touches its memory.
   */
  Tensor(const Shape<Rank>& shape, uninitialized_t)
      : shape_(shape), data_(detail::product(shape), ResourceAllocator<T>(current_memory_resource(), uninitialized)) {}
  /** A copy is made by the host (it reads and writes every byte, counted by `host_access_bytes`). */
  Tensor(const Tensor& o) : shape_(o.shape_), data_(o.data_) { note_host_access(2 * bytes()); }
  Tensor& operator=(const Tensor& o) {
    if (this != &o) {
      shape_ = o.shape_;
      data_ = o.data_;
      note_host_access(2 * bytes());
    }
    return *this;
  }
  Tensor(Tensor&&) noexcept = default;
  Tensor& operator=(Tensor&&) noexcept = default;
  ~Tensor() = default;
  template <std::size_t... E>
    requires(sizeof...(E) == Rank)
  explicit Tensor(const Extents<E...>& e, T fill = T{}) : Tensor(e.to_array(), fill) {}
  Tensor(const Shape<Rank>& shape, const std::vector<T>& values) : shape_(shape), data_(values.begin(), values.end()) {
    check_value_count();
    note_host_access(bytes());
  }
  /** Takes over a buffer (no copy). */
  Tensor(const Shape<Rank>& shape, Buffer<T>&& values) : shape_(shape), data_(std::move(values)) {
    check_value_count();
  }
  /** Copies any view of the same rank (making strided data contiguous). */
  template <class U>
    requires std::is_same_v<std::remove_const_t<U>, T>
  explicit Tensor(const TensorView<U, Rank>& v) : Tensor(v.shape(), uninitialized) {
    copy_into(v, view());
    note_host_access(2 * bytes());
  }

  [[nodiscard]] static constexpr std::size_t rank() { return Rank; }
  [[nodiscard]] std::size_t extent(std::size_t d) const { return shape_[d]; }
  [[nodiscard]] std::ptrdiff_t stride(std::size_t d) const { return detail::row_major_strides(shape_)[d]; }
  [[nodiscard]] const Shape<Rank>& shape() const { return shape_; }
  [[nodiscard]] std::size_t size() const { return data_.size(); }
  [[nodiscard]] std::size_t bytes() const { return data_.size() * sizeof(T); }
  [[nodiscard]] T* data() { return data_.data(); }
  [[nodiscard]] const T* data() const { return data_.data(); }
  [[nodiscard]] std::span<T> span() { return data_; }
  [[nodiscard]] std::span<const T> span() const { return data_; }
  [[nodiscard]] Buffer<T>& values() { return data_; }
  [[nodiscard]] const Buffer<T>& values() const { return data_; }

  [[nodiscard]] TensorView<T, Rank> view() { return {data_.data(), shape_}; }
  [[nodiscard]] TensorView<const T, Rank> view() const { return {data_.data(), shape_}; }
  operator TensorView<T, Rank>() { return view(); }
  operator TensorView<const T, Rank>() const { return view(); }

  template <class... I>
    requires(sizeof...(I) == Rank && (std::is_integral_v<I> && ...))
  [[nodiscard]] T& operator()(I... idx) { return view()(idx...); }
  template <class... I>
    requires(sizeof...(I) == Rank && (std::is_integral_v<I> && ...))
  [[nodiscard]] const T& operator()(I... idx) const { return view()(idx...); }

  [[nodiscard]] TensorView<T, Rank> slice(std::size_t dim, std::size_t b, std::size_t e) {
    return view().slice(dim, b, e);
  }
  [[nodiscard]] TensorView<const T, Rank> slice(std::size_t dim, std::size_t b, std::size_t e) const {
    return view().slice(dim, b, e);
  }

  void fill(T v) {
    std::fill(data_.begin(), data_.end(), v);
    note_host_access(bytes());
  }

  /** Same elements, new shape of equal element count. */
  template <std::size_t R2>
  [[nodiscard]] Tensor<T, R2> reshaped(const Shape<R2>& s) const& {
    note_host_access(2 * bytes());
    return Tensor<T, R2>(s, Buffer<T>(data_));
  }

  friend bool operator==(const Tensor& a, const Tensor& b) { return a.shape_ == b.shape_ && a.data_ == b.data_; }

 private:
  void check_value_count() const {
    require(data_.size() == detail::product(shape_), "Tensor: ", data_.size(), " values given for a shape of ",
            detail::product(shape_), " elements");
  }
  Shape<Rank> shape_{};
  Buffer<T> data_;
};

/** @brief Element-wise copy between views of equal shape (any strides). */
template <class S, class D, std::size_t R>
void copy_into(const TensorView<S, R>& src, const TensorView<D, R>& dst) {
  require(src.shape() == dst.shape(), "copy_into: shapes differ");
  if constexpr (R == 1) {
    for (std::size_t i = 0; i < src.extent(0); ++i) dst(i) = convert<std::remove_const_t<D>>(src(i));
  } else {
    for (std::size_t i = 0; i < src.extent(0); ++i) {
      auto s = src.slice(0, i, i + 1);
      auto d = dst.slice(0, i, i + 1);
      // drop the unit leading dimension
      Shape<R - 1> ss{};
      std::array<std::ptrdiff_t, R - 1> sst{}, dst_st{};
      for (std::size_t k = 1; k < R; ++k) {
        ss[k - 1] = s.extent(k);
        sst[k - 1] = s.stride(k);
        dst_st[k - 1] = d.stride(k);
      }
      copy_into(TensorView<S, R - 1>(s.data(), ss, sst), TensorView<D, R - 1>(d.data(), ss, dst_st));
    }
  }
}

/** @brief Prints shape and elements (nested brackets, at most 6 per row), e.g. `Tensor f32 (2,3) [[1, 2, 3], ...]`. */
template <class T, std::size_t R>
std::ostream& operator<<(std::ostream& os, const TensorView<T, R>& v) {
  auto print_rec = [&](auto&& self, const auto& sub, auto rank_tag) -> void {
    constexpr std::size_t r = decltype(rank_tag)::value;
    os << '[';
    const std::size_t n = sub.extent(0), shown = std::min<std::size_t>(n, 6);
    for (std::size_t i = 0; i < shown; ++i) {
      if (i) os << ", ";
      if constexpr (r == 1) {
        os << static_cast<compute_type_t<std::remove_const_t<T>>>(sub(i));
      } else {
        auto row = sub.slice(0, i, i + 1);
        Shape<r - 1> s{};
        std::array<std::ptrdiff_t, r - 1> st{};
        for (std::size_t k = 1; k < r; ++k) {
          s[k - 1] = row.extent(k);
          st[k - 1] = row.stride(k);
        }
        self(self, TensorView<T, r - 1>(row.data(), s, st), std::integral_constant<std::size_t, r - 1>{});
      }
    }
    if (shown < n) os << ", ...";
    os << ']';
  };
  os << "Tensor " << dtype_name_v<std::remove_const_t<T>> << " (";
  for (std::size_t d = 0; d < R; ++d) os << (d ? "," : "") << v.extent(d);
  os << ") ";
  print_rec(print_rec, v, std::integral_constant<std::size_t, R>{});
  return os;
}
template <class T, std::size_t R>
std::ostream& operator<<(std::ostream& os, const Tensor<T, R>& t) {
  return os << t.view();
}

static_assert(tensor<Tensor<float, 2>>);
static_assert(tensor<TensorView<const bf16, 3>>);

}  // namespace mpar
