#pragma once
/**
 * @file The directory layout of a checkpoint root (`latest`, `step-NNNNNNNN/`, `manifest.txt`, `rank-NNNNN.bin`):
 * the names, `resolve_checkpoint` (which directory a path designates) and `read_manifest`.
 * Part of `mpar/io/checkpoint.hpp` (docs/checkpoints.md).
 */
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>

#include "mpar/io/file.hpp"
#include "mpar/io/io_error.hpp"
#include "mpar/io/manifest.hpp"

namespace mpar::io {

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
  const bool plain =
      !name.empty() && name.size() <= 255 && name != "." && name != ".." &&
      name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") == std::string::npos;
  detail::check(plain, "file ", latest.string(), " does not name a checkpoint directory: it holds '",
                detail::printable(name), "' (", name.size(),
                " bytes); write the name of a step directory into it, e.g. ", step_dir_name(0));
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

}  // namespace mpar::io
