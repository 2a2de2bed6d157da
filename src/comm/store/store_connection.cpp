#include "ddp/comm/store/store_connection.h"

#include <fmt/format.h>

#include "ddp/common/error.h"

namespace ddp::comm {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr auto kHelloReplyWithin = std::chrono::seconds(30);

}  // namespace

StoreConnection::StoreConnection(std::string host, int port, std::string token,
                                 milliseconds timeout)
    : host_(std::move(host)),
      port_(port),
      token_(std::move(token)),
      fd_(net::connect_tcp(host_, port_, timeout, "the rendezvous store")) {
  say_hello();
}

void StoreConnection::say_hello() {
  const StoreMessage reply = request({StoreOp::kHello, {token_}}, kHelloReplyWithin);
  if (reply.code != StoreOp::kDenied) return;
  throw InputError(fmt::format(
      "the rendezvous store at {}:{} refused this process: {}. Another job may be using "
      "MASTER_PORT {}; ranks of one job must share DDP_JOB_TOKEN (the launcher sets it)",
      host_, port_, reply.fields.empty() ? "" : reply.fields[0], port_));
}

StoreMessage StoreConnection::request(const StoreMessage& message, milliseconds reply_within) {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::string where = fmt::format("the rendezvous store at {}:{}", host_, port_);
  if (!fd_ || !net::send_all(fd_.get(), encode(message))) {
    throw Error(fmt::format("{} is gone (rank 0 ended?)", where));
  }
  std::string in;
  const auto deadline = Clock::now() + reply_within;
  while (true) {
    if (auto reply = decode(in, kMaxMessageBytes)) {
      if (reply->code == StoreOp::kError) {
        throw Error(fmt::format("{}: {}", where, reply->fields.empty() ? "" : reply->fields[0]));
      }
      return *reply;
    }
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    if (!net::wait_readable(fd_.get(), left)) {
      // A late reply would be read as the next request's: this connection is done.
      fd_.reset();
      throw Error(fmt::format("{} did not answer within {} ms", where, reply_within.count()));
    }
    if (!net::receive_some(fd_.get(), in)) {
      throw Error(fmt::format("{} closed the connection (rank 0 ended?)", where));
    }
  }
}

}  // namespace ddp::comm
