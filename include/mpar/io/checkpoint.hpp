#pragma once
/**
 * @file Distributed checkpoints with resharding: `save_checkpoint` and `load_checkpoint`.
 *
 * Every rank passes the blocks it holds (parameters, optimizer states: any named fp32 block of a
 * global tensor, described by its global shape and local box). On save, each distinct block is
 * written by exactly one rank (the lowest rank holding it), into that rank's data file; rank 0
 * assembles the manifest. On load, every rank states the blocks it wants, in any layout, and reads
 * only the byte ranges of saved shards that overlap them, verifying chunk checksums on the way.
 *
 * Directory layout (see docs/checkpoints.md):
 * ```
 * DIR/latest                       name of the newest complete checkpoint, replaced atomically
 * DIR/step-00000100/manifest.txt   written last
 * DIR/step-00000100/rank-00003.bin shards written by rank 3, each followed by its chunk CRC table
 * DIR/.partial-step-00000100/      a save in progress; never read
 * ```
 */
#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "mpar/comm/communicator.hpp"
#include "mpar/core/memory_resource.hpp"
#include "mpar/io/box.hpp"
#include "mpar/io/crc32.hpp"
#include "mpar/io/error.hpp"
#include "mpar/io/file.hpp"
#include "mpar/io/lock.hpp"
#include "mpar/io/manifest.hpp"

namespace mpar::io {

/**
 * @brief A named block of a global fp32 tensor held by this rank: `data` is the row-major content of
 * `box` (one Block per dimension of `global_shape`). `SaveBlock` reads it, `LoadBlock` fills it.
 */
template <class T>
struct BlockView {
  std::string name;
  std::vector<std::size_t> global_shape;
  BoxN box;
  std::string layout = "Replicate";  ///< recorded in the manifest (informative; any layout loads)
  std::span<T> data;
};
using SaveBlock = BlockView<const float>;
using LoadBlock = BlockView<float>;

/** @brief How a checkpoint is saved. */
struct SaveOptions {
  MeshShape mesh;                                  ///< recorded as the layout it was saved with
  std::size_t chunk_elems = 16384;                 ///< elements per checksummed chunk (64 KiB): the read granularity
  std::size_t write_chunk_bytes = std::size_t(1) << 20;
  std::size_t keep_last = 0;                       ///< 0 keeps every checkpoint; n > 0 removes all but the newest n
  IoHook hook;                                     ///< sees every disk-changing operation (tests inject crashes here)
};

/** @brief What a save did on this rank. */
struct SaveResult {
  std::filesystem::path path;        ///< the checkpoint directory
  std::size_t blocks_written = 0;    ///< blocks this rank wrote
  std::size_t blocks_replicated = 0; ///< blocks skipped because a lower rank holds the same block
  std::size_t bytes_written = 0;     ///< data and tables this rank wrote
};

/** @brief How a checkpoint is loaded. */
struct LoadOptions {
  /** Read every overlapping shard whole and check its CRC-32 too (more I/O; chunks are always checked). */
  bool verify_whole_shards = false;
};

/** @brief I/O a load did on this rank: the test of "no rank reads the whole model". */
struct LoadStats {
  std::size_t bytes_needed = 0;  ///< 4 x the elements of the requested blocks
  std::size_t bytes_read = 0;    ///< data and checksum bytes read from shard files
  std::size_t reads = 0;         ///< positioned reads issued
  std::size_t files_opened = 0;
};

/** @brief A loaded checkpoint's training state and where it came from. */
struct LoadResult {
  TrainingState state;
  std::filesystem::path path;
  MeshShape saved_mesh;
  LoadStats stats;
  std::vector<std::string> warnings;  ///< what a caller of the load chose to skip (e.g. another optimizer's states)
};

inline constexpr std::string_view manifest_file_name = "manifest.txt";
inline constexpr std::string_view latest_file_name = "latest";

/** @brief `step-00000100`: the directory name of the checkpoint of a step. */
[[nodiscard]] inline std::string step_dir_name(std::uint64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08llu", static_cast<unsigned long long>(step));
  return buf;
}
[[nodiscard]] inline std::string rank_file_name(int rank, std::string_view ext) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank-%05d.", rank);
  return std::string(buf) + std::string(ext);
}

