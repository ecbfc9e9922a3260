#pragma once
/**
 * @file `TokenFile`: a pre-tokenised corpus, memory-mapped, as a `token_source`.
 *
 * Two formats, recognised by their first bytes:
 * - llm.c's `.bin`: a header of 256 little-endian int32 — `[0]` magic 20240520, `[1]` version
 *   (1: uint16 tokens, as GPT-2's tokenizer writes; 2: uint32 tokens), `[2]` token count — then the
 *   tokens, little-endian. The file must hold exactly 1024 + count × width bytes.
 * - NumPy `.npy` (format 1.0, 2.0 or 3.0): a one-dimensional C-order array of dtype `<u2` or `<u4`.
 *
 * Opening checks the header, the size and every token id against the vocabulary, computing the
 * fingerprint on the way (one sequential pass); each fault is a `config_error` naming the file and the
 * byte offset. Batches are then drawn with the common sampler (sampler.hpp) straight from the mapping.
 */
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "mpar/core/error.hpp"
#include "mpar/data/fingerprint.hpp"
#include "mpar/data/mapped_file.hpp"
#include "mpar/data/sampler.hpp"
#include "mpar/data/token_batch.hpp"

namespace mpar::data {

/** @brief The constants of llm.c's token file format. */
struct LlmcFormat {
  static constexpr std::int32_t magic = 20240520;
  static constexpr std::size_t header_ints = 256, header_bytes = header_ints * 4;
};

namespace detail {
[[nodiscard]] inline std::uint32_t load_le(const unsigned char* p, std::size_t width) {
  std::uint32_t v = 0;
  for (std::size_t i = 0; i < width; ++i) v |= std::uint32_t(p[i]) << (8 * i);
  return v;
}

/** Reads `key: value` out of a .npy header dictionary (a Python literal); empty when absent. */
[[nodiscard]] inline std::string_view npy_field(std::string_view dict, std::string_view key) {
  const std::string quoted = "'" + std::string(key) + "'";
  const auto k = dict.find(quoted);
  if (k == std::string_view::npos) return {};
  auto p = dict.find(':', k + quoted.size());
  if (p == std::string_view::npos) return {};
  ++p;
  while (p < dict.size() && dict[p] == ' ') ++p;
  std::size_t e = p;
  if (p < dict.size() && dict[p] == '(')
    e = dict.find(')', p) + 1;
  else if (p < dict.size() && dict[p] == '\'')
    e = dict.find('\'', p + 1) + 1;
  else
    while (e < dict.size() && dict[e] != ',' && dict[e] != '}') ++e;
  if (e == 0 || e > dict.size()) return {};
  return dict.substr(p, e - p);
}
}  // namespace detail

/** @brief A memory-mapped token file (llm.c `.bin` or `.npy`) whose ids are all below `vocab`. */
class TokenFile {
 public:
  /** Opens and checks `path`; `seq` is the sequence length batches will have. */
  TokenFile(const std::string& path, std::size_t vocab, std::size_t seq) : file_(path), vocab_(vocab), seq_(seq) {
    require(vocab > 0, "token file '", path, "': the vocabulary size must be positive (pass --vocab)");
    const unsigned char* d = file_.data();
    const std::size_t n = file_.size();
    static constexpr std::string_view npy_magic("\x93NUMPY", 6);
    if (n >= 6 && std::memcmp(d, npy_magic.data(), 6) == 0)
      open_npy();
    else
      open_llmc();
    fp_.vocab = vocab_;
    for (std::size_t i = 0; i < count_; ++i) {
      const std::uint32_t id = at_unchecked(i);
      if (id >= vocab_)
        require(false, "token file '", path, "': token ", id, " at byte offset ", offset_ + i * width_,
                " (token index ", i, ") is not below the vocabulary size ", vocab_,
                "; pass the tokenizer's --vocab (GPT-2: 50257)");
      fp_.add(id);
    }
    require(count_ > seq_ + 1, "token file '", path, "' holds ", count_, " tokens, too few for sequences of ", seq_,
            " (each sample needs seq + 1); use a shorter --seq or a longer file");
  }

  [[nodiscard]] std::size_t vocab_size() const { return vocab_; }
  [[nodiscard]] std::size_t size() const { return count_; }
  [[nodiscard]] std::size_t token_bytes() const { return width_; }
  [[nodiscard]] const std::string& path() const { return file_.path(); }
  [[nodiscard]] std::string_view format() const { return npy_ ? "npy" : "llm.c bin"; }
  /** Token `i` (bounds-checked). */
  [[nodiscard]] std::int32_t operator[](std::size_t i) const {
    require(i < count_, "token file '", path(), "': token index ", i, " is past its ", count_, " tokens");
    return std::int32_t(at_unchecked(i));
  }
  [[nodiscard]] DataFingerprint fingerprint() const { return fp_; }
  [[nodiscard]] std::string describe() const {
    return "'" + path() + "' (" + std::string(format()) + ", " + std::to_string(count_) + " tokens of " +
           std::to_string(width_ * 8) + " bits)";
  }
  [[nodiscard]] TokenBatch batch(std::uint64_t seed, std::uint64_t step, std::size_t global_batch,
                                 std::size_t dp_size = 1, std::size_t dp_rank = 0) const {
    return fill_batch([this](std::size_t i) { return std::int32_t(at_unchecked(i)); }, count_, seq_, seed, step,
                      global_batch, dp_size, dp_rank);
  }

