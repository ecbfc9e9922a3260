#pragma once
/**
 * @file The checkpoint manifest: what was saved, where, with which checksums, and the training
 * state to resume from. A line-oriented text format, documented in docs/checkpoints.md:
 *
 * ```
 * mpar-checkpoint 1
 * byte_order little
 * mesh tp=2 pp=2 dp=1 cp=1
 * step 100
 * data_position 6400
 * rng 2 0x000000000000002a 0x0000000000000c80
 * loss_scale scale=0x47800000 good=12 skipped=1
 * user adamw.steps 100
 * tensor fc1.weight dtype=f32 shape=16,32 layout=Shard<1,%20tensor> shards=2
 * shard box=0:16,0:16 file=rank-00000.bin offset=0 bytes=1024 crc32=1c291ca3 chunk=16384 table=1024
 * shard box=0:16,16:32 file=rank-00001.bin offset=0 bytes=1024 crc32=0d4e5f60 chunk=16384 table=1024
 * end crc32=89abcdef
 * ```
 * Tokens are separated by one space; names, layouts and user strings are percent-encoded (`%20` for
 * a space). The final line holds the CRC-32 of every byte before it, so a truncated or edited
 * manifest is rejected. The parser validates everything a reader relies on: sizes, boxes inside the
 * shape, shards that tile each tensor exactly, file names without directories.
 */
#include <bit>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "mpar/io/box.hpp"
#include "mpar/io/crc32.hpp"
#include "mpar/io/io_error.hpp"

namespace mpar::io {

static_assert(std::endian::native == std::endian::little,
              "mpar checkpoints store little-endian fp32; a big-endian host needs byte swapping in io/checkpoint.hpp");

/** @brief The dynamic loss scaler's state (see optim/loss_scaler.hpp). */
struct LossScaleState {
  float scale = 1.0f;
  std::uint64_t good_steps = 0;  ///< good steps in a row since the last change
  std::uint64_t skipped = 0;     ///< steps skipped for overflow so far
  friend bool operator==(const LossScaleState&, const LossScaleState&) = default;
};

/** @brief Everything besides tensors that a resumed run needs to continue exactly. */
struct TrainingState {
  std::uint64_t step = 0;                    ///< optimizer steps completed
  std::uint64_t data_position = 0;           ///< where the data loader continues (samples or tokens)
  std::vector<std::uint64_t> rng;            ///< RNG state words, e.g. {seed, counter}
  std::optional<LossScaleState> loss_scale;  ///< absent when no loss scaling is used
  std::map<std::string, std::string> user;   ///< anything else, e.g. {"adamw.steps", "100"}
  friend bool operator==(const TrainingState&, const TrainingState&) = default;
};

/** @brief The mesh a checkpoint was saved from (informative: loading works for any mesh). */
struct MeshShape {
  std::size_t tp = 1, pp = 1, dp = 1;
  std::size_t cp = 1;  ///< context-parallel ranks (a manifest written before cp was recorded reads as 1)
  friend bool operator==(const MeshShape&, const MeshShape&) = default;
};

/** @brief One saved block of a tensor and where its bytes lie. */
struct ShardRecord {
  BoxN box;
  std::string file;          ///< relative to the checkpoint directory, no directories
  std::uint64_t offset = 0;  ///< of the first data byte in `file`
  std::uint64_t bytes = 0;   ///< 4 * volume(box)
  std::uint32_t crc32 = 0;   ///< of the `bytes` data bytes
  std::uint64_t chunk = 0;   ///< elements per checksummed chunk
  std::uint64_t table = 0;   ///< offset in `file` of the chunk CRC table (one little-endian u32 per chunk)
  [[nodiscard]] std::uint64_t chunks() const { return chunk == 0 ? 0 : (bytes / 4 + chunk - 1) / chunk; }
};

/** @brief One tensor: its global shape, element type, the layout it was saved with, and its shards. */
struct TensorRecord {
  std::string name;
  std::string dtype = "f32";
  std::vector<std::size_t> shape;
  std::string layout = "Replicate";
  std::vector<ShardRecord> shards;
};

/** @brief A parsed and validated manifest. */
struct Manifest {
  MeshShape mesh;
  TrainingState state;
  std::vector<TensorRecord> tensors;

