#include "ddp/common/bool_words.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "ddp/common/error.h"

namespace ddp {

std::optional<bool> bool_word(std::string_view text) {
  std::string t(text);
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return std::tolower(c); });
  if (t == "true" || t == "yes" || t == "on" || t == "1") return true;
  if (t == "false" || t == "no" || t == "off" || t == "0") return false;
  return std::nullopt;
}

bool parse_bool(const std::string& text, const std::string& what) {
  const std::optional<bool> value = bool_word(text);
  if (!value) throw InputError(fmt::format("{}: expected true or false, got '{}'", what, text));
  return *value;
}

bool bool_value_follows(const std::vector<std::string>& args, size_t i) {
  return i + 1 < args.size() && bool_word(args[i + 1]).has_value();
}

std::vector<std::string> join_bool_values(
    const std::vector<std::string>& args, const std::function<bool(const std::string&)>& is_flag,
    const std::function<bool(const std::string&)>& takes_value) {
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--") {  // what follows is positional, whatever it looks like
      out.insert(out.end(), args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
      break;
    }
    const bool option = args[i].rfind("--", 0) == 0;
    if (option && takes_value && i + 1 < args.size() && takes_value(args[i].substr(2))) {
      out.push_back(args[i]);
      out.push_back(args[++i]);
      continue;
    }
    if (!option || !is_flag(args[i].substr(2))) {
      out.push_back(args[i]);
      continue;
    }
    const bool value_follows = bool_value_follows(args, i);
    out.push_back(args[i] + "=" + (value_follows ? args[i + 1] : std::string("true")));
    if (value_follows) ++i;
  }
  return out;
}

}  // namespace ddp
