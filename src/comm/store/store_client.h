#pragma once
// Private: the client of the job's rendezvous store (job_store.h) that every rank, rank 0 too,
// holds: c10d's Store interface, which ProcessGroupGloo and the NCCL id exchange use, over one
// connection that presented the job token. One request at a time, each waiting for its reply.

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddp/comm/store/store_connection.h"
#include "ddp/comm/store/store_protocol.h"
#include "ddp/comm/store/store_server.h"
#include "ddp/common/socket.h"

namespace ddp::comm {

class StoreClient : public c10d::Store {
 public:
  // Connects to host:port (retrying until `timeout` while the server is not up yet) and presents
  // `token`. Throws InputError when the server refuses it, Error when it cannot connect in time
  // (connect_store() adds the rendezvous context).
  StoreClient(std::string host, int port, std::string token, std::chrono::milliseconds timeout);
  ~StoreClient() override;

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  std::vector<uint8_t> get(const std::string& key) override;
  // get(key) that waits `timeout` at most (one request): nullopt when the key is not set by then.
  std::optional<std::vector<uint8_t>> get_within(const std::string& key,
                                                 std::chrono::milliseconds timeout);
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;
  // A second connection to the same store (pure virtual in recent LibTorch, absent in 1.13:
  // hence no `override`).
  virtual c10::intrusive_ptr<c10d::Store> clone();

  // Keeps rank 0's server alive as long as its own client.
  void own(std::shared_ptr<StoreServer> server) { server_ = std::move(server); }
  // From now on, a get or wait that has to wait gives up (throws Error) as soon as `key` is set,
  // looking for it every few tens of milliseconds: an elastic generation's group stops forming
  // when the launcher declares the generation aborted (a member died while it formed).
  void abort_waits_when_set(std::string key) { abort_key_ = std::move(key); }

 private:
  StoreMessage request(const StoreMessage& message, std::chrono::milliseconds reply_within);
  // kWait for `keys`, within `timeout` (0: none); returns whether they were all set.
  bool wait_within(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);

  StoreConnection connection_;  // one request at a time (the watchdog shares the client)
  std::shared_ptr<StoreServer> server_;
  std::string abort_key_;  // "": waits are not aborted
};

}  // namespace ddp::comm