  [[nodiscard]] const TensorRecord* find(std::string_view name) const {
    for (const auto& t : tensors)
      if (t.name == name) return &t;
    return nullptr;
  }
};

inline constexpr std::string_view manifest_magic = "mpar-checkpoint";
inline constexpr int manifest_version = 1;

namespace detail {

inline std::string encode_token(std::string_view s) {
  static constexpr char hex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (c <= 0x20 || c >= 0x7f || c == '%' || c == '=' || c == ',' || c == ':') {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += char(c);
    }
  }
  return out;
}

inline std::optional<std::string> decode_token(std::string_view s) {
  auto nib = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out += s[i];
      continue;
    }
    if (i + 2 >= s.size()) return std::nullopt;
    const int a = nib(s[i + 1]), b = nib(s[i + 2]);
    if (a < 0 || b < 0) return std::nullopt;
    out += char(a * 16 + b);
    i += 2;
  }
  return out;
}

inline std::string hex32(std::uint32_t v) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}
inline std::string hex64(std::uint64_t v) {
  char buf[19];
  std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(v));
  return buf;
}

inline std::string join_sizes(const std::vector<std::size_t>& v) {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}
inline std::string join_box(const BoxN& b) {
  std::string s;
  for (std::size_t i = 0; i < b.size(); ++i)
    s += (i ? "," : "") + std::to_string(b[i].offset) + ":" + std::to_string(b[i].offset + b[i].extent);
  return s;
}

/** Parses the manifest line by line, reporting the first problem with its line number. */
class ManifestParser {
 public:
  ManifestParser(std::string_view text, std::string source, bool complete)
      : text_(text), source_(std::move(source)), complete_(complete) {}

