#pragma once
// Private: the server of the job's rendezvous store (job_store.h), run by rank 0. One thread
// polls the listening socket and every connection; a connection must present the job token first
// (StoreOp::kHello) or it is refused, counted and logged. The requests of the clients that did go
// to the key-value semantics (store_semantics.h); a get or wait of keys not set yet is parked
// until they are or its timeout passes.

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "ddp/common/socket.h"

namespace ddp::comm {

class StoreServer {
 public:
  // Listens on `address` ("" for every interface) at `port` (0: a free one); `token` "" accepts
  // any client. Throws net::AddressInUseError (an InputError) "port <port> is already in use on
  // <address | this host>" when another socket holds it, InputError when `address` does not
  // resolve, Error when it cannot listen otherwise.
  StoreServer(const std::string& address, int port, std::string token);
  ~StoreServer();  // stops the thread, closes every connection
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  int port() const { return listener_.port; }
  std::string listen_address() const { return listener_.address; }  // numeric, e.g. "127.0.0.1"
  int refused() const { return refused_.load(); }                   // connections refused so far

 private:
  class Loop;  // the thread's state: connections, parked requests, keys (store_server.cpp)

  net::Listener listener_;
  net::UniqueFd wake_read_;  // a byte from the destructor through wake_write_ ends the loop
  net::UniqueFd wake_write_;
  std::atomic<int> refused_{0};
  std::unique_ptr<Loop> loop_;
  std::thread thread_;
};

}  // namespace ddp::comm
