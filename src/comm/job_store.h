#pragma once
// Private: the rendezvous store of the env contract and Slurm. Rank 0 serves a key-value store at
// MASTER_ADDR:MASTER_PORT; every rank (rank 0 too) is its client through c10d's Store interface,
// which ProcessGroupGloo and the NCCL id exchange use.
//
// Why not c10d's TCPStore: it accepts any client that reaches the port, and (LibTorch 1.13)
// always listens on every interface. A stray process, or another job that picked the same port,
// could join or corrupt the rendezvous. This store is for the job alone: the launcher gives its
// workers a random DDP_JOB_TOKEN; a connection that does not present it first is refused and
// logged; and on one host the store listens on MASTER_ADDR (loopback under the launcher) only.
// The token is a shared secret against strays and mix-ups, not encryption: it travels in clear.
//
// Wire format (both directions): u32 length of what follows, u8 code, u32 count, then `count`
// fields of u32 length + bytes; integers little-endian.

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ddp/comm/rendezvous.h"

namespace ddp::comm {

// ---- The protocol, as pure functions (unit-tested) ----

enum class StoreOp : uint8_t {
  kHello = 1,   // [token] -> kOk | kDenied [reason]
  kSet,         // [key, value] -> kOk
  kGet,         // [key, timeout ms] -> kOk [value] | kTimeout (waits for the key)
  kAdd,         // [key, delta] -> kOk [new value]   (decimal text, as c10d's add)
  kCompareSet,  // [key, expected, desired] -> kOk [value now]
  kCheck,       // [keys...] -> kOk ["1" | "0"]
  kWait,        // [timeout ms, keys...] -> kOk | kTimeout
  kDelete,      // [key] -> kOk ["1" | "0"]
  kNumKeys,     // [] -> kOk [count]
  // Replies.
  kOk = 100,
  kDenied,
  kTimeout,
  kError,  // [message]: a malformed request
};

struct StoreMessage {
  StoreOp code = StoreOp::kOk;
  std::vector<std::string> fields;
};

// The bytes of `message`, length prefix included.
std::string encode(const StoreMessage& message);

// Takes one whole message off the front of `buffer`: nullopt while it is incomplete. Throws
// InputError for a malformed one or one longer than `max_bytes` (the connection is then
// dropped).
std::optional<StoreMessage> decode(std::string& buffer, size_t max_bytes);

// Whether rank 0 listens on MASTER_ADDR's address only (every rank on this host) rather than on
// every interface (ranks on other hosts must reach it).
bool store_listens_on_master_addr_only(const LaunchInfo& launch);

// Equal strings, in a time that does not depend on where they differ.
bool same_token(const std::string& a, const std::string& b);

// ---- Server (rank 0) ----

class StoreServer {
 public:
  // Listens on `address` ("" for every interface) at `port`; `token` "" accepts any client.
  // Throws InputError when the port is in use.
  StoreServer(const std::string& address, int port, std::string token);
  ~StoreServer();  // stops the thread, closes every connection
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  int port() const { return port_; }
  std::string listen_address() const { return listen_address_; }  // numeric, e.g. "127.0.0.1"
  int refused() const { return refused_.load(); }                 // connections refused so far

 private:
  struct State;
  void serve();

  int port_ = 0;
  std::string listen_address_;
  std::string token_;
  int listen_fd_ = -1;
  int wake_fds_[2] = {-1, -1};
  std::atomic<int> refused_{0};
  std::unique_ptr<State> state_;
  std::thread thread_;
};

// ---- Client (every rank) ----

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

 private:
  StoreMessage request(StoreMessage message, std::chrono::milliseconds reply_within);

  std::string host_;
  int port_;
  std::string token_;
  int fd_ = -1;
  std::mutex mutex_;  // one request at a time (the watchdog shares the client)
  std::shared_ptr<StoreServer> server_;
};

// Describes the rendezvous of `launch` for a CommError.
CollectiveInfo rendezvous_info(const LaunchInfo& launch);

// Rank 0 serves, every rank connects with launch.job_token; returns once all world_size ranks
// have joined. Under torchrun's static rendezvous (launch.agent_store), a client of its agent's
// c10d TCPStore instead. Throws InputError when rank 0 finds the port in use or the server refuses
// the token, CommError naming the ranks that did not join within `timeout`.
c10::intrusive_ptr<c10d::Store> connect_store(const LaunchInfo& launch,
                                              std::chrono::milliseconds timeout);

}  // namespace ddp::comm