namespace detail {
/** `s` with control and non-ASCII bytes as \xNN (a NUL would end the message), cut after `max` bytes. */
inline std::string printable(std::string_view s, std::size_t max = 80) {
  static constexpr char hex[] = "0123456789abcdef";
  std::string out;
  for (std::size_t i = 0; i < s.size() && i < max; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += char(c);
    } else {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  if (s.size() > max) out += "...";
  return out;
}
/** Whether `p` exists; throws naming it when it cannot be examined (permissions, a symlink loop, ...). */
inline bool exists_checked(const std::filesystem::path& p, std::string_view what) {
  std::error_code ec;
  const auto st = std::filesystem::status(p, ec);
  if (st.type() == std::filesystem::file_type::not_found) return false;
  check(!ec, "cannot read ", what, " ", p.string(), ": ", ec.message());
  return true;
}
}  // namespace detail

/**
 * @brief The checkpoint directory `path` designates: `path` itself if it holds a manifest, otherwise
 * the checkpoint its `latest` file names. Throws naming the missing or unreadable file, and showing
 * a damaged `latest` with its control bytes escaped.
 */
[[nodiscard]] inline std::filesystem::path resolve_checkpoint(const std::filesystem::path& path) {
  detail::check(!path.empty(), "no checkpoint path given (the path is empty)");
  detail::check(detail::exists_checked(path, "checkpoint path"), "no checkpoint at ", path.string(),
                ": it does not exist");
  if (detail::exists_checked(path / manifest_file_name, "checkpoint manifest")) return path;
  const auto latest = path / latest_file_name;
  detail::check(detail::exists_checked(latest, "checkpoint pointer"), "no checkpoint in ", path.string(), ": neither ",
                (path / manifest_file_name).string(), " nor ", latest.string(), " exists");
  std::string name = read_small_file(latest);
  while (!name.empty() && (name.back() == '\n' || name.back() == '\r' || name.back() == ' ')) name.pop_back();
  // A step directory name: letters, digits, '.', '-', '_' (no path, no control bytes).
  const bool plain = !name.empty() && name.size() <= 255 && name != "." && name != ".." &&
                     name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") ==
                         std::string::npos;
  detail::check(plain, "file ", latest.string(), " does not name a checkpoint directory: it holds '",
                detail::printable(name), "' (", name.size(), " bytes); write the name of a step directory into it, e.g. ",
                step_dir_name(0));
  const auto dir = path / name;
  detail::check(detail::exists_checked(dir, "checkpoint directory"), "checkpoint ", dir.string(), " named by ",
                latest.string(), " does not exist");
  detail::check(detail::exists_checked(dir / manifest_file_name, "checkpoint manifest"), "checkpoint ", dir.string(),
                " named by ", latest.string(), " has no ", manifest_file_name, " (missing file ",
                (dir / manifest_file_name).string(), ")");
  return dir;
}

/** @brief Reads and validates the manifest of the checkpoint `path` designates (see resolve_checkpoint). */
[[nodiscard]] inline Manifest read_manifest(const std::filesystem::path& path) {
  const auto file = resolve_checkpoint(path) / manifest_file_name;
  return parse_manifest(read_small_file(file), file.string());
}

// ---------------------------------------------------------------------------------------------
// Writing

/**
 * @brief Appends shards to one data file: each shard's little-endian fp32 data followed by its chunk
 * CRC table. `finish()` flushes and renames the file into place.
 */
class ShardFileWriter {
 public:
  ShardFileWriter(const std::filesystem::path& dir, std::string file_name, const SaveOptions& opts)
      : file_name_(std::move(file_name)), chunk_(std::max<std::size_t>(opts.chunk_elems, 1)),
        out_(dir / file_name_, opts.hook, opts.write_chunk_bytes) {}

  /** Writes one block; returns its manifest record. */
  ShardRecord append(const BoxN& box, std::span<const float> data) {
    ShardRecord r;
    r.box = box;
    r.file = file_name_;
    r.offset = out_.size();
    r.bytes = data.size_bytes();
    r.chunk = chunk_;
    const auto bytes = std::as_bytes(data);
    out_.write(bytes);
    r.table = out_.size();
    // One pass over the data: each chunk's CRC, and the shard's CRC combined from them.
    std::vector<std::byte> table;
    table.reserve(4 * (data.size() / chunk_ + 1));
    r.crc32 = crc32(std::span<const std::byte>());
    for (std::size_t b = 0; b < data.size(); b += chunk_) {
      const std::size_t len = 4 * std::min(chunk_, data.size() - b);
      const std::uint32_t c = crc32(bytes.subspan(4 * b, len));
      r.crc32 = crc32_combine(r.crc32, c, len);
      for (int k = 0; k < 4; ++k) table.push_back(std::byte((c >> (8 * k)) & 0xFFu));
    }
    out_.write(std::span<const std::byte>(table));
    return r;
  }
  void finish() { out_.commit(); }
  [[nodiscard]] std::size_t size() const { return out_.size(); }

