#pragma once
/**
 * @file A small command-line option parser for mpar's tools and examples.
 *
 * Options bind to variables, whose values on entry are the defaults:
 * ```
 * int tp = 1; std::string dir; bool single = false; double lr = 3e-4;
 * cli::Parser p("mpar-ckpt convert", "Converts a checkpoint to another layout.");
 * p.positional("DIR", dir, "checkpoint to read");
 * p.option("tp", tp, "tensor-parallel size").range(1, 4096);
 * p.option("lr", lr, "learning rate").range(0.0, 1.0).required();
 * p.flag("single", single, "write one shard per tensor");
 * if (!p.parse(argc, argv)) { std::cout << p.help(); return 0; }  // --help
 * ```
 * Accepted forms: `--name value`, `--name=value`, flags as `--name`, `--` ends options. Every error is
 * a `cli::usage_error` naming the option, what was wrong and what to give instead.
 */
#include <algorithm>
#include <charconv>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "mpar/cli/detail/option_value.hpp"
#include "mpar/core/error.hpp"

namespace mpar::cli {

/** @brief A command line that cannot be accepted; the message says which option and what to change. */
class usage_error : public config_error {
 public:
  using config_error::config_error;
};

namespace detail {

template <class T>
constexpr const char* kind_name() {
  if constexpr (std::same_as<T, std::string>)
    return "a string";
  else if constexpr (std::unsigned_integral<T>)
    return "a non-negative integer";
  else if constexpr (std::integral<T>)
    return "an integer";
  else
    return "a number";
}

template <class T>
std::string show(const T& v) {
  if constexpr (std::same_as<T, std::string>)
    return "'" + v + "'";
  else {
    std::ostringstream os;
    os << v;
    return os.str();
  }
}

/** Parses the whole of `s` as a T; nullopt with `why` set otherwise. */
template <mpar::cli::detail::option_value T>
std::optional<T> parse_value(std::string_view s, std::string& why) {
  if constexpr (std::same_as<T, std::string>) {
    return std::string(s);
  } else {
    T v{};
    const char* b = s.data();
    const char* e = s.data() + s.size();
    if (!s.empty() && *b == '+') ++b;  // from_chars does not take a plus sign
    auto [p, ec] = std::from_chars(b, e, v);
    if (ec == std::errc::result_out_of_range) {
      why = "the value does not fit the range of " + std::string(kind_name<T>()) + " here";
      return std::nullopt;
    }
    if (ec != std::errc{} || p != e || s.empty()) {
      why = "expected " + std::string(kind_name<T>());
      return std::nullopt;
    }
    if constexpr (std::floating_point<T>)
      if (!std::isfinite(v)) {
        why = "expected a finite number";
        return std::nullopt;
      }
    return v;
  }
}

inline std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace detail

/** @brief One declared option or positional argument; chain `.required()`, `.range(lo, hi)`, `.metavar(...)`. */
class Option {
 public:
  /** The option must be given (its default is not used). */
  Option& required() {
    required_ = true;
    return *this;
  }
  /** Accept only values in `[lo, hi]` (numbers only). */
  Option& range(long double lo, long double hi) {
    if (!numeric_) throw std::logic_error("cli: range() on non-numeric option --" + name_);
    lo_ = lo;
    hi_ = hi;
    ranged_ = true;
    return *this;
  }
  /** The placeholder shown in the help text (`N`, `DIR`, ...). */
  Option& metavar(std::string m) {
    metavar_ = std::move(m);
    return *this;
  }

 private:
  friend class Parser;
  std::string name_, help_, metavar_, default_text_, kind_;
  bool positional_ = false, flag_ = false, required_ = false, numeric_ = false, ranged_ = false, given_ = false;
  long double lo_ = 0, hi_ = 0;
  std::vector<std::string> choices_;
  /** Parses and stores a value; returns an empty string or what was wrong with it. */
  std::function<std::string(std::string_view)> set_;
  std::function<long double(std::string_view)> as_number_;
};

/** @brief Declares options, parses a command line into bound variables, and prints help. */
class Parser {
 public:
  explicit Parser(std::string program, std::string description = "")
      : program_(std::move(program)), description_(std::move(description)) {}

