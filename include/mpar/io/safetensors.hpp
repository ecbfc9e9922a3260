#pragma once
/**
 * @file The safetensors format (Hugging Face): reading and writing named fp32 tensors.
 *
 * Layout: an 8-byte little-endian header length N, then N bytes of JSON — an object mapping each
 * tensor name to `{"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}`, plus an optional
 * `"__metadata__"` object of strings — padded with spaces, then the data buffer: each tensor's
 * row-major little-endian bytes at `[begin, end)` relative to the buffer's start.
 *
 * The JSON is written and parsed here, minimal and strict: objects, arrays, strings and non-negative
 * integers only; a duplicate key, a missing field, a dtype other than F32/F16/BF16, a byte count that
 * does not match the shape, offsets outside the buffer, overlapping tensors or a gap between them are
 * `safetensors_error`s naming the file and the tensor. F16 and BF16 tensors are widened to fp32 on
 * read; writes are F32.
 */
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mpar/core/dtype.hpp"
#include "mpar/core/error.hpp"
#include "mpar/core/json_escapes.hpp"

namespace mpar::io {

/** @brief A malformed or unreadable safetensors file; the message names the file and what is wrong. */
class safetensors_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/** @brief A tensor to write: name, shape, row-major fp32 values. */
struct NamedTensor {
  std::string name;
  std::vector<std::size_t> shape;
  std::span<const float> values;
};

/** @brief A tensor's entry in a safetensors header. */
struct SafetensorsEntry {
  std::string name, dtype;
  std::vector<std::size_t> shape;
  std::size_t begin = 0, end = 0;  ///< byte range in the data buffer
  [[nodiscard]] std::size_t elements() const {
    std::size_t n = 1;
    for (auto e : shape) n *= e;
    return n;
  }
};

namespace detail::st {

template <class... P>
[[noreturn]] void fail(P&&... parts) {
  throw safetensors_error(mpar::detail::cat(std::forward<P>(parts)...));
}

inline std::size_t dtype_bytes(std::string_view d) {
  if (d == "F32") return 4;
  if (d == "F16" || d == "BF16") return 2;
  return 0;
}

inline void json_string(std::string& out, std::string_view s) {
  out += '"';
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", u);
      out += buf;
    } else {
      out += c;
    }
  }
  out += '"';
}

/** A JSON value of the subset safetensors headers use. */
struct Json {
  enum class Kind { object, array, string, integer } kind = Kind::integer;
  std::vector<std::pair<std::string, Json>> members;  // object, in file order
  std::vector<Json> items;                            // array
  std::string text;                                   // string
  std::uint64_t number = 0;                           // integer
};

/** A strict recursive-descent parser; `where` names the file in messages. */
class Parser {
 public:
  Parser(std::string_view s, std::string where) : s_(s), where_(std::move(where)) {}
  Json document() {
    Json v = value(0);
    skip();
    if (p_ != s_.size()) fail(where_, ": unexpected '", s_[p_], "' after the JSON header at header byte ", p_);
    return v;
  }

