#include "node_link.h"

#include <fmt/format.h>

#include <functional>
#include <optional>
#include <thread>

#include "ddp/common/error.h"

namespace ddp::launch {
namespace {

using comm::ElasticKeys;
using comm::NodeEvent;
using comm::StoreOp;

// A node's requests to node 0: short, so that a link that is down holds its launcher's loop
// (which relays the workers' output) for a second at most.
constexpr std::chrono::seconds kNodeReplyWithin{1};

double seconds_of(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

NodeLink::NodeLink(std::string host, int port, std::string token, int node,
                   Clock::duration node_timeout, Notes note)
    : host_(std::move(host)),
      port_(port),
      token_(std::move(token)),
      node_(node),
      node_timeout_(node_timeout),
      note_(std::move(note)) {}

// Any failure drops the connection; the next request makes a new one.
comm::StoreMessage NodeLink::request(const comm::StoreMessage& message) {
  try {
    if (!store_) store_.emplace(host_, port_, token_, kNodeReplyWithin);
    comm::StoreMessage reply = store_->request(message, kNodeReplyWithin);
    reached_ = Clock::now();
    return reply;
  } catch (const InputError&) {
    throw;  // refused (another job's store): no retry helps
  } catch (const Error&) {
    store_.reset();
    throw;
  }
}

std::optional<std::string> NodeLink::value_of(const std::string& key) {
  if (request({StoreOp::kCheck, {key}}).fields.at(0) != "1") return std::nullopt;
  return request({StoreOp::kGet, {key, "0"}}).fields.at(0);
}

std::optional<NodeLink::Admission> NodeLink::register_node(const std::vector<WorkerId>& ids,
                                                           int round, Clock::duration within,
                                                           const std::function<bool()>& stop) {
  const auto deadline = Clock::now() + within;
  round_ = round;
  report({NodeEvent::Kind::kNode, node_, to_string(ids), ""});
  while (Clock::now() < deadline && !stop()) {
    try {
      tick();
      const auto admitted =
          all_sent() ? value_of(ElasticKeys::admitted(node_, round)) : std::optional<std::string>();
      const auto port = admitted ? value_of(ElasticKeys::worker_port(round)) : std::nullopt;
      if (port) return Admission{*admitted == "join", std::stoi(*port)};
    } catch (const InputError&) {
      throw;
    } catch (const Error&) {
      // node 0 is not up yet, or cannot be reached: again
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (stop()) return std::nullopt;
  throw Error(fmt::format(
      "node {}: node 0's launcher at {}:{} did not admit this node within {:.0f} s (waited for "
      "its answer elastic/node/{}/admitted/{})",
      node_, host_, port_, seconds_of(within), node_, round));
}

void NodeLink::report(NodeEvent event) {
  outbox_.push_back(std::move(event));
}

NodeLink::News NodeLink::tick() {
  News news;
  try {
    request({StoreOp::kAdd, {ElasticKeys::beat(node_), "1"}});
    if (was_cut_off_)
      note_(fmt::format("elastic: node 0 can be reached again from node {}", node_));
    was_cut_off_ = false;
    while (!outbox_.empty()) {
      // The number is kept until the event is written under it: the arbiter reads them in order.
      if (!numbered_) {
        numbered_ = comm::parse_integer(
            request({StoreOp::kAdd, {ElasticKeys::events(), "1"}}).fields.at(0));
      }
      request(
          {StoreOp::kSet, {ElasticKeys::event(*numbered_), comm::format_event(outbox_.front())}});
      numbered_.reset();
      outbox_.pop_front();
    }
    if (const auto how = value_of(ElasticKeys::finished())) {
      request({StoreOp::kSet, {ElasticKeys::bye(node_), "1"}});
      news.ended = *how;
      return news;
    }
    if (const auto round = value_of(ElasticKeys::round()); round && std::stoi(*round) > round_) {
      news.round = std::stoi(*round);
    }
  } catch (const InputError&) {
    throw;
  } catch (const Error& e) {
    if (!was_cut_off_ && cut_off()) {
      note_(fmt::format("elastic: node 0 ({}:{}) not reached from node {} for {:.1f} s: {}", host_,
                        port_, node_, seconds_of(Clock::now() - reached_), e.what()));
      was_cut_off_ = true;
    }
  }
  return news;
}

}  // namespace ddp::launch