  Manifest parse() {
    // The last line must be `end crc32=X` over everything before it.
    std::string_view body = text_;
    fail_unless(!body.empty() && body.back() == '\n', 0, "it is empty or truncated (no final newline)");
    const std::size_t last_start = body.find_last_of('\n', body.size() - 2);
    const std::size_t end_pos = last_start == std::string_view::npos ? 0 : last_start + 1;
    const std::string_view end_line = body.substr(end_pos, body.size() - 1 - end_pos);
    fail_unless(end_line.starts_with("end crc32="), 0, "it is truncated (the last line is not `end crc32=...`)");
    const auto want = parse_hex32(end_line.substr(10));
    fail_unless(want.has_value(), 0, "the end line's crc32 is not 8 hex digits");
    fail_unless(crc32(body.substr(0, end_pos)) == *want, 0,
                "its checksum does not match (the file was modified or damaged)");
    body = body.substr(0, end_pos);

    Manifest m;
    std::size_t line_no = 0, pos = 0;
    TensorRecord* current = nullptr;
    std::size_t expected_shards = 0;
    bool have_magic = false;
    auto close_tensor = [&](std::size_t ln) {
      if (current)
        fail_unless(current->shards.size() == expected_shards, ln, "tensor '", current->name, "' declares ",
                    expected_shards, " shards but lists ", current->shards.size());
      current = nullptr;
    };
    while (pos < body.size()) {
      const std::size_t nl = body.find('\n', pos);
      const std::string_view line = body.substr(pos, nl - pos);
      pos = nl + 1;
      ++line_no;
      const auto tok = split(line);
      fail_unless(!tok.empty(), line_no, "empty line");
      const std::string_view kw = tok[0];
      if (!have_magic) {
        fail_unless(tok.size() == 2 && kw == manifest_magic, line_no, "it does not start with `mpar-checkpoint 1`");
        fail_unless(tok[1] == "1", line_no, "format version ", tok[1],
                    " is not supported (this build reads version 1)");
        have_magic = true;
        continue;
      }
      if (kw != "shard") close_tensor(line_no);
      if (kw == "byte_order") {
        fail_unless(tok.size() == 2 && tok[1] == "little", line_no, "only byte_order little is supported");
      } else if (kw == "mesh") {
        fail_unless(tok.size() == 4 || tok.size() == 5, line_no, "mesh needs tp=, pp=, dp= and (optionally) cp=");
        m.mesh.tp = num(value_of(tok[1], "tp", line_no), line_no);
        m.mesh.pp = num(value_of(tok[2], "pp", line_no), line_no);
        m.mesh.dp = num(value_of(tok[3], "dp", line_no), line_no);
        m.mesh.cp = tok.size() == 5 ? num(value_of(tok[4], "cp", line_no), line_no) : 1;  // older manifests: no cp
      } else if (kw == "step") {
        fail_unless(tok.size() == 2, line_no, "step needs one value");
        m.state.step = num(tok[1], line_no);
      } else if (kw == "data_position") {
        fail_unless(tok.size() == 2, line_no, "data_position needs one value");
        m.state.data_position = num(tok[1], line_no);
      } else if (kw == "rng") {
        fail_unless(tok.size() >= 2, line_no, "rng needs a count");
        const std::size_t n = num(tok[1], line_no);
        fail_unless(n == tok.size() - 2, line_no, "rng declares ", n, " words but lists ", tok.size() - 2);
        m.state.rng.clear();
        for (std::size_t i = 0; i < n; ++i) m.state.rng.push_back(hex64_of(tok[2 + i], line_no));
      } else if (kw == "loss_scale") {
        fail_unless(tok.size() == 4, line_no, "loss_scale needs scale=, good= and skipped=");
        LossScaleState ls;
        const std::uint64_t bits = hex64_of(value_of(tok[1], "scale", line_no), line_no);
        fail_unless(bits <= 0xFFFFFFFFull, line_no, "loss scale bits do not fit 32 bits");
        ls.scale = std::bit_cast<float>(std::uint32_t(bits));
        ls.good_steps = num(value_of(tok[2], "good", line_no), line_no);
        ls.skipped = num(value_of(tok[3], "skipped", line_no), line_no);
        m.state.loss_scale = ls;
      } else if (kw == "user") {
        fail_unless(tok.size() == 3, line_no, "user needs a key and a value");
        m.state.user[text(tok[1], line_no)] = text(tok[2], line_no);
      } else if (kw == "tensor") {
        fail_unless(tok.size() == 6, line_no, "tensor needs a name, dtype=, shape=, layout= and shards=");
        TensorRecord t;
        t.name = text(tok[1], line_no);
        fail_unless(!t.name.empty(), line_no, "a tensor has an empty name");
        fail_unless(m.find(t.name) == nullptr, line_no, "tensor '", t.name, "' appears twice");
        t.dtype = text(value_of(tok[2], "dtype", line_no), line_no);
        fail_unless(t.dtype == "f32", line_no, "tensor '", t.name, "' has element type '", t.dtype,
                    "'; this build reads f32 only");
        t.shape = sizes(value_of(tok[3], "shape", line_no), line_no);
        t.layout = text(value_of(tok[4], "layout", line_no), line_no);
        expected_shards = num(value_of(tok[5], "shards", line_no), line_no);
        fail_unless(expected_shards >= 1 && expected_shards <= volume_or_fail(full_box(t.shape), t.name, line_no),
                    line_no, "tensor '", t.name, "' declares ", expected_shards, " shards");
        m.tensors.push_back(std::move(t));
        current = &m.tensors.back();
      } else if (kw == "shard") {
        fail_unless(current != nullptr, line_no, "a shard line outside a tensor");
        fail_unless(current->shards.size() < expected_shards, line_no, "tensor '", current->name,
                    "' has more shard lines than it declares");
        fail_unless(tok.size() == 8, line_no, "shard needs box=, file=, offset=, bytes=, crc32=, chunk= and table=");
        ShardRecord s;
        s.box = box(value_of(tok[1], "box", line_no), line_no);
        s.file = text(value_of(tok[2], "file", line_no), line_no);
        s.offset = num(value_of(tok[3], "offset", line_no), line_no);
        s.bytes = num(value_of(tok[4], "bytes", line_no), line_no);
        const auto c = parse_hex32(value_of(tok[5], "crc32", line_no));
        fail_unless(c.has_value(), line_no, "crc32 is not 8 hex digits");
        s.crc32 = *c;
        s.chunk = num(value_of(tok[6], "chunk", line_no), line_no);
        s.table = num(value_of(tok[7], "table", line_no), line_no);
        check_shard(*current, s, line_no);
        current->shards.push_back(std::move(s));
      } else {
        fail_unless(false, line_no, "unknown keyword '", kw, "'");
      }
    }
    close_tensor(line_no);
    fail_unless(have_magic, 0, "it does not start with `mpar-checkpoint 1`");
    if (complete_)
      for (const auto& t : m.tensors) check_tiling(t);
    return m;
  }

