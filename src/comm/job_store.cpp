#include "job_store.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <list>
#include <map>

#include "ddp/common/error.h"
#include "ddp/common/log.h"
#include "torch_compat.h"

namespace ddp::comm {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr size_t kMaxHelloBytes = 4096;        // before the token: no room to flood the server
constexpr size_t kMaxMessageBytes = 64 << 20;  // after it: values are ids and addresses
constexpr auto kHelloWithin = std::chrono::seconds(10);

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
}

uint32_t get_u32(const std::string& in, size_t at) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i)
    v |= static_cast<uint32_t>(static_cast<uint8_t>(in[at + i])) << (8 * i);
  return v;
}

std::string bytes_to_string(const std::vector<uint8_t>& v) {
  return {v.begin(), v.end()};
}

std::vector<uint8_t> string_to_bytes(const std::string& s) {
  return {s.begin(), s.end()};
}

std::string errno_text() {
  return std::strerror(errno);
}

// "10.0.0.5:41234" for a connected socket.
std::string peer_of(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "?";
  char host[NI_MAXHOST], port[NI_MAXSERV];
  if (::getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, host, sizeof host, port, sizeof port,
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "?";
  }
  return fmt::format("{}:{}", host, port);
}

// Sends all of `bytes`; false when the peer is gone.
bool send_all(int fd, const std::string& bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

int64_t parse_int(const std::string& text) {
  try {
    size_t used = 0;
    const int64_t v = std::stoll(text, &used);
    if (used == text.size()) return v;
  } catch (const std::exception&) {
  }
  throw InputError(fmt::format("'{}' is not an integer", text.substr(0, 40)));
}

}  // namespace

// ---- Protocol ----

std::string encode(const StoreMessage& message) {
  std::string body;
  body += static_cast<char>(message.code);
  put_u32(body, static_cast<uint32_t>(message.fields.size()));
  for (const auto& f : message.fields) {
    put_u32(body, static_cast<uint32_t>(f.size()));
    body += f;
  }
  std::string out;
  put_u32(out, static_cast<uint32_t>(body.size()));
  return out + body;
}

std::optional<StoreMessage> decode(std::string& buffer, size_t max_bytes) {
  if (buffer.size() < 4) return std::nullopt;
  const size_t length = get_u32(buffer, 0);
  if (length > max_bytes) {
    throw InputError(fmt::format("a message of {} bytes (at most {})", length, max_bytes));
  }
  if (buffer.size() < 4 + length) return std::nullopt;
  if (length < 5) throw InputError("a message shorter than its header");
  StoreMessage m;
  m.code = static_cast<StoreOp>(static_cast<uint8_t>(buffer[4]));
  const size_t count = get_u32(buffer, 5);
  size_t at = 9;
  const size_t end = 4 + length;
  for (size_t i = 0; i < count; ++i) {
    if (end - at < 4) throw InputError("a field past the end of its message");
    const size_t size = get_u32(buffer, at);
    at += 4;
    if (end - at < size) throw InputError("a field past the end of its message");
    m.fields.push_back(buffer.substr(at, size));
    at += size;
  }
  if (at != end) throw InputError("bytes after the last field of a message");
  buffer.erase(0, end);
  return m;
}

bool store_listens_on_master_addr_only(const LaunchInfo& launch) {
  return launch.local_world_size == launch.world_size;
}

bool same_token(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  }
  return diff == 0;
}

// ---- Server ----

struct StoreServer::State {
  struct Connection {
    int fd = -1;
    std::string peer;
    std::string in;
    bool joined = false;  // presented the token
    Clock::time_point hello_deadline;
  };
  // A get or wait that waits for keys to be set.
  struct Waiter {
    int fd = -1;
    StoreOp op = StoreOp::kWait;
    std::vector<std::string> keys;
    Clock::time_point deadline;
  };
  std::map<std::string, std::string> data;
  std::map<int, Connection> connections;
  std::list<Waiter> waiters;
  bool stop = false;
};