  /** `--name VALUE` bound to `target` (an integer, floating point or string). */
  template <mpar::cli::detail::option_value T>
  Option& option(std::string name, T& target, std::string help) {
    Option& o = add(std::move(name), std::move(help));
    o.kind_ = detail::kind_name<T>();
    o.numeric_ = !std::same_as<T, std::string>;
    o.metavar_ = std::same_as<T, std::string> ? "S" : std::floating_point<T> ? "X" : "N";
    o.default_text_ = detail::show(target);
    o.set_ = [&target](std::string_view s) {
      std::string why;
      auto v = detail::parse_value<T>(s, why);
      if (!v) return why + ", got '" + std::string(s) + "'";
      target = std::move(*v);
      return std::string();
    };
    if constexpr (!std::same_as<T, std::string>)
      o.as_number_ = [](std::string_view s) {
        std::string why;
        return static_cast<long double>(*detail::parse_value<T>(s, why));
      };
    return o;
  }

  /** `--name` sets `target` to true. */
  Option& flag(std::string name, bool& target, std::string help) {
    Option& o = add(std::move(name), std::move(help));
    o.flag_ = true;
    o.kind_ = "a flag";
    o.set_ = [&target](std::string_view) {
      target = true;
      return std::string();
    };
    return o;
  }

  /** `--name WORD` where WORD is one of `choices`; stores the value paired with it. */
  template <class T>
  Option& choice(std::string name, T& target, std::vector<std::pair<std::string, T>> choices, std::string help) {
    Option& o = add(std::move(name), std::move(help));
    o.kind_ = "one of the listed words";
    for (const auto& [word, value] : choices) {
      o.choices_.push_back(word);
      if (value == target) o.default_text_ = word;
    }
    o.metavar_ = "WORD";
    o.set_ = [&target, choices = std::move(choices)](std::string_view s) {
      for (const auto& [word, value] : choices)
        if (word == s) {
          target = value;
          return std::string();
        }
      std::string list;
      for (const auto& c : choices) list += (list.empty() ? "" : ", ") + c.first;
      return "'" + std::string(s) + "' is not one of: " + list;
    };
    return o;
  }

  /** A required positional argument, in declaration order. */
  template <mpar::cli::detail::option_value T>
  Option& positional(std::string name, T& target, std::string help) {
    Option& o = option(std::move(name), target, std::move(help));
    o.positional_ = true;
    o.required_ = true;
    o.metavar_ = o.name_;
    return o;
  }

  /**
   * Parses `argv[1..argc)`. Returns false if help was asked for (`--help` or `-h`; print `help()`),
   * true otherwise; throws usage_error on any mistake.
   */
  bool parse(int argc, const char* const* argv) {
    std::vector<std::string_view> args;
    for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
    return parse(args);
  }
  bool parse(const std::vector<std::string_view>& args) {
    std::size_t next_positional = 0;
    bool only_positionals = false;
    for (std::size_t i = 0; i < args.size(); ++i) {
      const std::string_view a = args[i];
      if (!only_positionals && (a == "--help" || a == "-h")) return false;
      if (!only_positionals && a == "--") {
        only_positionals = true;
        continue;
      }
      if (!only_positionals && a.size() > 2 && a.starts_with("--")) {
        const std::size_t eq = a.find('=');
        const std::string name(a.substr(2, eq == std::string_view::npos ? std::string_view::npos : eq - 2));
        Option* o = find(name);
        if (!o) fail("unknown option --", name, suggestion(name), "; see --help");
        if (o->given_) fail("option --", name, " is given twice; give it once");
        if (o->flag_) {
          if (eq != std::string_view::npos)
            fail("option --", name, " is a flag and takes no value; write just --", name);
          assign(*o, "");
          continue;
        }
        std::string_view value;
        if (eq != std::string_view::npos) {
          value = a.substr(eq + 1);
        } else {
          if (i + 1 >= args.size() || (args[i + 1].starts_with("--") && args[i + 1].size() > 2))
            fail("option --", name, " needs a value (", o->kind_, "), e.g. --", name, " ", o->metavar_);
          value = args[++i];
        }
        assign(*o, value);
        continue;
      }
      if (!only_positionals && a.size() > 1 && a[0] == '-' && !(a[1] >= '0' && a[1] <= '9') && a[1] != '.')
        fail("unknown option ", a, "; options are spelled --name (see --help)");
      while (next_positional < options_.size() && !options_[next_positional]->positional_) ++next_positional;
      if (next_positional >= options_.size()) fail("unexpected argument '", a, "'; see --help");
      assign(*options_[next_positional++], a);
    }
    for (const auto& o : options_)
      if (o->required_ && !o->given_) {
        if (o->positional_) fail("missing argument ", o->name_, " (", o->help_, ")");
        fail("missing required option --", o->name_, " (", o->help_, ")");
      }
    return true;
  }