 private:
  void skip() {
    while (p_ < s_.size() && (s_[p_] == ' ' || s_[p_] == '\n' || s_[p_] == '\r' || s_[p_] == '\t')) ++p_;
  }
  char peek() {
    skip();
    if (p_ >= s_.size()) fail(where_, ": the JSON header ends early (at header byte ", p_, ")");
    return s_[p_];
  }
  void expect(char c) {
    if (peek() != c)
      fail(where_, ": bad JSON header: expected '", c, "' at header byte ", p_, ", found '", s_[p_], "'");
    ++p_;
  }
  Json value(int depth) {
    if (depth > 8) fail(where_, ": the JSON header nests too deeply (at header byte ", p_, ")");
    const char c = peek();
    if (c == '{') return object(depth);
    if (c == '[') return array(depth);
    if (c == '"') {
      Json v;
      v.kind = Json::Kind::string;
      v.text = string();
      return v;
    }
    if (c >= '0' && c <= '9') return integer();
    fail(where_, ": bad JSON header: unexpected '", c, "' at header byte ", p_,
         " (a safetensors header holds objects, arrays, strings and non-negative integers)");
  }
  Json object(int depth) {
    Json v;
    v.kind = Json::Kind::object;
    expect('{');
    if (peek() == '}') {
      ++p_;
      return v;
    }
    for (;;) {
      if (peek() != '"') fail(where_, ": bad JSON header: expected a key at header byte ", p_);
      std::string key = string();
      for (const auto& m : v.members)
        if (m.first == key) fail(where_, ": the JSON header has the key \"", key, "\" twice");
      expect(':');
      v.members.emplace_back(std::move(key), value(depth + 1));
      if (peek() == ',') {
        ++p_;
        continue;
      }
      expect('}');
      return v;
    }
  }
  Json array(int depth) {
    Json v;
    v.kind = Json::Kind::array;
    expect('[');
    if (peek() == ']') {
      ++p_;
      return v;
    }
    for (;;) {
      v.items.push_back(value(depth + 1));
      if (peek() == ',') {
        ++p_;
        continue;
      }
      expect(']');
      return v;
    }
  }
  Json integer() {
    Json v;
    v.kind = Json::Kind::integer;
    const std::size_t start = p_;
    if (s_[p_] == '0' && p_ + 1 < s_.size() && s_[p_ + 1] >= '0' && s_[p_ + 1] <= '9')
      fail(where_, ": bad JSON header: a number with a leading zero at header byte ", p_);
    while (p_ < s_.size() && s_[p_] >= '0' && s_[p_] <= '9') {
      if (v.number > (UINT64_MAX - 9) / 10)
        fail(where_, ": a number in the JSON header at header byte ", start, " is too large");
      v.number = v.number * 10 + std::uint64_t(s_[p_++] - '0');
    }
    if (p_ < s_.size() && (s_[p_] == '.' || s_[p_] == 'e' || s_[p_] == 'E'))
      fail(where_, ": bad JSON header: a non-integer number at header byte ", start);
    return v;
  }
  std::string string() {
    expect('"');
    std::string out;
    for (;;) {
      if (p_ >= s_.size()) fail(where_, ": bad JSON header: a string is not closed");
      const char c = s_[p_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20)
        fail(where_, ": bad JSON header: a control character in a string at header byte ", p_ - 1);
      if (c != '\\') {
        out += c;
        continue;
      }
      if (p_ >= s_.size()) fail(where_, ": bad JSON header: a string ends in an escape");
      const char e = s_[p_++];
      if (const auto unescaped = mpar::detail::json_simple_escape(e)) {
        out += *unescaped;
        continue;
      }
      if (e != 'u') fail(where_, ": bad JSON header: unknown escape \\", e, " at header byte ", p_ - 1);
      if (p_ + 4 > s_.size()) fail(where_, ": bad JSON header: a short \\u escape");
      unsigned cp = 0;
      for (int i = 0; i < 4; ++i) {
        const int digit = mpar::detail::json_hex_digit(s_[p_++]);
        if (digit < 0) fail(where_, ": bad JSON header: a bad \\u escape");
        cp = cp * 16 + unsigned(digit);
      }
      if (cp >= 0xd800 && cp < 0xe000) fail(where_, ": a surrogate \\u escape in the JSON header is not supported");
      mpar::detail::append_utf8(out, cp);
    }
  }
  std::string_view s_;
  std::string where_;
  std::size_t p_ = 0;
};

}  // namespace detail::st

/**
 * @brief Writes `tensors` (F32, in the given order, contiguous) and `metadata` to `path` atomically
 * (a temporary file renamed into place). Names must be unique and non-empty.
 */