StoreServer::StoreServer(const std::string& address, int port, std::string token)
    : token_(std::move(token)), state_(std::make_unique<State>()) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  // Every interface: IPv6's wildcard also takes IPv4 (v6only off), IPv4's where there is no IPv6.
  hints.ai_family = address.empty() ? AF_INET6 : AF_UNSPEC;
  int rc =
      ::getaddrinfo(address.empty() ? nullptr : address.c_str(), service.c_str(), &hints, &found);
  if (rc != 0 && address.empty()) {
    hints.ai_family = AF_INET;
    rc = ::getaddrinfo(nullptr, service.c_str(), &hints, &found);
  }
  if (rc != 0) {
    throw InputError(
        fmt::format("rendezvous store: cannot resolve '{}': {}", address, ::gai_strerror(rc)));
  }
  std::string last_error = "no address";
  for (addrinfo* a = found; a != nullptr && listen_fd_ < 0; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1, zero = 0;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // TIME_WAIT is no obstacle
    if (a->ai_family == AF_INET6) ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 128) == 0) {
      listen_fd_ = fd;
      char host[NI_MAXHOST];
      ::getnameinfo(a->ai_addr, a->ai_addrlen, host, sizeof host, nullptr, 0, NI_NUMERICHOST);
      listen_address_ = host;
    } else {
      last_error = errno_text();
      const bool in_use = errno == EADDRINUSE;
      ::close(fd);
      if (in_use) {
        ::freeaddrinfo(found);
        throw InputError(fmt::format("port {} is already in use on {}", port,
                                     address.empty() ? "this host" : address));
      }
    }
  }
  ::freeaddrinfo(found);
  if (listen_fd_ < 0) {
    throw Error(fmt::format("rendezvous store: cannot listen on {}:{}: {}",
                            address.empty() ? "*" : address, port, last_error));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  char service_out[NI_MAXSERV];
  ::getnameinfo(reinterpret_cast<sockaddr*>(&bound), len, nullptr, 0, service_out,
                sizeof service_out, NI_NUMERICSERV);
  port_ = std::atoi(service_out);
  if (::pipe2(wake_fds_, O_CLOEXEC) != 0) {
    ::close(listen_fd_);
    throw Error("rendezvous store: pipe: " + errno_text());
  }
  thread_ = std::thread([this] { serve(); });
}

StoreServer::~StoreServer() {
  const char byte = 0;
  [[maybe_unused]] const ssize_t n = ::write(wake_fds_[1], &byte, 1);
  thread_.join();
  for (const auto& [fd, c] : state_->connections) ::close(fd);
  ::close(listen_fd_);
  ::close(wake_fds_[0]);
  ::close(wake_fds_[1]);
}

