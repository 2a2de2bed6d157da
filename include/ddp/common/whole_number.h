#pragma once
// The one reading of an integer written as a whole text (an option's value, an env variable, a
// config value, a number in a file's name): each caller keeps its own message and range words.

#include <charconv>
#include <optional>
#include <string_view>

namespace ddp {

// The integer `text` spells, digits with an optional leading '-' and nothing before or after
// (no space, no '+'), within [min, max]; nullopt for any other text.
template <typename T>
std::optional<T> whole_number(std::string_view text, T min, T max) {
  T value{};
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end || value < min || value > max) {
    return std::nullopt;
  }
  return value;
}

}  // namespace ddp