 private:
  [[nodiscard]] std::uint32_t at_unchecked(std::size_t i) const {
    return detail::load_le(file_.data() + offset_ + i * width_, width_);
  }
  void check_size(std::size_t expected_count) {
    const std::size_t n = file_.size(), want = offset_ + expected_count * width_;
    require(n >= want, "token file '", path(), "' is short: its header promises ", expected_count, " tokens of ",
            width_, " bytes from byte offset ", offset_, " (", want, " bytes), but the file ends at byte offset ", n,
            "; it was truncated (tokenise again)");
    require(n == want, "token file '", path(), "': ", n - want,
            " unexpected bytes after the last token, from byte offset ", want, " (the header promises ", expected_count,
            " tokens)");
    count_ = expected_count;
  }
  void open_llmc() {
    const unsigned char* d = file_.data();
    const std::size_t n = file_.size();
    require(n >= LlmcFormat::header_bytes, "token file '", path(), "' is short: ", n,
            " bytes end inside the 1024-byte header of llm.c's .bin format (at byte offset ", n, ")");
    const auto word = [&](std::size_t i) { return std::int32_t(detail::load_le(d + 4 * i, 4)); };
    require(word(0) == LlmcFormat::magic, "token file '", path(), "': bad magic ", word(0),
            " at byte offset 0; llm.c's .bin format starts with ", LlmcFormat::magic,
            " (a .npy file starts with \\x93NUMPY); is it a token file?");
    const std::int32_t version = word(1);
    require(version == 1 || version == 2, "token file '", path(), "': unsupported version ", version,
            " at byte offset 4; llm.c's .bin format has version 1 (uint16 tokens) or 2 (uint32 tokens)");
    width_ = version == 1 ? 2 : 4;
    const std::int32_t count = word(2);
    require(count >= 0, "token file '", path(), "': negative token count ", count, " at byte offset 8");
    offset_ = LlmcFormat::header_bytes;
    check_size(std::size_t(count));
  }
  void open_npy() {
    npy_ = true;
    const unsigned char* d = file_.data();
    const std::size_t n = file_.size();
    require(n >= 10, "token file '", path(), "' is short: ", n, " bytes end inside the .npy preamble (at byte offset ",
            n, ")");
    const unsigned major = d[6];
    require(major >= 1 && major <= 3, "token file '", path(), "': unsupported .npy format version ", major,
            " at byte offset 6 (expected 1, 2 or 3)");
    const std::size_t len_bytes = major == 1 ? 2 : 4, start = 8 + len_bytes;
    require(n >= start, "token file '", path(), "' is short: the .npy header length ends past the file (byte offset ",
            n, ")");
    const std::size_t hlen = detail::load_le(d + 8, len_bytes);
    require(n >= start + hlen, "token file '", path(), "' is short: the .npy header of ", hlen,
            " bytes from byte offset ", start, " ends past the file end at byte offset ", n);
    const std::string_view dict(reinterpret_cast<const char*>(d + start), hlen);
    const auto descr = detail::npy_field(dict, "descr");
    if (descr == "'<u2'" || descr == "'|u2'")
      width_ = 2;
    else if (descr == "'<u4'" || descr == "'|u4'")
      width_ = 4;
    else
      require(false, "token file '", path(), "': .npy dtype ", descr.empty() ? std::string_view("(none)") : descr,
              " in the header at byte offset ", start,
              " is not a token dtype; save the array as numpy.uint16 or "
              "numpy.uint32 (little-endian)");
    require(detail::npy_field(dict, "fortran_order") == "False", "token file '", path(),
            "': the .npy header at byte offset ", start, " does not say fortran_order: False");
    const auto shape = detail::npy_field(dict, "shape");
    std::size_t count = 0, digits = 0;
    bool one_dim = shape.size() >= 3 && shape.front() == '(' && shape.back() == ')';
    for (std::size_t i = 1; one_dim && i + 1 < shape.size(); ++i) {
      const char c = shape[i];
      if (c >= '0' && c <= '9') {
        if (digits < 19) count = count * 10 + std::size_t(c - '0');  // 19 digits fit 64 bits; more is checked below
        ++digits;
      } else if (c == ',') {
        for (std::size_t j = i + 1; j + 1 < shape.size(); ++j) one_dim = one_dim && shape[j] == ' ';
        break;
      } else if (c != ' ') {
        one_dim = false;
      }
    }
    require(one_dim && digits > 0, "token file '", path(), "': the .npy array at byte offset ", start, " has shape ",
            shape.empty() ? std::string_view("(none)") : shape, "; a token file is one-dimensional, e.g. (1000,)");
    require(digits <= 19, "token file '", path(), "': the .npy array at byte offset ", start, " has shape ", shape,
            ", a length of ", digits,
            " digits, more tokens than any file holds: the header is damaged; write the "
            "file again (numpy.save)");
    offset_ = start + hlen;
    check_size(count);
  }

  MappedFile file_;
  std::size_t vocab_, seq_;
  std::size_t offset_ = 0, width_ = 2, count_ = 0;
  bool npy_ = false;
  DataFingerprint fp_;
};

}  // namespace mpar::data