void StoreServer::serve() {
  State& s = *state_;
  auto close_connection = [&](int fd) {
    ::close(fd);
    s.connections.erase(fd);
    s.waiters.remove_if([fd](const State::Waiter& w) { return w.fd == fd; });
  };
  auto refuse = [&](int fd, const std::string& why) {
    ++refused_;
    log::warn("rendezvous store: refused the connection from {}: {}", s.connections[fd].peer, why);
    send_all(fd, encode({StoreOp::kDenied, {why}}));
    close_connection(fd);
  };
  auto all_set = [&](const std::vector<std::string>& keys) {
    return std::all_of(keys.begin(), keys.end(),
                       [&](const std::string& k) { return s.data.count(k) != 0; });
  };
  // Answers the waiters whose keys are all set, or whose time is up.
  auto settle_waiters = [&]() {
    const auto now = Clock::now();
    for (auto it = s.waiters.begin(); it != s.waiters.end();) {
      StoreMessage reply;
      if (all_set(it->keys)) {
        reply.code = StoreOp::kOk;
        if (it->op == StoreOp::kGet) reply.fields.push_back(s.data[it->keys.front()]);
      } else if (now >= it->deadline) {
        reply.code = StoreOp::kTimeout;
      } else {
        ++it;
        continue;
      }
      send_all(it->fd, encode(reply));
      it = s.waiters.erase(it);
    }
  };
  // One request of a joined client; false when it is malformed (the connection is dropped).
  auto handle = [&](int fd, const StoreMessage& m) -> bool {
    const auto& f = m.fields;
    auto need = [&](size_t n) {
      if (f.size() < n) throw InputError(fmt::format("a request with {} field(s)", f.size()));
    };
    StoreMessage reply{StoreOp::kOk, {}};
    switch (m.code) {
      case StoreOp::kSet:
        need(2);
        s.data[f[0]] = f[1];
        break;
      case StoreOp::kGet:
      case StoreOp::kWait: {
        need(m.code == StoreOp::kGet ? 2 : 1);
        State::Waiter w;
        w.fd = fd;
        w.op = m.code;
        const int64_t ms = parse_int(m.code == StoreOp::kGet ? f[1] : f[0]);
        w.deadline = Clock::now() + milliseconds(ms);
        if (m.code == StoreOp::kGet) {
          w.keys = {f[0]};
        } else {
          w.keys.assign(f.begin() + 1, f.end());
        }
        s.waiters.push_back(std::move(w));
        return true;  // settle_waiters() answers
      }
      case StoreOp::kAdd: {
        need(2);
        auto it = s.data.find(f[0]);
        const int64_t now = (it == s.data.end() ? 0 : parse_int(it->second)) + parse_int(f[1]);
        s.data[f[0]] = std::to_string(now);
        reply.fields.push_back(s.data[f[0]]);
        break;
      }
      case StoreOp::kCompareSet: {
        need(3);
        auto it = s.data.find(f[0]);
        if (it == s.data.end()) {
          if (f[1].empty()) s.data[f[0]] = f[2];  // c10d: "" expected means "absent"
          reply.fields.push_back(f[1].empty() ? f[2] : f[1]);
        } else {
          if (it->second == f[1]) it->second = f[2];
          reply.fields.push_back(it->second);
        }
        break;
      }
      case StoreOp::kCheck:
        reply.fields.push_back(all_set(f) ? "1" : "0");
        break;
      case StoreOp::kDelete:
        need(1);
        reply.fields.push_back(s.data.erase(f[0]) != 0 ? "1" : "0");
        break;
      case StoreOp::kNumKeys:
        reply.fields.push_back(std::to_string(s.data.size()));
        break;
      default:
        throw InputError(fmt::format("unknown request {}", static_cast<int>(m.code)));
    }
    return send_all(fd, encode(reply));
  };

  while (true) {
    std::vector<pollfd> fds = {{wake_fds_[0], POLLIN, 0}, {listen_fd_, POLLIN, 0}};
    auto next = Clock::now() + std::chrono::seconds(1);
    for (const auto& [fd, c] : s.connections) {
      fds.push_back({fd, POLLIN, 0});
      if (!c.joined) next = std::min(next, c.hello_deadline);
    }
    for (const auto& w : s.waiters) next = std::min(next, w.deadline);
    const auto wait_ms = std::chrono::duration_cast<milliseconds>(next - Clock::now()).count();
    const int ready =
        ::poll(fds.data(), fds.size(), static_cast<int>(std::max<int64_t>(0, wait_ms) + 1));
    if (ready < 0 && errno != EINTR) {
      log::error("rendezvous store: poll: {}", errno_text());
      return;
    }
    if (fds[0].revents != 0) return;  // the destructor's wake-up
    if (fds[1].revents & POLLIN) {
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) {
        const int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        State::Connection c;
        c.fd = fd;
        c.peer = peer_of(fd);
        c.hello_deadline = Clock::now() + kHelloWithin;
        s.connections[fd] = std::move(c);
      }
    }
    for (size_t i = 2; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      const int fd = fds[i].fd;
      auto& c = s.connections[fd];
      char buffer[65536];
      const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
      if (n <= 0) {
        if (n < 0 && errno == EINTR) continue;
        close_connection(fd);  // a rank that finished, or died
        continue;
      }
      c.in.append(buffer, static_cast<size_t>(n));
      try {
        while (s.connections.count(fd) != 0) {
          auto message = decode(c.in, c.joined ? kMaxMessageBytes : kMaxHelloBytes);
          if (!message) break;
          if (!c.joined) {
            if (message->code != StoreOp::kHello || message->fields.size() != 1) {
              refuse(fd, "it did not start with a ddp hello (not a ddp rank?)");
            } else if (!token_.empty() && message->fields[0].empty()) {
              refuse(fd, "it has no job token (DDP_JOB_TOKEN), and this job's store needs one");
            } else if (!token_.empty() && !same_token(message->fields[0], token_)) {
              refuse(fd, "wrong job token (DDP_JOB_TOKEN): a rank of another job?");
            } else {
              c.joined = true;
              if (!send_all(fd, encode({StoreOp::kOk, {}}))) close_connection(fd);
            }
          } else if (!handle(fd, *message)) {
            close_connection(fd);
          }
        }
      } catch (const InputError& e) {
        if (!c.joined) {
          refuse(fd, std::string("unexpected bytes (not a ddp rank?): ") + e.what());
        } else {
          log::warn("rendezvous store: dropped {}: {}", c.peer, e.what());
          send_all(fd, encode({StoreOp::kError, {e.what()}}));
          close_connection(fd);
        }
      }
    }
    // Clients that never said hello.
    const auto now = Clock::now();
    std::vector<int> silent;
    for (const auto& [fd, c] : s.connections) {
      if (!c.joined && now >= c.hello_deadline) silent.push_back(fd);
    }
    for (int fd : silent) refuse(fd, "no hello within 10 s (not a ddp rank?)");
    settle_waiters();
  }
}

