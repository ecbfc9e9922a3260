#pragma once
/**
 * @file Blocks from the objects a trainer holds: parameters (`nn::Parameter`) and optimizer states
 * shaped like them, whole or as flat ZeRO-1 ranges.
 *
 * Naming convention: a parameter's value is saved under its name; a state under
 * `<parameter name>/<state>`, e.g. `block0.fc1.weight/adamw.m`. States carry the parameter's global
 * shape and box, so they reshard exactly like the parameter (and load into any layout, with or
 * without ZeRO).
 */
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mpar/io/checkpoint.hpp"
#include "mpar/nn/parameter.hpp"

namespace mpar::io {

/** @brief The name a state of parameter `param` is saved under. */
[[nodiscard]] inline std::string state_name(std::string_view param, std::string_view state) {
  return std::string(param) + "/" + std::string(state);
}

/** @brief The block of `data` laid out like `p`'s local value (same shape, box and layout), named `name`. */
template <class T>
[[nodiscard]] BlockView<T> block_like(const nn::Parameter& p, std::string name, std::span<T> data) {
  detail::check(data.size() == p.local_size(), "checkpoint block '", name, "': ", data.size(),
                " values but parameter '", p.name, "' holds ", p.local_size(), " locally");
  return BlockView<T>{std::move(name), p.global_shape, BoxN(p.local_box.begin(), p.local_box.end()), p.layout, data};
}

/** @brief A parameter's value, to save. */
[[nodiscard]] inline SaveBlock save_block(const nn::Parameter& p) {
  return block_like(p, p.name, std::span<const float>(p.value));
}
/** @brief A parameter's value, to load into. */
[[nodiscard]] inline LoadBlock load_block(nn::Parameter& p) { return block_like(p, p.name, std::span<float>(p.value)); }

/** @brief A state of `p` with one value per local element (e.g. an AdamW moment without ZeRO). */
template <class T>
[[nodiscard]] BlockView<T> state_block(const nn::Parameter& p, std::string_view state, std::span<T> data) {
  return block_like(p, state_name(p.name, state), data);
}

/**
 * @brief A ZeRO-1 flat state range: `data` holds elements `[flat_begin, flat_begin + data.size())`
 * of `p`'s local block in row-major order. Returned as at most `2 * rank + 1` boxes of the
 * parameter's global tensor, so they reshard like any block (a range that starts or ends inside a
 * row becomes separate boxes).
 */
template <class T>
[[nodiscard]] std::vector<BlockView<T>> flat_state_blocks(const nn::Parameter& p, std::string_view state,
                                                          std::size_t flat_begin, std::span<T> data) {
  detail::check(flat_begin + data.size() <= p.local_size(), "checkpoint state '", state_name(p.name, state),
                "': flat range ", flat_begin, "..", flat_begin + data.size(), " exceeds the ", p.local_size(),
                " local elements of parameter '", p.name, "'");
  std::vector<BlockView<T>> out;
  for (auto& piece :
       flat_range_boxes(BoxN(p.local_box.begin(), p.local_box.end()), flat_begin, flat_begin + data.size()))
    out.push_back(BlockView<T>{state_name(p.name, state), p.global_shape, piece.box, p.layout + " (flat)",
                               data.subspan(piece.flat_offset, volume(piece.box))});
  return out;
}

}  // namespace mpar::io
