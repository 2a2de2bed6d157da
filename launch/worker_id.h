#pragma once
// A worker's id under elastic membership (Note [Elastic membership] in
// ddp/comm/elastic/elastic_keys.h): its node, its local rank, and its incarnation (0 when the
// launcher first starts that local rank, one more at each restart).
//
// Its text is a protocol with the workers and the other nodes' launchers: the workers find it in
// DDP_ELASTIC_ID and name their store keys with it (elastic/ready/<id>, elastic/holds/<id>...), a
// generation lists its members' ids ("0.0,1.1"), a node's events name its workers, and the tests
// read the launcher's log lines ("elastic: worker 1.2.0 (local rank 2) started: pid 4242"). On
// one node it is "<local rank>.<incarnation>"; on several (--nnodes MIN:MAX with MAX > 1),
// "<node>.<local rank>.<incarnation>".

#include <fmt/format.h>

#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

namespace ddp::launch {

struct WorkerId {
  int node = 0;
  int local_rank = 0;
  int incarnation = 0;
  bool several_nodes = false;  // its text names its node

  // The worker that replaces this one.
  WorkerId next_incarnation() const { return {node, local_rank, incarnation + 1, several_nodes}; }
  // "<local rank>.<incarnation>", or "<node>.<local rank>.<incarnation>" on several nodes.
  std::string to_string() const;
  // The text back: two or three numbers (several_nodes when three), each digits only; nullopt
  // for any other text.
  static std::optional<WorkerId> parse(std::string_view text);
};

inline bool operator==(const WorkerId& a, const WorkerId& b) {
  return std::tie(a.node, a.local_rank, a.incarnation, a.several_nodes) ==
         std::tie(b.node, b.local_rank, b.incarnation, b.several_nodes);
}
inline bool operator!=(const WorkerId& a, const WorkerId& b) {
  return !(a == b);
}
inline bool operator<(const WorkerId& a, const WorkerId& b) {
  return std::tie(a.several_nodes, a.node, a.local_rank, a.incarnation) <
         std::tie(b.several_nodes, b.node, b.local_rank, b.incarnation);
}

// "a,b,c", the form of a generation's members and a node's events (comm::format_members).
std::string to_string(const std::vector<WorkerId>& ids);
// That form read back, from the store; throws Error naming the text when an id in it is not one.
std::vector<WorkerId> parse_worker_ids(const std::string& text);

}  // namespace ddp::launch

// An id in a format string is its text: log lines and notices name workers as the protocol does.
template <>
struct fmt::formatter<ddp::launch::WorkerId> : fmt::formatter<std::string_view> {
  template <class Context>
  auto format(const ddp::launch::WorkerId& id, Context& ctx) const {
    return fmt::formatter<std::string_view>::format(id.to_string(), ctx);
  }
};
