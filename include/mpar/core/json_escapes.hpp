#pragma once
/** @file The pieces of a JSON string's escapes that mpar's two JSON readers (safetensors headers, plan files) share. */
#include <optional>
#include <string>

namespace mpar::detail {

/** The character a one-letter JSON escape (`\"`, `\\`, `\/`, `\b`, `\f`, `\n`, `\r`, `\t`) stands for; none for others. */
[[nodiscard]] constexpr std::optional<char> json_simple_escape(char e) {
  switch (e) {
    case '"':
    case '\\':
    case '/':
      return e;
    case 'b':
      return '\b';
    case 'f':
      return '\f';
    case 'n':
      return '\n';
    case 'r':
      return '\r';
    case 't':
      return '\t';
    default:
      return std::nullopt;
  }
}

/** The value of one hexadecimal digit of a `\u` escape, or -1. */
[[nodiscard]] constexpr int json_hex_digit(char h) {
  return h >= '0' && h <= '9'   ? h - '0'
         : h >= 'a' && h <= 'f' ? h - 'a' + 10
         : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                : -1;
}

/** Appends the UTF-8 encoding of a code unit below 0x10000 (what one `\u` escape names). */
inline void append_utf8(std::string& out, unsigned code) {
  if (code < 0x80) {
    out += char(code);
  } else if (code < 0x800) {
    out += char(0xC0 | (code >> 6));
    out += char(0x80 | (code & 0x3F));
  } else {
    out += char(0xE0 | (code >> 12));
    out += char(0x80 | ((code >> 6) & 0x3F));
    out += char(0x80 | (code & 0x3F));
  }
}

}  // namespace mpar::detail