 private:
  template <class... P>
  void fail_unless(bool ok, std::size_t line, P&&... parts) const {
    if (ok) return;
    std::string where = line ? mpar::detail::cat(source_, ":", line) : source_;
    throw checkpoint_error(mpar::detail::cat("invalid checkpoint manifest ", where, ": ", std::forward<P>(parts)...));
  }

  static std::vector<std::string_view> split(std::string_view line) {
    std::vector<std::string_view> out;
    std::size_t p = 0;
    while (p <= line.size()) {
      const std::size_t q = line.find(' ', p);
      const std::size_t e = q == std::string_view::npos ? line.size() : q;
      out.push_back(line.substr(p, e - p));
      if (q == std::string_view::npos) break;
      p = q + 1;
    }
    if (out.size() == 1 && out[0].empty()) out.clear();
    return out;
  }

  std::string_view value_of(std::string_view tok, std::string_view key, std::size_t ln) const {
    fail_unless(tok.size() > key.size() && tok.substr(0, key.size()) == key && tok[key.size()] == '=', ln, "expected ",
                key, "=... but found '", tok, "'");
    return tok.substr(key.size() + 1);
  }
  std::uint64_t num(std::string_view s, std::size_t ln) const {
    std::uint64_t v = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    fail_unless(ec == std::errc{} && p == s.data() + s.size() && !s.empty(), ln, "'", s,
                "' is not a non-negative integer");
    return v;
  }
  static std::optional<std::uint32_t> parse_hex32(std::string_view s) {
    if (s.size() != 8) return std::nullopt;
    std::uint32_t v = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + 8, v, 16);
    if (ec != std::errc{} || p != s.data() + 8) return std::nullopt;
    return v;
  }
  std::uint64_t hex64_of(std::string_view s, std::size_t ln) const {
    fail_unless(s.size() == 18 && s.starts_with("0x"), ln, "'", s, "' is not a 0x-prefixed 16-digit hex number");
    std::uint64_t v = 0;
    auto [p, ec] = std::from_chars(s.data() + 2, s.data() + 18, v, 16);
    fail_unless(ec == std::errc{} && p == s.data() + 18, ln, "'", s, "' is not a hex number");
    return v;
  }
  std::string text(std::string_view s, std::size_t ln) const {
    auto d = decode_token(s);
    fail_unless(d.has_value(), ln, "bad percent-encoding in '", s, "'");
    return *d;
  }
  std::vector<std::size_t> sizes(std::string_view s, std::size_t ln) const {
    std::vector<std::size_t> v;
    if (s.empty()) return v;  // a scalar
    std::size_t p = 0;
    while (true) {
      const std::size_t q = s.find(',', p);
      v.push_back(num(s.substr(p, q == std::string_view::npos ? std::string_view::npos : q - p), ln));
      fail_unless(v.size() <= 16, ln, "more than 16 dimensions");
      if (q == std::string_view::npos) break;
      p = q + 1;
    }
    return v;
  }
  BoxN box(std::string_view s, std::size_t ln) const {
    BoxN b;
    if (s.empty()) return b;
    std::size_t p = 0;
    while (true) {
      const std::size_t q = s.find(',', p);
      const std::string_view part = s.substr(p, q == std::string_view::npos ? std::string_view::npos : q - p);
      const std::size_t colon = part.find(':');
      fail_unless(colon != std::string_view::npos, ln, "box range '", part, "' is not begin:end");
      const std::uint64_t lo = num(part.substr(0, colon), ln), hi = num(part.substr(colon + 1), ln);
      fail_unless(lo < hi, ln, "box range '", part, "' is empty or reversed");
      b.push_back({lo, hi - lo});
      fail_unless(b.size() <= 16, ln, "more than 16 dimensions");
      if (q == std::string_view::npos) break;
      p = q + 1;
    }
    return b;
  }
  std::size_t volume_or_fail(const BoxN& b, const std::string& name, std::size_t ln) const {
    const auto v = checked_volume(b);
    // Elements are addressed in bytes (4 each) and as file offsets, so keep a wide margin.
    fail_unless(v.has_value() && *v <= (std::uint64_t(1) << 56), ln, "tensor '", name, "' is impossibly large");
    return *v;
  }
  void check_shard(const TensorRecord& t, const ShardRecord& s, std::size_t ln) const {
    fail_unless(box_within(s.box, t.shape), ln, "tensor '", t.name, "': shard box ", box_string(s.box),
                " is not inside shape ", shape_string(t.shape));
    const std::size_t vol = volume_or_fail(s.box, t.name, ln);
    fail_unless(s.bytes == 4 * vol, ln, "tensor '", t.name, "': shard ", box_string(s.box), " has ", vol,
                " elements but records ", s.bytes, " bytes");
    fail_unless(!s.file.empty() && s.file.size() <= 255 && s.file.find('/') == std::string::npos && s.file != "." &&
                    s.file != ".." && s.file.find('\0') == std::string::npos,
                ln, "tensor '", t.name, "': shard file name '", s.file, "' must be a plain file name");
    fail_unless(s.chunk >= 1 && s.chunk <= (std::uint64_t(1) << 40), ln, "tensor '", t.name,
                "': chunk must be between 1 and 2^40 elements");
    fail_unless(s.offset <= (std::uint64_t(1) << 60) && s.table <= (std::uint64_t(1) << 60), ln, "tensor '", t.name,
                "': file offsets are impossibly large");
  }
  void check_tiling(const TensorRecord& t) const {
    std::size_t covered = 0;
    for (std::size_t i = 0; i < t.shards.size(); ++i) {
      covered += volume(t.shards[i].box);
      for (std::size_t j = 0; j < i; ++j)
        fail_unless(!intersect(t.shards[i].box, t.shards[j].box).has_value(), 0, "tensor '", t.name, "': shards ",
                    box_string(t.shards[j].box), " and ", box_string(t.shards[i].box), " overlap");
    }
    fail_unless(covered == volume(t.shape), 0, "tensor '", t.name, "': its shards cover ", covered, " of ",
                volume(t.shape), " elements (a shard is missing)");
  }

  std::string_view text_;
  std::string source_;
  bool complete_ = true;
};

}  // namespace detail