inline void write_safetensors(const std::filesystem::path& path, std::span<const NamedTensor> tensors,
                              const std::map<std::string, std::string>& metadata = {}) {
  using detail::st::json_string;
  std::string h = "{";
  bool first = true;
  if (!metadata.empty()) {
    h += "\"__metadata__\":{";
    for (auto it = metadata.begin(); it != metadata.end(); ++it) {
      if (it != metadata.begin()) h += ',';
      json_string(h, it->first);
      h += ':';
      json_string(h, it->second);
    }
    h += '}';
    first = false;
  }
  std::size_t offset = 0;
  std::vector<std::string_view> seen;
  for (const auto& t : tensors) {
    std::size_t n = 1;
    for (auto e : t.shape) n *= e;
    if (t.name.empty() || t.name == "__metadata__" || std::find(seen.begin(), seen.end(), t.name) != seen.end())
      detail::st::fail("safetensors ", path.string(), ": tensor name '", t.name, "' is empty, reserved or repeated");
    if (n != t.values.size())
      detail::st::fail("safetensors ", path.string(), ": tensor '", t.name, "' has ", t.values.size(),
                       " values for a shape of ", n, " elements");
    seen.push_back(t.name);
    if (!first) h += ',';
    first = false;
    json_string(h, t.name);
    h += ":{\"dtype\":\"F32\",\"shape\":[";
    for (std::size_t i = 0; i < t.shape.size(); ++i) h += (i ? "," : "") + std::to_string(t.shape[i]);
    h += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + 4 * n) + "]}";
    offset += 4 * n;
  }
  h += '}';
  while (h.size() % 8 != 0) h += ' ';  // the buffer starts 8-byte aligned
  const std::filesystem::path tmp = path.string() + ".partial";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    require(bool(f), "safetensors: cannot write '", tmp.string(), "'");
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>((std::uint64_t(h.size()) >> (8 * i)) & 0xff);
    f.write(reinterpret_cast<const char*>(len), 8);
    f.write(h.data(), std::streamsize(h.size()));
    std::vector<unsigned char> buf;
    for (const auto& t : tensors) {
      buf.resize(4 * t.values.size());
      for (std::size_t i = 0; i < t.values.size(); ++i) {
        std::uint32_t u;
        std::memcpy(&u, &t.values[i], 4);
        for (int k = 0; k < 4; ++k) buf[4 * i + std::size_t(k)] = static_cast<unsigned char>((u >> (8 * k)) & 0xff);
      }
      f.write(reinterpret_cast<const char*>(buf.data()), std::streamsize(buf.size()));
    }
    f.flush();
    require(bool(f), "safetensors: writing '", tmp.string(), "' failed (disk full?)");
  }
  std::filesystem::rename(tmp, path);
}

/** @brief An open safetensors file: its validated header, and reads of tensors as fp32. */
class SafetensorsFile {
 public:
  /** Reads and validates the header; the tensors are read on demand. */
  explicit SafetensorsFile(const std::filesystem::path& path) : path_(path), in_(path, std::ios::binary) {
    const std::string f = "safetensors " + path.string();
    if (!in_) detail::st::fail(f, ": cannot open the file");
    in_.seekg(0, std::ios::end);
    const std::uint64_t size = std::uint64_t(in_.tellg());
    in_.seekg(0);
    if (size < 8) detail::st::fail(f, ": ", size, " bytes is too short for the 8-byte header length (truncated?)");
    unsigned char len[8];
    in_.read(reinterpret_cast<char*>(len), 8);
    std::uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= std::uint64_t(len[i]) << (8 * i);
    if (n > size - 8 || n > (std::uint64_t(100) << 20))
      detail::st::fail(f, ": bad header length ", n, " at byte offset 0: the file has ", size - 8,
                       " bytes after it (truncated, or not a safetensors file)");
    std::string header(n, '\0');
    in_.read(header.data(), std::streamsize(n));
    data_start_ = 8 + n;
    const std::uint64_t buffer = size - data_start_;
    const auto doc = detail::st::Parser(header, f).document();
    if (doc.kind != detail::st::Json::Kind::object) detail::st::fail(f, ": the JSON header is not an object");
    for (const auto& [name, v] : doc.members) {
      if (name == "__metadata__") {
        if (v.kind != detail::st::Json::Kind::object) detail::st::fail(f, ": __metadata__ is not an object");
        for (const auto& [k, s] : v.members) {
          if (s.kind != detail::st::Json::Kind::string)
            detail::st::fail(f, ": __metadata__ value \"", k, "\" is not a string");
          metadata_[k] = s.text;
        }
        continue;
      }
      entries_.push_back(entry(f, name, v, buffer));
    }
    // Tensors tile the buffer: no overlap, no gap, nothing past the end.
    std::vector<const SafetensorsEntry*> order;
    for (const auto& e : entries_) order.push_back(&e);
    std::sort(order.begin(), order.end(),
              [](auto* a, auto* b) { return a->begin < b->begin || (a->begin == b->begin && a->end < b->end); });
    std::uint64_t at = 0;
    const SafetensorsEntry* prev = nullptr;
    for (const auto* e : order) {
      if (e->begin < at)
        detail::st::fail(f, ": tensors '", prev->name, "' [", prev->begin, ", ", prev->end, ") and '", e->name, "' [",
                         e->begin, ", ", e->end, ") overlap");
      if (e->begin > at)
        detail::st::fail(f, ": a gap of ", e->begin - at, " bytes before tensor '", e->name, "' at buffer offset ", at);
      at = e->end;
      prev = e;
    }
    if (at != buffer)
      detail::st::fail(f, ": the data buffer has ", buffer, " bytes but the tensors cover ", at,
                       at < buffer ? " (trailing bytes)" : " (truncated)");
  }

