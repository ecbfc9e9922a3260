#pragma once
/**
 * @file `ShardFileWriter`: appends shards to one rank's data file, each followed by its chunk CRC table.
 * Part of `mpar/io/checkpoint.hpp` (docs/checkpoints.md).
 */
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "mpar/io/checkpoint/options.hpp"
#include "mpar/io/crc32.hpp"
#include "mpar/io/file.hpp"
#include "mpar/io/io_error.hpp"
#include "mpar/io/manifest.hpp"

namespace mpar::io {

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

}  // namespace mpar::io
