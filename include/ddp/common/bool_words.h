#pragma once
// The one reading of a bool value on a command line, in an env variable or a config file, so that
// ddp_train and the launcher accept the same words and spellings.

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddp {

// The value of a bool word, in any case: true|yes|on|1 and false|no|off|0; nullopt for others.
std::optional<bool> bool_word(std::string_view text);

// bool_word(text), or InputError "<what>: expected true or false, got '<text>'" for any other
// word; `what` names the option or variable ("--tee", "DDP_LAUNCH_TEE").
bool parse_bool(const std::string& text, const std::string& what);

// Whether the word after the flag args[i] ("--tee true") is its value: only a bool word is, so that
// the next option or a program is never taken for one. The one rule for it, which
// join_bool_values and the launcher's cut between its words and the program's both follow.
bool bool_value_follows(const std::vector<std::string>& args, size_t i);

// The command line's words with every flag in one form, "--name=value", so that an option parser
// (cxxopts reads a flag only alone or with "=") needs no rule of its own for them. A flag
// accepts three spellings:
//   --tee          -> --tee=true
//   --tee false    -> --tee=false  (the next word is taken only when it is a bool word)
//   --tee=false    -> --tee=false
// Any other next word stays where it is ("--tee --epochs 3" keeps "--epochs 3"; a stray word is
// left for the parser to report). Words after "--" are not touched. `is_flag` and `takes_value`
// are asked about each "--name" word, with the name as written and without the dashes; the word
// after an option that `takes_value` is its value, left as it is even when it reads like a flag
// ("--run-id --tee"). Without `takes_value`, only the flags are known.
std::vector<std::string> join_bool_values(
    const std::vector<std::string>& args, const std::function<bool(const std::string&)>& is_flag,
    const std::function<bool(const std::string&)>& takes_value = nullptr);

}  // namespace ddp
