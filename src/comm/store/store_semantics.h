#pragma once
// Private: what the job's rendezvous store does with the requests of its clients, c10d's Store
// semantics, as a pure function of the keys and one request. The server (store_server.h) keeps
// the connections, the requests that wait for keys and their deadlines; here is none of that, as
// Horovod keeps its gloo store's semantics apart from their transport
// (horovod/common/gloo/memory_store.cc).

#include <chrono>
#include <map>
#include <optional>
#include <string>

#include "ddp/comm/store/store_protocol.h"

namespace ddp::comm {

struct StoreState {
  std::map<std::string, std::string> keys;
};

// What one request does.
struct StoreOutcome {
  // The reply; none yet for a get or a wait whose keys are not all set: the server parks the
  // request, applies it again as keys change, and replies kTimeout once `wait_for` has passed.
  std::optional<StoreMessage> reply;
  std::chrono::milliseconds wait_for{0};  // a get's or wait's timeout, 0 for the others
};

// Applies `request` of a client that presented the token (StoreOp's comments give each reply) to
// `state`. Throws InputError for a malformed request: too few fields, a number that is not one,
// a hello again, or an unknown code.
StoreOutcome apply_request(StoreState& state, const StoreMessage& request);

}  // namespace ddp::comm