// ---- Client ----

StoreClient::StoreClient(std::string host, int port, std::string token, milliseconds timeout)
    : c10d::Store(timeout), host_(std::move(host)), port_(port), token_(std::move(token)) {
  const auto deadline = Clock::now() + timeout;
  std::string last_error;
  while (fd_ < 0) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    addrinfo* found = nullptr;
    const int rc = ::getaddrinfo(host_.c_str(), std::to_string(port_).c_str(), &hints, &found);
    if (rc != 0) {
      last_error = fmt::format("cannot resolve {}: {}", host_, ::gai_strerror(rc));
    }
    for (addrinfo* a = found; a != nullptr && fd_ < 0; a = a->ai_next) {
      const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
        fd_ = fd;
      } else {
        last_error = errno_text();
        ::close(fd);
      }
    }
    if (found != nullptr) ::freeaddrinfo(found);
    if (fd_ >= 0) break;
    if (Clock::now() >= deadline) {
      throw Error(fmt::format("cannot connect to the rendezvous store at {}:{}: {}", host_, port_,
                              last_error));
    }
    std::this_thread::sleep_for(milliseconds(50));  // rank 0 may not listen yet
  }
  const int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  StoreMessage reply;
  try {
    reply = request({StoreOp::kHello, {token_}}, std::chrono::seconds(30));
  } catch (...) {
    ::close(fd_);  // the destructor does not run for a constructor that throws
    throw;
  }
  if (reply.code == StoreOp::kDenied) {
    ::close(fd_);
    throw InputError(fmt::format(
        "the rendezvous store at {}:{} refused this process: {}. Another job may be using "
        "MASTER_PORT {}; ranks of one job must share DDP_JOB_TOKEN (the launcher sets it)",
        host_, port_, reply.fields.empty() ? "" : reply.fields[0], port_));
  }
}

StoreClient::~StoreClient() {
  if (fd_ >= 0) ::close(fd_);
}

