#include "store_client.h"

#include <fmt/format.h>

#include <algorithm>

#include "ddp/common/error.h"

namespace ddp::comm {
namespace {

using std::chrono::milliseconds;

std::string bytes_to_string(const std::vector<uint8_t>& v) {
  return {v.begin(), v.end()};
}

std::vector<uint8_t> string_to_bytes(const std::string& s) {
  return {s.begin(), s.end()};
}

// c10d's kNoTimeout (0) means no limit: a year serves.
milliseconds effective(milliseconds timeout) {
  return timeout.count() > 0 ? timeout : std::chrono::hours(24 * 365);
}

// The server answers a wait by its deadline; the client allows a little more before it gives up
// on the server itself.
milliseconds with_margin(milliseconds timeout) {
  return effective(timeout) + std::chrono::seconds(10);
}

// A request that does not wait for keys (set, add, check, ...) is answered at once by a server
// that is up. Past this, the server or the network to it is gone: a rank whose link went down
// then ends within its collective timeout instead of the store's (the rendezvous timeout, 5
// minutes by default), which the watchdog's progress updates would otherwise wait out.
constexpr milliseconds kImmediateReplyWithin = std::chrono::seconds(10);

milliseconds immediate(milliseconds timeout) {
  return std::min(with_margin(timeout), kImmediateReplyWithin);
}

// How often an abortable wait looks for its abort key: the time a generation that lost a member
// while it formed keeps its others waiting.
constexpr milliseconds kAbortKeyPoll{50};

}  // namespace

StoreClient::StoreClient(std::string host, int port, std::string token, milliseconds timeout)
    : c10d::Store(timeout), connection_(std::move(host), port, std::move(token), timeout) {}

StoreClient::~StoreClient() = default;

StoreMessage StoreClient::request(const StoreMessage& message, milliseconds reply_within) {
  return connection_.request(message, reply_within);
}

void StoreClient::set(const std::string& key, const std::vector<uint8_t>& value) {
  request({StoreOp::kSet, {key, bytes_to_string(value)}}, immediate(timeout_));
}

std::vector<uint8_t> StoreClient::compareSet(const std::string& key,
                                             const std::vector<uint8_t>& expected,
                                             const std::vector<uint8_t>& desired) {
  const auto reply =
      request({StoreOp::kCompareSet, {key, bytes_to_string(expected), bytes_to_string(desired)}},
              immediate(timeout_));
  return string_to_bytes(reply.fields.at(0));
}

std::vector<uint8_t> StoreClient::get(const std::string& key) {
  if (!abort_key_.empty()) wait({key});  // the server's get would wait without looking
  const auto reply = request({StoreOp::kGet, {key, std::to_string(effective(timeout_).count())}},
                             with_margin(timeout_));
  if (reply.code == StoreOp::kTimeout) {
    throw Error(
        fmt::format("rendezvous store: key '{}' was not set within {} ms", key, timeout_.count()));
  }
  return string_to_bytes(reply.fields.at(0));
}

std::optional<std::vector<uint8_t>> StoreClient::get_within(const std::string& key,
                                                            milliseconds timeout) {
  const auto reply = request({StoreOp::kGet, {key, std::to_string(effective(timeout).count())}},
                             with_margin(timeout));
  if (reply.code == StoreOp::kTimeout) return std::nullopt;
  return string_to_bytes(reply.fields.at(0));
}

int64_t StoreClient::add(const std::string& key, int64_t value) {
  const auto reply = request({StoreOp::kAdd, {key, std::to_string(value)}}, immediate(timeout_));
  return parse_integer(reply.fields.at(0));
}

bool StoreClient::deleteKey(const std::string& key) {
  return request({StoreOp::kDelete, {key}}, immediate(timeout_)).fields.at(0) == "1";
}

bool StoreClient::check(const std::vector<std::string>& keys) {
  return request({StoreOp::kCheck, keys}, immediate(timeout_)).fields.at(0) == "1";
}

int64_t StoreClient::getNumKeys() {
  return parse_integer(request({StoreOp::kNumKeys, {}}, immediate(timeout_)).fields.at(0));
}

void StoreClient::wait(const std::vector<std::string>& keys) {
  wait(keys, timeout_);
}

bool StoreClient::wait_within(const std::vector<std::string>& keys, milliseconds timeout) {
  std::vector<std::string> fields = {std::to_string(effective(timeout).count())};
  fields.insert(fields.end(), keys.begin(), keys.end());
  return request({StoreOp::kWait, fields}, with_margin(timeout)).code != StoreOp::kTimeout;
}

void StoreClient::wait(const std::vector<std::string>& keys, const milliseconds& timeout) {
  const auto deadline = std::chrono::steady_clock::now() + effective(timeout);
  while (true) {
    const auto left =
        std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    if (abort_key_.empty()) {
      if (wait_within(keys, left)) return;
      break;
    }
    if (wait_within(keys, std::min(left, kAbortKeyPoll))) return;
    if (check({abort_key_})) {
      throw Error(fmt::format("rendezvous store: gave up waiting for '{}': '{}' is set",
                              keys.empty() ? "" : keys.front(), abort_key_));
    }
  }
  throw Error(fmt::format("rendezvous store: keys were not all set within {} ms", timeout.count()));
}

c10::intrusive_ptr<c10d::Store> StoreClient::clone() {
  return c10::make_intrusive<StoreClient>(connection_.host(), connection_.port(),
                                          connection_.token(), timeout_);
}

}  // namespace ddp::comm
