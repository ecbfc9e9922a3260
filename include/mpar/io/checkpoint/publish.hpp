#pragma once
/**
 * @file The publish protocol: a fully written staging directory becomes `step-NNNNNNNN/` and `latest` points at it,
 * each step durable before the next, so a crash at any point leaves the previous checkpoint as `latest`.
 * Part of `mpar/io/checkpoint.hpp` (docs/checkpoints.md).
 */
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "mpar/io/checkpoint/directory.hpp"
#include "mpar/io/checkpoint/options.hpp"
#include "mpar/io/file.hpp"
#include "mpar/io/io_error.hpp"
#include "mpar/io/manifest.hpp"

namespace mpar::io {

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

}  // namespace mpar::io
