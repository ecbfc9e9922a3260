#pragma once
/**
 * @file What a trainer checks before it loads a checkpoint: that it is of the same run (`RunIdentity`), and that
 * this model loads every tensor it holds (`check_loads_every_tensor`); and which optimizer saved it
 * (`saved_optimizer`). docs/checkpoints.md.
 */
#include <cstdint>
#include <filesystem>
#include <map>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "mpar/core/error.hpp"
#include "mpar/io/checkpoint/block_key.hpp"
#include "mpar/io/checkpoint/gather_keys.hpp"
#include "mpar/io/manifest.hpp"

namespace mpar::train {

/**
 * @brief What a checkpoint records of a run (its manifest's `user` entries) and a resume must find unchanged: the
 * data's identity (`data.vocab`, `data.tokens`, `data.hash`), the seeds, the model's shape.
 */
struct RunIdentity {
  std::map<std::string, std::string> entries;  ///< key → this run's value
  /// key → the option that sets it, named in the refusal (`--layers`); a key without one is named as itself.
  std::map<std::string, std::string> options;
  /// key → what a run (or an older checkpoint) without the entry means: compared even when one side lacks it. Other
  /// entries an older checkpoint lacks are not compared.
  std::map<std::string, std::string> defaults;

  /**
   * Throws `config_error` naming every difference between `saved` (the checkpoint in `dir`) and this run, and the
   * fix. The data is compared by vocabulary first: another vocabulary means token ids of other meanings.
   */
  void check_same_run(const io::Manifest& saved, const std::filesystem::path& dir) const {
    const auto& u = saved.state.user;
    auto value_in = [&](const std::map<std::string, std::string>& m, const std::string& key) -> const std::string* {
      if (auto it = m.find(key); it != m.end()) return &it->second;
      if (auto it = defaults.find(key); it != defaults.end()) return &it->second;
      return nullptr;
    };
    std::vector<std::string> diffs;
    const std::string* vocab = value_in(u, "data.vocab");
    const std::string* hash = value_in(u, "data.hash");
    if (vocab && value_in(entries, "data.vocab") && *vocab != *value_in(entries, "data.vocab"))
      diffs.push_back(mpar::detail::cat("the data has another vocabulary (", *vocab, " token ids in the checkpoint, ",
                                        *value_in(entries, "data.vocab"),
                                        " now), so token ids would mean other characters or tokens"));
    else if (hash && value_in(entries, "data.hash") && *hash != *value_in(entries, "data.hash"))
      diffs.push_back(mpar::detail::cat(
          "the data differs (", value_in(u, "data.tokens") ? *value_in(u, "data.tokens") : "?", " tokens with hash ",
          *hash, " in the checkpoint, ", value_in(entries, "data.tokens") ? *value_in(entries, "data.tokens") : "?",
          " with hash ", *value_in(entries, "data.hash"), " now; a text's hash covers which character each id means)"));
    std::set<std::string> keys;
    for (const auto& [k, v] : entries) keys.insert(k);
    for (const auto& [k, v] : defaults) keys.insert(k);
    for (const auto& key : keys) {
      if (key.starts_with("data.") && key != "data.seed") continue;  // compared above
      const std::string *then = value_in(u, key), *now = value_in(entries, key);
      if (!then || !now || *then == *now) continue;
      const auto option = options.find(key);
      diffs.push_back(mpar::detail::cat(option == options.end() ? key : option->second, " ", *then,
                                        " in the checkpoint (", key, "), ", *now, " now"));
    }
    if (diffs.empty()) return;
    std::string list;
    for (const auto& d : diffs) list += (list.empty() ? "" : "; ") + d;
    throw config_error(mpar::detail::cat("resume: checkpoint ", dir.string(),
                                         " is of another run and cannot continue this one: ", list,
                                         ". Resume with the checkpoint's settings and data, or train from scratch "
                                         "without --resume"));
  }
};

/**
 * @brief Collective over `world`: throws `config_error` on every rank when checkpoint `saved` (in `dir`) holds a
 * tensor that no rank loads — `loaded` are the names this rank loads — since it would be dropped silently (a deeper
 * model's blocks, say). Optimizer states (`<parameter>/<state>`) count only `with_states`.
 */
template <class C>
void check_loads_every_tensor(C& world, const io::Manifest& saved, const std::vector<std::string>& loaded,
                              bool with_states, const std::filesystem::path& dir) {
  auto key_of = [](const std::string& name) { return io::detail::block_key(name, {}, {}); };
  std::set<std::uint64_t> mine_set;
  for (const auto& n : loaded) mine_set.insert(key_of(n));
  const std::vector<std::uint64_t> mine(mine_set.begin(), mine_set.end());
  std::set<std::uint64_t> anywhere;
  for (const auto& keys : io::detail::all_gather_keys(world, std::span<const std::uint64_t>(mine)))
    anywhere.insert(keys.begin(), keys.end());
  std::vector<std::string> extra;
  for (const auto& t : saved.tensors) {
    const bool state = t.name.find('/') != std::string::npos;
    if (state && !with_states) continue;
    if (!anywhere.contains(key_of(t.name))) extra.push_back(t.name);
  }
  if (extra.empty()) return;
  std::string names;
  for (std::size_t k = 0; k < extra.size() && k < 4; ++k) names += (k ? ", " : "") + extra[k];
  if (extra.size() > 4) names += mpar::detail::cat(" and ", extra.size() - 4, " more");
  throw config_error(mpar::detail::cat("resume: checkpoint ", dir.string(), " holds ", extra.size(),
                                       " tensor(s) this model lacks (", names,
                                       "): it was saved from a larger or different model, and resuming would drop "
                                       "them; resume with the checkpoint's model settings"));
}

/** The optimizer checkpoint `saved` was saved with (older checkpoints: AdamW if they hold its step count). */
inline std::string saved_optimizer(const io::Manifest& saved) {
  const auto& u = saved.state.user;
  if (auto it = u.find("optimizer"); it != u.end()) {
    if (it->second == "sgd" && !u.contains("sgd.steps")) return "sgd (an older checkpoint without momentum)";
    return it->second;
  }
  return u.contains("adamw.steps") ? "adamw" : "sgd (an older checkpoint without momentum)";
}

}  // namespace mpar::train
