#pragma once
/**
 * @file A JSON value and a strict reader for it: enough for mpar's own small files (training plans) and for
 * Hugging Face's `config.json`, with errors that say where the text went wrong (line and column) instead of a guess. Objects keep their keys'
 * order and refuse a key given twice; numbers are doubles; nesting is bounded, so damaged or hostile input
 * ends in a `config_error`, never a crash.
 */
#include <cstddef>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "mpar/core/error.hpp"
#include "mpar/core/json_escapes.hpp"

namespace mpar {

/** @brief One JSON value: null, true/false, a number, a string, an array or an object (keys in text order). */
struct JsonValue {
  using Array = std::vector<JsonValue>;
  using Object = std::vector<std::pair<std::string, JsonValue>>;
  std::variant<std::nullptr_t, bool, double, std::string, Array, Object> value;

  /** "null", "a boolean", "a number", "a string", "an array" or "an object": for error messages. */
  [[nodiscard]] const char* kind() const {
    static constexpr const char* names[] = {"null", "a boolean", "a number", "a string", "an array", "an object"};
    return names[value.index()];
  }
  [[nodiscard]] const double* number() const { return std::get_if<double>(&value); }
  [[nodiscard]] const bool* boolean() const { return std::get_if<bool>(&value); }
  [[nodiscard]] const std::string* string() const { return std::get_if<std::string>(&value); }
  [[nodiscard]] const Array* array() const { return std::get_if<Array>(&value); }
  [[nodiscard]] const Object* object() const { return std::get_if<Object>(&value); }
};

namespace detail {

class JsonReader {
 public:
  explicit JsonReader(std::string_view text) : s_(text) {}

  JsonValue document() {
    JsonValue v = value(0);
    skip_space();
    if (i_ < s_.size()) fail("text after the end of the JSON value");
    return v;
  }

 private:
  static constexpr std::size_t max_depth = 64;

  [[noreturn]] void fail(std::string_view what) const {
    std::size_t line = 1, column = 1;
    for (std::size_t k = 0; k < i_ && k < s_.size(); ++k) {
      if (s_[k] == '\n')
        ++line, column = 1;
      else
        ++column;
    }
    throw config_error(detail::cat("JSON: line ", line, ", column ", column, ": ", what,
                                   i_ >= s_.size() ? " (the text ends here: truncated?)" : ""));
  }
  void skip_space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  [[nodiscard]] bool at_end() const { return i_ >= s_.size(); }
  void expect(char c, std::string_view where) {
    skip_space();
    if (at_end() || s_[i_] != c) fail(detail::cat("expected '", c, "' ", where));
    ++i_;
  }
  bool literal(std::string_view word) {
    if (s_.substr(i_, word.size()) != word) return false;
    i_ += word.size();
    return true;
  }

  JsonValue value(std::size_t depth) {
    if (depth > max_depth) fail("nested deeper than 64 arrays or objects");
    skip_space();
    if (at_end()) fail("expected a value");
    const char c = s_[i_];
    if (c == '{') return object(depth);
    if (c == '[') return array(depth);
    if (c == '"') return JsonValue{string()};
    if (literal("true")) return JsonValue{true};
    if (literal("false")) return JsonValue{false};
    if (literal("null")) return JsonValue{nullptr};
    if (c == '-' || (c >= '0' && c <= '9')) return JsonValue{number()};
    fail(detail::cat("expected a value, found '", c, "'"));
  }

  JsonValue object(std::size_t depth) {
    ++i_;  // '{'
    JsonValue::Object out;
    skip_space();
    if (!at_end() && s_[i_] == '}') return ++i_, JsonValue{std::move(out)};
    while (true) {
      skip_space();
      if (at_end() || s_[i_] != '"') fail("expected a key in double quotes");
      std::string key = string();
      for (const auto& kv : out)
        if (kv.first == key) fail(detail::cat("the key \"", key, "\" is given twice"));
      expect(':', detail::cat("after the key \"", key, "\""));
      JsonValue v = value(depth + 1);
      out.emplace_back(std::move(key), std::move(v));
      skip_space();
      if (!at_end() && s_[i_] == ',') {
        ++i_;
        continue;
      }
      expect('}', "or ',' after an object's value");
      return JsonValue{std::move(out)};
    }
  }

  JsonValue array(std::size_t depth) {
    ++i_;  // '['
    JsonValue::Array out;
    skip_space();
    if (!at_end() && s_[i_] == ']') return ++i_, JsonValue{std::move(out)};
    while (true) {
      out.push_back(value(depth + 1));
      skip_space();
      if (!at_end() && s_[i_] == ',') {
        ++i_;
        continue;
      }
      expect(']', "or ',' after an array's element");
      return JsonValue{std::move(out)};
    }
  }

  std::string string() {
    ++i_;  // '"'
    std::string out;
    while (true) {
      if (at_end()) fail("a string without its closing '\"'");
      const char c = s_[i_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("a control character inside a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (at_end()) fail("a string without its closing '\"'");
      const char e = s_[i_++];
      if (const auto unescaped = detail::json_simple_escape(e)) {
        out += *unescaped;
        continue;
      }
      if (e != 'u') {
        --i_;
        fail(detail::cat("an unknown escape '\\", e, "' inside a string"));
      }
      unsigned code = 0;
      for (int k = 0; k < 4; ++k, ++i_) {
        if (at_end()) fail("a \\u escape cut short");
        const int digit = detail::json_hex_digit(s_[i_]);
        if (digit < 0) fail("a \\u escape needs four hex digits");
        code = code * 16 + unsigned(digit);
      }
      // Surrogate pairs are kept as two units: plan files hold ASCII names.
      detail::append_utf8(out, code);
    }
  }

  double number() {
    const std::size_t from = i_;
    if (s_[i_] == '-') ++i_;
    const auto digits = [&] {
      const std::size_t d = i_;
      while (!at_end() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
      return i_ - d;
    };
    if (digits() == 0) fail("a number needs digits");
    if (!at_end() && s_[i_] == '.') {
      ++i_;
      if (digits() == 0) fail("a number needs digits after its '.'");
    }
    if (!at_end() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      ++i_;
      if (!at_end() && (s_[i_] == '+' || s_[i_] == '-')) ++i_;
      if (digits() == 0) fail("a number needs digits in its exponent");
    }
    const std::string text(s_.substr(from, i_ - from));
    return std::strtod(text.c_str(), nullptr);
  }

  std::string_view s_;
  std::size_t i_ = 0;
};

}  // namespace detail

/** Parses one JSON document (whitespace around it only); throws config_error naming the line and column. */
[[nodiscard]] inline JsonValue parse_json(std::string_view text) { return detail::JsonReader(text).document(); }

/** `s` as a JSON string literal, quotes and escapes included. */
[[nodiscard]] inline std::string json_quoted(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\', out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      static constexpr char hex[] = "0123456789abcdef";
      out += "\\u00", out += hex[(c >> 4) & 0xF], out += hex[c & 0xF];
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace mpar
