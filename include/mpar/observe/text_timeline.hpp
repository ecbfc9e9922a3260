#pragma once
/**
 * @file A text timeline for terminals: one line per row, time flowing right, each interval drawn
 * with its label, idle time as dots.
 *
 * ```
 * rank 0 |F0 F1 F2 F3 B0    B1    B2    B3    |
 * rank 1 |...F0 F1 F2 F3 B0    B1 ...
 * ```
 */
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace mpar::observe {

/** @brief One labelled interval on row `row`, in arbitrary but consistent time units. */
struct TimelineSpan {
  int row = 0;
  double start = 0;
  double end = 0;
  std::string label;
};

/**
 * @brief Renders spans as text. `unit` is the time one cell stands for (typically the cost of a
 * forward), drawn `cell_width` characters wide; when the picture would exceed `max_width`
 * characters, cells shrink so that it fits (labels are then cut).
 */
[[nodiscard]] inline std::string render_text_timeline(const std::vector<std::string>& row_names,
                                                      const std::vector<TimelineSpan>& spans, double unit,
                                                      int cell_width = 3, int max_width = 200) {
  double end = 0;
  for (const auto& s : spans) end = std::max(end, s.end);
  std::size_t name_w = 0;
  for (const auto& n : row_names) name_w = std::max(name_w, n.size());
  if (unit <= 0) unit = end > 0 ? end / 40 : 1;
  double chars_per_unit = cell_width;
  const double avail = double(std::max<int>(20, max_width - int(name_w) - 3));
  if (end / unit * chars_per_unit > avail) chars_per_unit = avail * unit / end;
  const auto width = std::size_t(std::ceil(end / unit * chars_per_unit - 1e-9));
  std::vector<std::string> grid(row_names.size(), std::string(width, '.'));
  auto col = [&](double t) { return std::min(width, std::size_t(std::lround(t / unit * chars_per_unit))); };
  for (const auto& s : spans) {
    if (s.row < 0 || std::size_t(s.row) >= grid.size()) continue;
    const std::size_t a = col(s.start), b = std::max(col(s.end), a + 1);
    auto& line = grid[std::size_t(s.row)];
    for (std::size_t c = a; c < std::min(b, width); ++c) {
      const std::size_t k = c - a;
      // The label first, then spaces: a busy span never shows the idle dots.
      line[c] = k < s.label.size() ? s.label[k] : ' ';
    }
  }
  std::string out;
  for (std::size_t r = 0; r < grid.size(); ++r) {
    std::string name = row_names[r];
    name.resize(name_w, ' ');
    out += name + " |" + grid[r] + "|\n";
  }
  return out;
}

}  // namespace mpar::observe