StoreMessage StoreClient::request(StoreMessage message, milliseconds reply_within) {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::string where = fmt::format("the rendezvous store at {}:{}", host_, port_);
  if (fd_ < 0 || !send_all(fd_, encode(message))) {
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
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
    pollfd p{fd_, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(std::clamp<int64_t>(left, 0, INT_MAX)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0)
      throw Error(fmt::format("{} did not answer within {} ms", where, reply_within.count()));
    char buffer[65536];
    const ssize_t n = ::recv(fd_, buffer, sizeof buffer, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw Error(fmt::format("{} closed the connection (rank 0 ended?)", where));
    in.append(buffer, static_cast<size_t>(n));
  }
}

namespace {
// c10d's kNoTimeout (0) means no limit: a year serves.
milliseconds effective(milliseconds timeout) {
  return timeout.count() > 0 ? timeout : std::chrono::hours(24 * 365);
}
// The server answers a wait by its deadline; the client allows a little more before it gives up
// on the server itself.
milliseconds with_margin(milliseconds timeout) {
  return effective(timeout) + std::chrono::seconds(10);
}
}  // namespace

void StoreClient::set(const std::string& key, const std::vector<uint8_t>& value) {
  request({StoreOp::kSet, {key, bytes_to_string(value)}}, with_margin(timeout_));
}

std::vector<uint8_t> StoreClient::compareSet(const std::string& key,
                                             const std::vector<uint8_t>& expected,
                                             const std::vector<uint8_t>& desired) {
  const auto reply =
      request({StoreOp::kCompareSet, {key, bytes_to_string(expected), bytes_to_string(desired)}},
              with_margin(timeout_));
  return string_to_bytes(reply.fields.at(0));
}

std::vector<uint8_t> StoreClient::get(const std::string& key) {
  const auto reply = request({StoreOp::kGet, {key, std::to_string(effective(timeout_).count())}},
                             with_margin(timeout_));
  if (reply.code == StoreOp::kTimeout) {
    throw Error(
        fmt::format("rendezvous store: key '{}' was not set within {} ms", key, timeout_.count()));
  }
  return string_to_bytes(reply.fields.at(0));
}

int64_t StoreClient::add(const std::string& key, int64_t value) {
  const auto reply = request({StoreOp::kAdd, {key, std::to_string(value)}}, with_margin(timeout_));
  return parse_int(reply.fields.at(0));
}

bool StoreClient::deleteKey(const std::string& key) {
  return request({StoreOp::kDelete, {key}}, with_margin(timeout_)).fields.at(0) == "1";
}

bool StoreClient::check(const std::vector<std::string>& keys) {
  return request({StoreOp::kCheck, keys}, with_margin(timeout_)).fields.at(0) == "1";
}

int64_t StoreClient::getNumKeys() {
  return parse_int(request({StoreOp::kNumKeys, {}}, with_margin(timeout_)).fields.at(0));
}

void StoreClient::wait(const std::vector<std::string>& keys) {
  wait(keys, timeout_);
}

void StoreClient::wait(const std::vector<std::string>& keys, const milliseconds& timeout) {
  std::vector<std::string> fields = {std::to_string(effective(timeout).count())};
  fields.insert(fields.end(), keys.begin(), keys.end());
  if (request({StoreOp::kWait, fields}, with_margin(timeout)).code == StoreOp::kTimeout) {
    throw Error(
        fmt::format("rendezvous store: keys were not all set within {} ms", timeout.count()));
  }
}

c10::intrusive_ptr<c10d::Store> StoreClient::clone() {
  return c10::make_intrusive<StoreClient>(host_, port_, token_, timeout_);
}

// ---- The rendezvous ----

CollectiveInfo rendezvous_info(const LaunchInfo& launch) {
  CollectiveInfo info;
  info.op = "rendezvous";
  info.rank = launch.rank;
  info.world_size = launch.world_size;
  return info;
}

namespace {

// A client of torchrun's agent store, under the prefix torch.distributed uses for it (one per
// restart, so a restarted group never reads its predecessor's keys).
c10::intrusive_ptr<c10d::Store> connect_agent_store(const LaunchInfo& launch,
                                                    milliseconds timeout) {
  c10d::TCPStoreOptions opts;  // set by name only: 2.x adds fields and reorders them
  opts.port = static_cast<std::uint16_t>(launch.master_port);
  opts.isServer = false;
  opts.numWorkers = static_cast<std::size_t>(launch.world_size);
  opts.waitWorkers = true;
  opts.timeout = timeout;
  compat::use_classic_tcp_store(opts);
  try {
    auto store = c10::make_intrusive<c10d::TCPStore>(launch.master_addr, opts);
    return c10::make_intrusive<c10d::PrefixStore>(
        fmt::format("/worker/attempt_{}", launch.restart_count), store);
  } catch (const std::exception& e) {
    const std::string what = e.what();
    throw CommError(rendezvous_info(launch),
                    fmt::format("rank {}: torchrun's agent store at {}:{} (TORCHELASTIC_USE_AGENT_"
                                "STORE) cannot be reached within {} s: {}",
                                launch.rank, launch.master_addr, launch.master_port,
                                std::chrono::duration<double>(timeout).count(),
                                what.substr(0, what.find('\n'))));
  }
}

}  // namespace

c10::intrusive_ptr<c10d::Store> connect_store(const LaunchInfo& launch, milliseconds timeout) {
  if (launch.agent_store) return connect_agent_store(launch, timeout);
  const std::string where = fmt::format("{}:{}", launch.master_addr, launch.master_port);
  std::shared_ptr<StoreServer> server;
  if (launch.rank == 0) {
    const std::string address =
        store_listens_on_master_addr_only(launch) ? launch.master_addr : std::string();
    try {
      server = std::make_shared<StoreServer>(address, launch.master_port, launch.job_token);
    } catch (const InputError& e) {
      if (std::string(e.what()).find("already in use") == std::string::npos) throw;
      throw InputError(fmt::format(
          "rank 0: MASTER_PORT {} is already in use on {}: pick a free port (or let the launcher "
          "pick one)",
          launch.master_port, address.empty() ? "this host" : address));
    }
    log::debug("rendezvous store: listening on {}:{}{}", server->listen_address(), server->port(),
               launch.job_token.empty() ? " (no job token: open to any client)" : "");
  }
  const auto fail = [&](const std::string& what) {
    return CommError(rendezvous_info(launch),
                     fmt::format("rank {}: rendezvous at MASTER_ADDR:MASTER_PORT = {} did not "
                                 "complete within {} s (world size {}): {}",
                                 launch.rank, where, std::chrono::duration<double>(timeout).count(),
                                 launch.world_size, what));
  };
  c10::intrusive_ptr<StoreClient> client;
  try {
    client = c10::make_intrusive<StoreClient>(launch.master_addr, launch.master_port,
                                              launch.job_token, timeout);
  } catch (const InputError&) {
    throw;
  } catch (const std::exception& e) {
    throw fail(e.what());
  }
  client->own(server);
  // Every rank marks its arrival; the last to arrive says so. A rank that never arrives is named.
  const std::string arrived = "ddp/rendezvous/arrived/";
  try {
    client->set(arrived + std::to_string(launch.rank), {});
    if (client->add("ddp/rendezvous/count", 1) == launch.world_size) {
      client->set("ddp/rendezvous/complete", {});
    }
    client->wait({"ddp/rendezvous/complete"}, timeout);
  } catch (const std::exception& e) {
    std::vector<int> missing;
    try {
      for (int r = 0; r < launch.world_size; ++r) {
        if (!client->check({arrived + std::to_string(r)})) missing.push_back(r);
      }
    } catch (const std::exception&) {
      throw fail(e.what());
    }
    throw fail(fmt::format("rank(s) {} did not arrive", fmt::join(missing, ", ")));
  }
  return client;
}

}  // namespace ddp::comm
