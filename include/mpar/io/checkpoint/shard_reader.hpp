#pragma once
/**
 * @file `detail::ShardReader`: reads the parts of saved shards that overlap requested blocks, checking chunk checksums.
 * Part of `mpar/io/checkpoint.hpp` (docs/checkpoints.md).
 */
#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "mpar/io/box.hpp"
#include "mpar/io/checkpoint/block_view.hpp"
#include "mpar/io/checkpoint/directory.hpp"
#include "mpar/io/checkpoint/options.hpp"
#include "mpar/io/crc32.hpp"
#include "mpar/io/file.hpp"
#include "mpar/io/io_error.hpp"
#include "mpar/io/manifest.hpp"

namespace mpar::io {

namespace detail {

/** Reads the parts of saved shards that overlap requested blocks, checking chunk checksums. */
class ShardReader {
 public:
  ShardReader(std::filesystem::path dir, LoadStats& stats) : dir_(std::move(dir)), stats_(stats) {}

  /** Copies the intersection of `shard` and `dst`'s box from the file into `dst.data`. */
  void read(const TensorRecord& t, const ShardRecord& shard, const LoadBlock& dst, const BoxN& inter, bool whole) {
    auto& f = file(shard.file, t.name);
    const std::size_t n = std::size_t(shard.bytes / 4), chunk = std::size_t(shard.chunk);
    const std::size_t nchunks = std::size_t(shard.chunks());
    check(shard.offset + shard.bytes <= f.size() && shard.table + 4 * nchunks <= f.size(), "file ", f.path().string(),
          " is truncated: it is ", f.size(), " bytes but tensor '", t.name, "' shard ", box_string(shard.box),
          " needs bytes up to ", std::max(shard.offset + shard.bytes, shard.table + 4 * nchunks));
    struct Row {
      std::size_t src, dst, count;
    };
    std::vector<Row> rows;
    for_each_row(shard.box, dst.box, inter, [&](std::size_t s, std::size_t d, std::size_t c) {
      rows.push_back({s, d, c});
    });
    // Group rows into runs of chunks; rows in one chunk or neighbouring chunks share one read.
    std::size_t i = 0;
    while (i < rows.size()) {
      std::size_t c0 = whole ? 0 : rows[i].src / chunk,
                  c1 = whole ? nchunks - 1 : (rows[i].src + rows[i].count - 1) / chunk;
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
        direct =
            rows[k].src == rows[k - 1].src + rows[k - 1].count && rows[k].dst == rows[k - 1].dst + rows[k - 1].count;
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
              box_string(shard.box), ", elements ", c * chunk, "..", c * chunk + len,
              "): the file is corrupted; resume from another checkpoint (an earlier step-* directory)");
        whole_crc = crc32_combine(whole_crc, got, 4 * len);
      }
      // A shard read whole is also checked against the manifest (this catches a damaged table too).
      if (e0 == 0 && e1 == n)
        check(whole_crc == shard.crc32, "checksum mismatch in ", f.path().string(), " (tensor '", t.name, "', shard ",
              box_string(shard.box), "): the shard's CRC-32 differs from the manifest");
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

}  // namespace mpar::io