  /** Whether the option or argument `name` appeared on the command line. */
  [[nodiscard]] bool given(std::string_view name) const {
    for (const auto& o : options_)
      if (o->name_ == name) return o->given_;
    return false;
  }

  /** The usage line, the description, and one line per argument and option. */
  [[nodiscard]] std::string help() const {
    std::ostringstream os;
    os << "usage: " << program_ << " [options]";
    for (const auto& o : options_)
      if (o->positional_) os << ' ' << o->name_;
    os << "\n";
    if (!description_.empty()) os << "\n" << description_ << "\n";
    bool any_pos = false;
    for (const auto& o : options_) any_pos = any_pos || o->positional_;
    if (any_pos) {
      os << "\narguments:\n";
      for (const auto& o : options_)
        if (o->positional_) os << "  " << pad(o->name_) << o->help_ << "\n";
    }
    os << "\noptions:\n";
    for (const auto& o : options_) {
      if (o->positional_) continue;
      std::string head = "--" + o->name_ + (o->flag_ ? "" : " " + o->metavar_);
      os << "  " << pad(head) << o->help_;
      std::vector<std::string> notes;
      if (!o->choices_.empty()) {
        std::string list;
        for (const auto& c : o->choices_) list += (list.empty() ? "" : "|") + c;
        notes.push_back(list);
      }
      if (o->ranged_) notes.push_back("in [" + num(o->lo_) + ", " + num(o->hi_) + "]");
      if (o->required_)
        notes.push_back("required");
      else if (!o->flag_ && !o->default_text_.empty())
        notes.push_back("default " + o->default_text_);
      if (!notes.empty()) {
        os << " (";
        for (std::size_t k = 0; k < notes.size(); ++k) os << (k ? ", " : "") << notes[k];
        os << ")";
      }
      os << "\n";
    }
    os << "  " << pad("--help") << "print this help\n";
    return os.str();
  }

 private:
  template <class... P>
  [[noreturn]] void fail(P&&... parts) const {
    throw usage_error(mpar::detail::cat(program_, ": ", std::forward<P>(parts)...));
  }

  Option& add(std::string name, std::string help) {
    if (name.empty() || find(name) || name == "help")
      throw std::logic_error("cli: option name '" + name + "' is empty, reserved or declared twice");
    options_.push_back(std::make_unique<Option>());
    Option& o = *options_.back();
    o.name_ = std::move(name);
    o.help_ = std::move(help);
    return o;
  }

  Option* find(std::string_view name) const {
    for (const auto& o : options_)
      if (!o->positional_ && o->name_ == name) return o.get();
    return nullptr;
  }

  std::string suggestion(std::string_view name) const {
    const Option* best = nullptr;
    std::size_t dist = 3;  // suggest only close spellings
    for (const auto& o : options_)
      if (!o->positional_) {
        const std::size_t d = detail::edit_distance(name, o->name_);
        if (d < dist) {
          dist = d;
          best = o.get();
        }
      }
    return best ? " (did you mean --" + best->name_ + "?)" : "";
  }

  void assign(Option& o, std::string_view value) {
    const std::string what = o.positional_ ? "argument " + o.name_ : "option --" + o.name_;
    const std::string why = o.set_(value);
    if (!why.empty()) fail(what, ": ", why);
    if (o.ranged_) {
      const long double v = o.as_number_(value);
      if (v < o.lo_ || v > o.hi_)
        fail(what, ": ", value, " is out of range; give a value in [", num(o.lo_), ", ", num(o.hi_), "]");
    }
    o.given_ = true;
  }

  /** The shortest text that reads back as the same double: a bound of 0.9 prints as 0.9, not 0.90000000000000002. */
  static std::string num(long double v) {
    char buf[32];
    const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, double(v));
    return ec == std::errc() ? std::string(buf, end) : std::to_string(double(v));
  }
  static std::string pad(const std::string& s) {
    return s.size() >= 22 ? s + "  " : s + std::string(22 - s.size(), ' ');
  }

  std::string program_, description_;
  std::vector<std::unique_ptr<Option>> options_;
};

}  // namespace mpar::cli