  [[nodiscard]] const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  [[nodiscard]] const std::map<std::string, std::string>& metadata() const { return metadata_; }
  [[nodiscard]] const std::filesystem::path& path() const { return path_; }
  [[nodiscard]] const SafetensorsEntry* find(std::string_view name) const {
    for (const auto& e : entries_)
      if (e.name == name) return &e;
    return nullptr;
  }

  /** The tensor `name` as row-major fp32 (F16/BF16 widened); throws naming the file when it is absent. */
  [[nodiscard]] std::vector<float> read(std::string_view name) {
    const SafetensorsEntry* e = find(name);
    if (e == nullptr) detail::st::fail("safetensors ", path_.string(), ": no tensor '", name, "'");
    std::vector<unsigned char> raw(e->end - e->begin);
    in_.clear();
    in_.seekg(std::streamoff(data_start_ + e->begin));
    in_.read(reinterpret_cast<char*>(raw.data()), std::streamsize(raw.size()));
    if (!in_)
      detail::st::fail("safetensors ", path_.string(), ": reading tensor '", name, "' failed (the file shrank?)");
    const std::size_t w = detail::st::dtype_bytes(e->dtype), n = raw.size() / w;
    std::vector<float> out(n);
    for (std::size_t i = 0; i < n; ++i) {
      std::uint32_t u = 0;
      for (std::size_t k = 0; k < w; ++k) u |= std::uint32_t(raw[i * w + k]) << (8 * k);
      if (e->dtype == "F32")
        std::memcpy(&out[i], &u, 4);
      else if (e->dtype == "BF16") {
        u <<= 16;
        std::memcpy(&out[i], &u, 4);
      } else {
        out[i] = float(f16::from_bits(std::uint16_t(u)));
      }
    }
    return out;
  }

 private:
  static SafetensorsEntry entry(const std::string& f, const std::string& name, const detail::st::Json& v,
                                std::uint64_t buffer) {
    using K = detail::st::Json::Kind;
    SafetensorsEntry e;
    e.name = name;
    if (v.kind != K::object) detail::st::fail(f, ": tensor '", name, "' is not an object");
    const detail::st::Json *dtype = nullptr, *shape = nullptr, *offsets = nullptr;
    for (const auto& [k, m] : v.members) {
      if (k == "dtype")
        dtype = &m;
      else if (k == "shape")
        shape = &m;
      else if (k == "data_offsets")
        offsets = &m;
      else
        detail::st::fail(f, ": tensor '", name, "' has an unknown field \"", k, "\"");
    }
    if (dtype == nullptr || dtype->kind != K::string) detail::st::fail(f, ": tensor '", name, "' has no string dtype");
    e.dtype = dtype->text;
    if (detail::st::dtype_bytes(e.dtype) == 0)
      detail::st::fail(f, ": tensor '", name, "' has dtype ", e.dtype, "; mpar reads F32, F16 and BF16 weights");
    if (shape == nullptr || shape->kind != K::array) detail::st::fail(f, ": tensor '", name, "' has no shape array");
    for (const auto& d : shape->items) {
      if (d.kind != K::integer) detail::st::fail(f, ": tensor '", name, "' has a non-integer dimension");
      e.shape.push_back(std::size_t(d.number));
    }
    if (offsets == nullptr || offsets->kind != K::array || offsets->items.size() != 2 ||
        offsets->items[0].kind != K::integer || offsets->items[1].kind != K::integer)
      detail::st::fail(f, ": tensor '", name, "' has no data_offsets [begin, end]");
    e.begin = std::size_t(offsets->items[0].number);
    e.end = std::size_t(offsets->items[1].number);
    if (e.begin > e.end || e.end > buffer)
      detail::st::fail(f, ": tensor '", name, "' has data_offsets [", e.begin, ", ", e.end, "] outside the ", buffer,
                       "-byte data buffer (truncated file?)");
    std::uint64_t want = detail::st::dtype_bytes(e.dtype);
    for (auto d : e.shape) {
      if (d != 0 && want > buffer / d) detail::st::fail(f, ": tensor '", name, "' has a shape larger than the file");
      want *= d;
    }
    if (want != e.end - e.begin)
      detail::st::fail(f, ": tensor '", name, "' of dtype ", e.dtype, " and ", e.shape.size(), " dimensions needs ",
                       want, " bytes but data_offsets give ", e.end - e.begin);
    return e;
  }

  std::filesystem::path path_;
  std::ifstream in_;
  std::uint64_t data_start_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace mpar::io
