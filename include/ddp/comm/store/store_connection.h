#pragma once
// Private: one client connection to the job's rendezvous store (store_server.h), without LibTorch:
// the workers' c10d::Store (store_client.h) talks through it, and so does the launcher, which
// serves the store in elastic mode and reads and writes the membership keys itself.

#include <chrono>
#include <mutex>
#include <string>

#include "ddp/comm/store/store_protocol.h"
#include "ddp/common/socket.h"

namespace ddp::comm {

class StoreConnection {
 public:
  // Connects to host:port (retrying until `timeout` while the server is not up yet) and presents
  // `token`. Throws InputError when the server refuses it, Error when it cannot connect in time.
  StoreConnection(std::string host, int port, std::string token, std::chrono::milliseconds timeout);

  // Sends `message` and returns the reply. Throws Error when the server is gone, does not answer
  // within `reply_within`, or answers kError. Thread-safe: one request at a time.
  StoreMessage request(const StoreMessage& message, std::chrono::milliseconds reply_within);

  const std::string& host() const { return host_; }
  int port() const { return port_; }
  const std::string& token() const { return token_; }

 private:
  void say_hello();

  std::string host_;
  int port_;
  std::string token_;
  net::UniqueFd fd_;
  std::mutex mutex_;
};

}  // namespace ddp::comm