 private:
  std::string file_name_;
  std::size_t chunk_;
  DurableFile out_;
};

/**
 * @brief Publishes a fully written staging directory: writes its manifest (temporary name, fsync,
 * rename), renames the directory to its final name and then replaces `latest`. A crash before the
 * last rename leaves `latest` naming the previous checkpoint. Returns the final directory.
 */
inline std::filesystem::path publish_checkpoint(const std::filesystem::path& root, const std::filesystem::path& staging,
                                                const Manifest& manifest, const SaveOptions& opts) {
  write_file_durably(staging / manifest_file_name, format_manifest(manifest), opts.hook);
  std::error_code ec;
  std::string current;
  if (std::filesystem::exists(root / latest_file_name, ec)) {
    current = read_small_file(root / latest_file_name);
    while (!current.empty() && (current.back() == '\n' || current.back() == ' ')) current.pop_back();
  }
  // The directory `latest` names is never touched; a stale one of the same step (a crash after the
  // rename, before `latest` moved) is superseded.
  std::string name = step_dir_name(manifest.state.step);
  for (int k = 1; name == current; ++k) name = step_dir_name(manifest.state.step) + "." + std::to_string(k);
  detail::remove_all_path(root / name, opts.hook);
  detail::rename_path(staging, root / name, opts.hook);
  detail::fsync_path(root, opts.hook);
  write_file_durably(root / latest_file_name, name + "\n", opts.hook);
  if (opts.keep_last > 0) {
    std::vector<std::filesystem::path> complete;
    for (const auto& e : std::filesystem::directory_iterator(root))
      if (e.is_directory() && e.path().filename().string().starts_with("step-") &&
          std::filesystem::exists(e.path() / manifest_file_name))
        complete.push_back(e.path());
    // Oldest first by step number, then by re-save suffix (names do not sort numerically past 8 digits).
    auto order = [](const std::filesystem::path& d) {
      const std::string n = d.filename().string().substr(5);
      const std::size_t dot = n.find('.');
      std::uint64_t step = 0, k = 0;
      std::from_chars(n.data(), n.data() + (dot == std::string::npos ? n.size() : dot), step);
      if (dot != std::string::npos) std::from_chars(n.data() + dot + 1, n.data() + n.size(), k);
      return std::pair{step, k};
    };
    std::sort(complete.begin(), complete.end(), [&](const auto& a, const auto& b) { return order(a) < order(b); });
    for (std::size_t i = 0; i + opts.keep_last < complete.size(); ++i)
      if (complete[i].filename() != name) detail::remove_all_path(complete[i], opts.hook);
  }
  return root / name;
}

namespace detail {

/** A 64-bit FNV-1a fingerprint of a block's identity (name, shape, box) to find replicas. */
inline std::uint64_t block_key(const std::string& name, const std::vector<std::size_t>& shape, const BoxN& box) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  auto mix = [&](const void* p, std::size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  };
  mix(name.data(), name.size());
  const std::uint64_t sep = ~0ull;
  mix(&sep, 8);
  for (std::uint64_t e : shape) mix(&e, 8);
  mix(&sep, 8);
  for (const auto& b : box) {
    std::uint64_t o = b.offset, x = b.extent;
    mix(&o, 8);
    mix(&x, 8);
  }
  return h;
}

/**
 * Makes the outcome of a phase collective: every rank learns whether any rank failed, so all of
 * them throw together instead of some waiting forever in the next collective. The failing rank
 * rethrows its own exception (naming file and tensor); the others name the failed ranks.
 */
template <class C>
void agree(C& comm, std::exception_ptr local, const std::string& what) {
  const int p = comm.size();
  // Communicated buffers live in rank memory (a device communicator reads only that).
  Buffer<float> mine(1, local ? 1.0f : 0.0f), all(static_cast<std::size_t>(p), 0.0f);
  comm.all_gather(std::span<const float>(mine), std::span<float>(all));
  if (local) std::rethrow_exception(local);
  std::string failed;
  for (int r = 0; r < p; ++r)
    if (all[std::size_t(r)] != 0.0f) failed += (failed.empty() ? "" : ", ") + std::to_string(r);
  if (!failed.empty())
    throw peer_checkpoint_error(
        mpar::detail::cat(what, " failed on rank(s) ", failed, " of group '", comm.name(), "'; see their errors"));
}

template <class F>
std::exception_ptr capture(F&& f) {
  try {
    f();
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

inline void check_block(const auto& b, const char* op) {
  check(!b.name.empty(), op, ": a block has an empty name");
  check(box_within(b.box, b.global_shape), op, ": block of tensor '", b.name, "' has box ", box_string(b.box),
        " outside its global shape ", shape_string(b.global_shape));
  check(b.data.size() == volume(b.box), op, ": block of tensor '", b.name, "' has box ", box_string(b.box), " (",
        volume(b.box), " elements) but ", b.data.size(), " values");
}

/** A rank-local communicator of one rank, so that the single-process overloads share the code path. */
struct SoloGroup {
  [[nodiscard]] int rank() const { return 0; }
  [[nodiscard]] int size() const { return 1; }
  [[nodiscard]] std::string name() const { return "self"; }
  void all_gather(std::span<const float> s, std::span<float> r) { std::copy(s.begin(), s.end(), r.begin()); }
  void broadcast(std::span<float>, int) {}
};

template <class C>
SaveResult save_impl(const std::filesystem::path& root, std::span<const SaveBlock> blocks, const TrainingState& state,
                     C& comm, const SaveOptions& opts) {
  const int rank = comm.rank(), p = comm.size();
  const auto staging = root / ("." + std::string("partial-") + step_dir_name(state.step));
  SaveResult result;
  // Rank 0 holds the directory's lock until the checkpoint is published (unless this process holds it
  // already): another job saving into the same directory is refused instead of mixing two checkpoints.
  std::optional<DirectoryLock> lock;

  // Phase 1: rank 0 prepares an empty staging directory (a crashed earlier attempt may have left one).
  agree(comm, capture([&] {
          for (const auto& b : blocks) check_block(b, "save_checkpoint");
          if (rank == 0) {
            if (!DirectoryLock::held_here(root)) lock.emplace(root);
            std::filesystem::create_directories(root);
            remove_all_path(staging, opts.hook);
            std::filesystem::create_directory(staging);
          }
        }),
        "save_checkpoint (preparing " + staging.string() + ")");

  // Phase 2: find replicas. Every rank publishes the identity keys of its blocks (16 bits per float,
  // exact); the lowest rank holding a key writes it.
  Buffer<float> count{float(blocks.size())}, counts(static_cast<std::size_t>(p));
  comm.all_gather(std::span<const float>(count), std::span<float>(counts));
  std::size_t most = 0;
  for (float c : counts) most = std::max(most, std::size_t(c));
  std::vector<std::uint64_t> keys;
  for (const auto& b : blocks) keys.push_back(block_key(b.name, b.global_shape, b.box));
  Buffer<float> mine(4 * most, -1.0f), all(4 * most * std::size_t(p));
  for (std::size_t i = 0; i < keys.size(); ++i)
    for (int k = 0; k < 4; ++k) mine[4 * i + std::size_t(k)] = float((keys[i] >> (16 * k)) & 0xFFFFu);
  if (most > 0) comm.all_gather(std::span<const float>(mine), std::span<float>(all));
  auto key_at = [&](int r, std::size_t i) {
    std::uint64_t key = 0;
    for (int k = 0; k < 4; ++k) key |= std::uint64_t(all[(std::size_t(r) * most + i) * 4 + std::size_t(k)]) << (16 * k);
    return key;
  };
  std::vector<bool> writes(blocks.size(), true);
  for (std::size_t i = 0; i < blocks.size(); ++i)
    for (int r = 0; r < rank && writes[i]; ++r)
      for (std::size_t j = 0; j < std::size_t(counts[std::size_t(r)]); ++j)
        if (key_at(r, j) == keys[i]) {
          writes[i] = false;
          break;
        }

  // Phase 3: every rank writes its data file and its part of the manifest (an index).
  agree(comm, capture([&] {
          Manifest index;
          std::map<std::string, std::size_t> where;
          std::optional<ShardFileWriter> data;
          for (std::size_t i = 0; i < blocks.size(); ++i) {
            const auto& b = blocks[i];
            if (b.data.empty()) continue;  // an empty block (more ranks than rows) holds nothing to save
            if (!writes[i]) {
              ++result.blocks_replicated;
              continue;
            }
            if (!data) data.emplace(staging, rank_file_name(rank, "bin"), opts);
            auto [it, fresh] = where.try_emplace(b.name, index.tensors.size());
            if (fresh) index.tensors.push_back(TensorRecord{b.name, "f32", b.global_shape, b.layout, {}});
            auto& t = index.tensors[it->second];
            check(t.shape == b.global_shape, "save_checkpoint: tensor '", b.name,
                  "' is given twice on rank ", rank, " with shapes ", shape_string(t.shape), " and ",
                  shape_string(b.global_shape));
            t.shards.push_back(data->append(b.box, b.data));
            ++result.blocks_written;
          }
          if (data) {
            result.bytes_written = data->size();
            data->finish();
          }
          write_file_durably(staging / rank_file_name(rank, "idx"), format_manifest(index), opts.hook);
        }),
        "save_checkpoint (writing shards)");

  // Phase 4: rank 0 merges the indexes into the manifest and publishes the checkpoint.
  Buffer<float> suffix{0.0f};
  agree(comm, capture([&] {
          if (rank != 0) return;
          Manifest m;
          m.mesh = opts.mesh;
          m.state = state;
          std::map<std::string, std::size_t> where;
          for (int r = 0; r < p; ++r) {
            const auto file = staging / rank_file_name(r, "idx");
            const auto part = parse_manifest(read_small_file(file), file.string(), false);
            for (const auto& t : part.tensors) {
              auto [it, fresh] = where.try_emplace(t.name, m.tensors.size());
              if (fresh) {
                m.tensors.push_back(t);
                continue;
              }
              auto& have = m.tensors[it->second];
              check(have.shape == t.shape, "save_checkpoint: tensor '", t.name, "' has global shape ",
                    shape_string(have.shape), " on one rank and ", shape_string(t.shape), " on rank ", r);
              have.shards.insert(have.shards.end(), t.shards.begin(), t.shards.end());
            }
          }
          // Validate before publishing: every tensor must be tiled exactly by its shards.
          const std::string text = format_manifest(m);
          (void)parse_manifest(text, (staging / manifest_file_name).string());
          for (int r = 0; r < p; ++r) remove_all_path(staging / rank_file_name(r, "idx"), opts.hook);
          result.path = publish_checkpoint(root, staging, m, opts);
        }),
        "save_checkpoint (publishing the manifest)");
  // Everyone learns the final directory name (it differs from step-N only when re-saving the same step).
  if (rank == 0) {
    const std::string n = result.path.filename().string(), base = step_dir_name(state.step);
    suffix[0] = n.size() > base.size() ? float(std::stoi(n.substr(base.size() + 1))) : 0.0f;
  }
  comm.broadcast(std::span<float>(suffix), 0);
  if (rank != 0)
    result.path = root / (step_dir_name(state.step) + (suffix[0] > 0 ? "." + std::to_string(int(suffix[0])) : ""));
  return result;
}

// ---------------------------------------------------------------------------------------------
// Reading

/** Reads the parts of saved shards that overlap requested blocks, checking chunk checksums. */
class ShardReader {
 public:
  ShardReader(std::filesystem::path dir, LoadStats& stats) : dir_(std::move(dir)), stats_(stats) {}

  /** Copies the intersection of `shard` and `dst`'s box from the file into `dst.data`. */
  void read(const TensorRecord& t, const ShardRecord& shard, const LoadBlock& dst, const BoxN& inter, bool whole) {
    auto& f = file(shard.file, t.name);
    const std::size_t n = std::size_t(shard.bytes / 4), chunk = std::size_t(shard.chunk);
    const std::size_t nchunks = std::size_t(shard.chunks());
    check(shard.offset + shard.bytes <= f.size() && shard.table + 4 * nchunks <= f.size(), "file ",
          f.path().string(), " is truncated: it is ", f.size(), " bytes but tensor '", t.name, "' shard ",
          box_string(shard.box), " needs bytes up to ", std::max(shard.offset + shard.bytes, shard.table + 4 * nchunks));
    struct Row {
      std::size_t src, dst, count;
    };
    std::vector<Row> rows;
    for_each_row(shard.box, dst.box, inter, [&](std::size_t s, std::size_t d, std::size_t c) { rows.push_back({s, d, c}); });
    // Group rows into runs of chunks; rows in one chunk or neighbouring chunks share one read.
    std::size_t i = 0;
    while (i < rows.size()) {
      std::size_t c0 = whole ? 0 : rows[i].src / chunk, c1 = whole ? nchunks - 1 : (rows[i].src + rows[i].count - 1) / chunk;
      std::size_t j = i + 1;
      while (j < rows.size() && (whole || rows[j].src / chunk <= c1 + 1)) {
        c1 = std::max(c1, (rows[j].src + rows[j].count - 1) / chunk);
        ++j;
      }
      const std::size_t e0 = c0 * chunk, e1 = std::min(n, (c1 + 1) * chunk);
      // When the rows are exactly elements [e0, e1) and lie back to back in the destination too (a block
      // that contains whole shards, e.g. loading with the saved layout), read straight into place.
      bool direct = rows[i].src == e0 && rows[j - 1].src + rows[j - 1].count == e1;
      for (std::size_t k = i + 1; k < j && direct; ++k)
        direct = rows[k].src == rows[k - 1].src + rows[k - 1].count && rows[k].dst == rows[k - 1].dst + rows[k - 1].count;
      std::span<float> target;
      if (direct) {
        target = dst.data.subspan(rows[i].dst, e1 - e0);
      } else {
        buf_.resize(e1 - e0);
        target = buf_;
      }
      f.read_at(std::size_t(shard.offset) + 4 * e0, std::as_writable_bytes(target));
      table_.resize(c1 - c0 + 1);
      f.read_at(std::size_t(shard.table) + 4 * c0, std::as_writable_bytes(std::span<std::uint32_t>(table_)));
      const auto bytes = std::as_bytes(std::span<const float>(target));
      std::uint32_t whole_crc = crc32(std::span<const std::byte>());
      for (std::size_t c = c0; c <= c1; ++c) {
        const std::size_t b = c * chunk - e0, len = std::min(chunk, n - c * chunk);
        const std::uint32_t got = crc32(bytes.subspan(4 * b, 4 * len));
        check(got == table_[c - c0], "checksum mismatch in ", f.path().string(), " (tensor '", t.name, "', shard ",
              box_string(shard.box), ", elements ", c * chunk, "..", c * chunk + len, "): the file is corrupted");
        whole_crc = crc32_combine(whole_crc, got, 4 * len);
      }
      // A shard read whole is also checked against the manifest (this catches a damaged table too).
      if (e0 == 0 && e1 == n)
        check(whole_crc == shard.crc32, "checksum mismatch in ", f.path().string(), " (tensor '", t.name,
              "', shard ", box_string(shard.box), "): the shard's CRC-32 differs from the manifest");
      if (!direct)
        for (std::size_t k = i; k < j; ++k)
          std::memcpy(dst.data.data() + rows[k].dst, buf_.data() + (rows[k].src - e0), 4 * rows[k].count);
      i = j;
    }
  }

 private:
  ReadFile& file(const std::string& name, const std::string& tensor) {
    auto it = files_.find(name);
    if (it == files_.end()) {
      std::error_code ec;
      check(std::filesystem::exists(dir_ / name, ec), "missing file ", (dir_ / name).string(), " (holds tensor '",
            tensor, "' according to the manifest of ", dir_.string(), ")");
      it = files_.emplace(name, std::make_unique<ReadFile>(dir_ / name)).first;
      ++stats_.files_opened;
    }
    return *it->second;
  }

 public:
  /** Sets the byte and read counts of `stats` to the totals so far. */
  void add_io_to_stats() {
    stats_.bytes_read = 0;
    stats_.reads = 0;
    for (auto& [n, f] : files_) {
      stats_.bytes_read += f->bytes_read();
      stats_.reads += f->reads();
    }
  }

 private:
  std::filesystem::path dir_;
  LoadStats& stats_;
  std::map<std::string, std::unique_ptr<ReadFile>> files_;
  std::vector<float> buf_;
  std::vector<std::uint32_t> table_;
};

}  // namespace detail

/**
 * @brief An open checkpoint: its validated manifest, and reads of any blocks from it (rank-local).
 * Files are opened on first use and kept open; `stats()` counts the I/O.
 */
class CheckpointReader {
 public:
  explicit CheckpointReader(const std::filesystem::path& path, LoadOptions opts = {})
      : path_(resolve_checkpoint(path)), opts_(opts), reader_(path_, stats_) {
    const auto file = path_ / manifest_file_name;
    manifest_ = parse_manifest(read_small_file(file), file.string());
  }

  [[nodiscard]] const Manifest& manifest() const { return manifest_; }
  [[nodiscard]] const std::filesystem::path& path() const { return path_; }
  [[nodiscard]] LoadStats stats() {
    reader_.add_io_to_stats();
    return stats_;
  }

  /** Fills every block; checks the whole request against the manifest before reading anything. */
  void read(std::span<const LoadBlock> blocks) {
    const auto manifest_path = (path_ / manifest_file_name).string();
    for (const auto& b : blocks) {
      detail::check_block(b, "load_checkpoint");
      if (b.data.empty()) continue;  // nothing to fill (a rank with an empty block of a tensor)
      const TensorRecord* t = manifest_.find(b.name);
      detail::check(t != nullptr, "checkpoint ", manifest_path, " has no tensor '", b.name,
                    "': it was saved from a different model (or the parameter was renamed)");
      detail::check(t->shape == b.global_shape, "checkpoint ", manifest_path, ": tensor '", b.name, "' has shape ",
                    shape_string(t->shape), " but the model expects ", shape_string(b.global_shape),
                    ": it was saved from a different model");
    }
    for (const auto& b : blocks) {
      if (b.data.empty()) continue;
      stats_.bytes_needed += b.data.size_bytes();
      const TensorRecord* t = manifest_.find(b.name);
      for (const auto& s : t->shards)
        if (auto inter = intersect(s.box, b.box)) reader_.read(*t, s, b, *inter, opts_.verify_whole_shards);
    }
  }

 private:
  std::filesystem::path path_;
  LoadOptions opts_;
  LoadStats stats_;
  detail::ShardReader reader_;
  Manifest manifest_;
};

namespace detail {
/** Fills `blocks` from the checkpoint `path` designates; rank-local, no communication. */
inline LoadResult load_local(const std::filesystem::path& path, std::span<const LoadBlock> blocks, const LoadOptions& opts) {
  CheckpointReader reader(path, opts);
  reader.read(blocks);
  return LoadResult{reader.manifest().state, reader.path(), reader.manifest().mesh, reader.stats(), {}};
}

}  // namespace detail

/**
 * @brief Saves a checkpoint of step `state.step` under `root` (collective over `comm`).
 *
 * `blocks` are this rank's blocks; ranks holding the same block (same name, shape and box: data
 * replicas, tensor-replicated parameters) write it once, from the lowest rank. Publishes
 * `root/step-<step>` and then points `root/latest` at it; a failure or crash at any point leaves
 * the previous checkpoint as `latest`. Every rank throws if any rank fails.
 */
template <communicator C>
SaveResult save_checkpoint(const std::filesystem::path& root, std::span<const SaveBlock> blocks,
                           const TrainingState& state, C& comm, const SaveOptions& opts = {}) {
  return detail::save_impl(root, blocks, state, comm, opts);
}
/** @brief Single-process save: this process holds (at least one copy of) every block. */
inline SaveResult save_checkpoint(const std::filesystem::path& root, std::span<const SaveBlock> blocks,
                                  const TrainingState& state, const SaveOptions& opts = {}) {
  detail::SoloGroup solo;
  return detail::save_impl(root, blocks, state, solo, opts);
}

/**
 * @brief Loads `blocks` (any layout: each says its global shape and box) from the checkpoint `path`
 * designates (a checkpoint directory, or a root with `latest`), reading only the overlapping byte
 * ranges. Returns the training state. Every rank throws if any rank fails.
 */
template <communicator C>
LoadResult load_checkpoint(const std::filesystem::path& path, std::span<const LoadBlock> blocks, C& comm,
                           const LoadOptions& opts = {}) {
  LoadResult res;
  detail::agree(comm, detail::capture([&] { res = detail::load_local(path, blocks, opts); }), "load_checkpoint");
  return res;
}
/** @brief Rank-local load: no communication. */
inline LoadResult load_checkpoint(const std::filesystem::path& path, std::span<const LoadBlock> blocks,
                                  const LoadOptions& opts = {}) {
  return detail::load_local(path, blocks, opts);
}

}  // namespace mpar::io
