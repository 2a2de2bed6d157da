#include "store_semantics.h"

#include <fmt/format.h>

#include <algorithm>

#include "ddp/common/error.h"

namespace ddp::comm {
namespace {

using Fields = std::vector<std::string>;

void need(const StoreMessage& request, size_t count) {
  if (request.fields.size() < count) {
    throw InputError(fmt::format("a request with {} field(s)", request.fields.size()));
  }
}

StoreMessage ok(Fields fields = {}) {
  return {StoreOp::kOk, std::move(fields)};
}

bool all_set(const StoreState& state, Fields::const_iterator first, Fields::const_iterator last) {
  return std::all_of(first, last, [&](const std::string& k) { return state.keys.count(k) != 0; });
}

// get [key, timeout ms] and wait [timeout ms, keys...]: no reply until every key is set.
StoreOutcome wait_for_keys(const StoreState& state, const StoreMessage& request) {
  const bool get = request.code == StoreOp::kGet;
  need(request, get ? 2 : 1);
  const Fields& f = request.fields;
  const std::chrono::milliseconds timeout(parse_integer(get ? f[1] : f[0]));
  const auto first = get ? f.begin() : f.begin() + 1;
  const auto last = get ? f.begin() + 1 : f.end();
  if (!all_set(state, first, last)) return {std::nullopt, timeout};
  return {get ? ok({state.keys.at(f[0])}) : ok(), timeout};
}

// As c10d's add: the counter is decimal text, an absent key counts from 0.
StoreMessage add(StoreState& state, const StoreMessage& request) {
  need(request, 2);
  const std::string& key = request.fields[0];
  const auto it = state.keys.find(key);
  const int64_t before = it == state.keys.end() ? 0 : parse_integer(it->second);
  return ok({state.keys[key] = std::to_string(before + parse_integer(request.fields[1]))});
}

// c10d's rule (torch/csrc/distributed/c10d/HashStore.cpp, HashStore::compareSet, and TCPStore's
// compareSetHandler): the key takes `desired` when it holds `expected`, or when it is absent and
// `expected` is ""; the reply is the value now, or `expected` itself for an absent key that stays
// absent.
StoreMessage compare_set(StoreState& state, const StoreMessage& request) {
  need(request, 3);
  const std::string& key = request.fields[0];
  const std::string& expected = request.fields[1];
  const std::string& desired = request.fields[2];
  const auto it = state.keys.find(key);
  if (it == state.keys.end()) {
    if (!expected.empty()) return ok({expected});
    return ok({state.keys[key] = desired});
  }
  if (it->second == expected) it->second = desired;
  return ok({it->second});
}

}  // namespace

StoreOutcome apply_request(StoreState& state, const StoreMessage& request) {
  const Fields& f = request.fields;
  switch (request.code) {
    case StoreOp::kSet:
      need(request, 2);
      state.keys[f[0]] = f[1];
      return {ok()};
    case StoreOp::kGet:
    case StoreOp::kWait:
      return wait_for_keys(state, request);
    case StoreOp::kAdd:
      return {add(state, request)};
    case StoreOp::kCompareSet:
      return {compare_set(state, request)};
    case StoreOp::kCheck:
      return {ok({all_set(state, f.begin(), f.end()) ? "1" : "0"})};
    case StoreOp::kDelete:
      need(request, 1);
      return {ok({state.keys.erase(f[0]) != 0 ? "1" : "0"})};
    case StoreOp::kNumKeys:
      return {ok({std::to_string(state.keys.size())})};
    default:
      throw InputError(fmt::format("unknown request {}", static_cast<int>(request.code)));
  }
}

}  // namespace ddp::comm
