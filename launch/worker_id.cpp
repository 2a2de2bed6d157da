#include "worker_id.h"

#include <limits>

#include "ddp/comm/elastic/elastic_keys.h"
#include "ddp/common/error.h"
#include "ddp/common/whole_number.h"

namespace ddp::launch {
namespace {

// A number of the id's text as to_string writes it: digits only, no sign, no leading zero, no
// space, within int (so that the text read back is written back byte for byte).
std::optional<int> number_of(std::string_view text) {
  if (text.empty() || text.front() == '-' || (text.size() > 1 && text.front() == '0')) {
    return std::nullopt;  // "-0" and "07" would not be written back as they are
  }
  return whole_number(text, 0, std::numeric_limits<int>::max());
}

}  // namespace

std::string WorkerId::to_string() const {
  return several_nodes ? fmt::format("{}.{}.{}", node, local_rank, incarnation)
                       : fmt::format("{}.{}", local_rank, incarnation);
}

std::optional<WorkerId> WorkerId::parse(std::string_view text) {
  std::vector<int> numbers;
  while (true) {
    const size_t dot = text.find('.');
    const auto number = number_of(text.substr(0, dot));
    if (!number || numbers.size() == 3) return std::nullopt;
    numbers.push_back(*number);
    if (dot == std::string_view::npos) break;
    text.remove_prefix(dot + 1);
  }
  if (numbers.size() == 2) return WorkerId{0, numbers[0], numbers[1], false};
  if (numbers.size() == 3) return WorkerId{numbers[0], numbers[1], numbers[2], true};
  return std::nullopt;
}

std::string to_string(const std::vector<WorkerId>& ids) {
  std::vector<std::string> texts;
  for (const auto& id : ids) texts.push_back(id.to_string());
  return comm::format_members(texts);
}

std::vector<WorkerId> parse_worker_ids(const std::string& text) {
  std::vector<WorkerId> ids;
  for (const auto& member : comm::parse_members(text)) {
    const auto id = WorkerId::parse(member);
    if (!id) {
      throw Error(
          fmt::format("elastic: '{}' in '{}' is not a worker id (<local rank>.<incarnation>, or "
                      "<node>.<local rank>.<incarnation> on several nodes)",
                      member, text));
    }
    ids.push_back(*id);
  }
  return ids;
}

}  // namespace ddp::launch