/** @brief Writes a manifest in the format above, ending with its checksum line. */
[[nodiscard]] inline std::string format_manifest(const Manifest& m) {
  using namespace detail;
  std::ostringstream os;
  os << manifest_magic << ' ' << manifest_version << "\nbyte_order little\n";
  os << "mesh tp=" << m.mesh.tp << " pp=" << m.mesh.pp << " dp=" << m.mesh.dp << " cp=" << m.mesh.cp << '\n';
  os << "step " << m.state.step << "\ndata_position " << m.state.data_position << '\n';
  os << "rng " << m.state.rng.size();
  for (auto w : m.state.rng) os << ' ' << hex64(w);
  os << '\n';
  if (m.state.loss_scale)
    os << "loss_scale scale=" << hex64(std::bit_cast<std::uint32_t>(m.state.loss_scale->scale))
       << " good=" << m.state.loss_scale->good_steps << " skipped=" << m.state.loss_scale->skipped << '\n';
  for (const auto& [k, v] : m.state.user) os << "user " << encode_token(k) << ' ' << encode_token(v) << '\n';
  for (const auto& t : m.tensors) {
    os << "tensor " << encode_token(t.name) << " dtype=" << encode_token(t.dtype) << " shape=" << join_sizes(t.shape)
       << " layout=" << encode_token(t.layout) << " shards=" << t.shards.size() << '\n';
    for (const auto& s : t.shards)
      os << "shard box=" << join_box(s.box) << " file=" << encode_token(s.file) << " offset=" << s.offset
         << " bytes=" << s.bytes << " crc32=" << hex32(s.crc32) << " chunk=" << s.chunk << " table=" << s.table << '\n';
  }
  std::string body = os.str();
  body += "end crc32=" + hex32(crc32(body)) + "\n";
  return body;
}

/**
 * @brief Parses and validates a manifest; `source` (usually the file's path) names it in errors.
 * Throws checkpoint_error naming the source, the line and, where one is involved, the tensor.
 * `complete = false` skips the check that each tensor's shards tile it (for one rank's part of a
 * checkpoint while it is being assembled).
 */
[[nodiscard]] inline Manifest parse_manifest(std::string_view text, std::string source, bool complete = true) {
  return detail::ManifestParser(text, std::move(source), complete).parse();
}

}  // namespace mpar::io
