#include "ddp/comm/store/store_server.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <list>
#include <map>
#include <vector>

#include "ddp/comm/store/store_protocol.h"
#include "ddp/common/error.h"
#include "ddp/common/log.h"
#include "store_semantics.h"

namespace ddp::comm {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr auto kHelloWithin = std::chrono::seconds(10);
// The longest poll(2): the loop looks at its deadlines at least this often.
constexpr auto kLongestPoll = std::chrono::seconds(1);

// Why a connection's first message does not admit it to a store of `token`; "" when it does.
std::string hello_refusal(const StoreMessage& hello, const std::string& token) {
  if (hello.code != StoreOp::kHello || hello.fields.size() != 1) {
    return "it did not start with a ddp hello (not a ddp rank?)";
  }
  if (token.empty()) return "";
  if (hello.fields[0].empty()) {
    return "it has no job token (DDP_JOB_TOKEN), and this job's store needs one";
  }
  if (!same_token(hello.fields[0], token)) {
    return "wrong job token (DDP_JOB_TOKEN): a rank of another job?";
  }
  return "";
}

// net::listen_tcp with the store named in its messages; a port in use is left as it is for
// connect_store() to word for the user.
net::Listener listen_for_store(const std::string& address, int port) {
  try {
    return net::listen_tcp(address, port);
  } catch (const net::AddressInUseError&) {
    throw;
  } catch (const InputError& e) {
    throw InputError(std::string("rendezvous store: ") + e.what());
  } catch (const Error& e) {
    throw Error(std::string("rendezvous store: ") + e.what());
  }
}

}  // namespace

class StoreServer::Loop {
 public:
  Loop(int listen_fd, int wake_fd, std::string token, std::atomic<int>& refused)
      : listen_fd_(listen_fd), wake_fd_(wake_fd), token_(std::move(token)), refused_(refused) {}

  // Serves until the wake-up (or a failed poll).
  void run() {
    while (true) {
      std::vector<pollfd> fds = poll_set();
      if (!poll_until_next_deadline(fds)) return;
      if (fds[1].revents & POLLIN) accept_connection();
      for (size_t i = 2; i < fds.size(); ++i) {
        if (fds[i].revents != 0) read_from(fds[i].fd);
      }
      refuse_silent_clients();
      settle_parked();
    }
  }

 private:
  struct Connection {
    net::UniqueFd fd;
    std::string peer;
    std::string in;       // bytes of a message not whole yet
    bool joined = false;  // presented the token
    Clock::time_point hello_deadline;
  };
  // A get or wait whose keys were not all set.
  struct Parked {
    int fd = -1;
    StoreMessage request;
    Clock::time_point deadline;
  };

  // The wake-up pipe, the listening socket, then every connection.
  std::vector<pollfd> poll_set() const {
    std::vector<pollfd> fds = {{wake_fd_, POLLIN, 0}, {listen_fd_, POLLIN, 0}};
    for (const auto& [fd, c] : connections_) fds.push_back({fd, POLLIN, 0});
    return fds;
  }

  // Polls until an event or the next hello or parked deadline; false when the loop ends.
  bool poll_until_next_deadline(std::vector<pollfd>& fds) const {
    auto next = Clock::now() + kLongestPoll;
    for (const auto& [fd, c] : connections_) {
      if (!c.joined) next = std::min(next, c.hello_deadline);
    }
    for (const auto& p : parked_) next = std::min(next, p.deadline);
    const auto wait_ms = std::chrono::duration_cast<milliseconds>(next - Clock::now()).count();
    // 1 ms more: poll(2) rounds down, and the deadline must have passed when it returns.
    const int timeout_ms = static_cast<int>(std::max<int64_t>(0, wait_ms) + 1);
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) {
      log::error("rendezvous store: poll: {}", net::errno_text());
      return false;
    }
    return fds[0].revents == 0;  // else the destructor's wake-up
  }

  void accept_connection() {
    net::UniqueFd fd = net::accept_tcp(listen_fd_);
    if (!fd) return;
    const int key = fd.get();
    Connection c;
    c.peer = net::peer_address(key);
    c.hello_deadline = Clock::now() + kHelloWithin;
    c.fd = std::move(fd);
    connections_.emplace(key, std::move(c));
  }

  void read_from(int fd) {
    auto it = connections_.find(fd);
    if (it == connections_.end()) return;
    if (!net::receive_some(fd, it->second.in)) {
      close_connection(fd);  // a rank that finished, or died
      return;
    }
    try {
      take_messages(fd);
    } catch (const InputError& e) {
      drop_malformed(fd, e.what());
    }
  }

  // Handles each whole message `fd` has sent, while its connection stays open.
  void take_messages(int fd) {
    for (auto it = connections_.find(fd); it != connections_.end(); it = connections_.find(fd)) {
      Connection& c = it->second;
      const auto message = decode(c.in, c.joined ? kMaxMessageBytes : kMaxHelloBytes);
      if (!message) return;
      if (c.joined) {
        on_request(fd, *message);
      } else {
        on_hello(c, *message);
      }
    }
  }

  void on_hello(Connection& c, const StoreMessage& hello) {
    const int fd = c.fd.get();
    const std::string refusal = hello_refusal(hello, token_);
    if (!refusal.empty()) return refuse(fd, refusal);
    c.joined = true;
    if (!net::send_all(fd, encode({StoreOp::kOk, {}}))) close_connection(fd);
  }

  void on_request(int fd, const StoreMessage& request) {
    const StoreOutcome outcome = apply_request(state_, request);
    if (!outcome.reply) {
      parked_.push_back({fd, request, Clock::now() + outcome.wait_for});
      return;
    }
    if (!net::send_all(fd, encode(*outcome.reply))) close_connection(fd);
  }

  // A malformed message: refused before the token, an error reply after it; then hung up.
  void drop_malformed(int fd, const std::string& what) {
    auto it = connections_.find(fd);
    if (it == connections_.end()) return;
    if (!it->second.joined) return refuse(fd, "unexpected bytes (not a ddp rank?): " + what);
    log::warn("rendezvous store: dropped {}: {}", it->second.peer, what);
    net::send_all(fd, encode({StoreOp::kError, {what}}));
    close_connection(fd);
  }

  void refuse(int fd, const std::string& why) {
    ++refused_;
    log::warn("rendezvous store: refused the connection from {}: {}", connections_.at(fd).peer,
              why);
    net::send_all(fd, encode({StoreOp::kDenied, {why}}));
    close_connection(fd);
  }

  void close_connection(int fd) {
    parked_.remove_if([fd](const Parked& p) { return p.fd == fd; });
    connections_.erase(fd);  // its UniqueFd closes it
  }

  // Clients that never said hello.
  void refuse_silent_clients() {
    const auto now = Clock::now();
    std::vector<int> silent;
    for (const auto& [fd, c] : connections_) {
      if (!c.joined && now >= c.hello_deadline) silent.push_back(fd);
    }
    const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(kHelloWithin).count();
    for (int fd : silent) {
      refuse(fd, fmt::format("no hello within {} s (not a ddp rank?)", seconds));
    }
  }

  // Answers the parked requests whose keys are all set now, or whose time is up.
  void settle_parked() {
    const auto now = Clock::now();
    for (auto it = parked_.begin(); it != parked_.end();) {
      const std::optional<StoreMessage> reply = apply_request(state_, it->request).reply;
      if (!reply && now < it->deadline) {
        ++it;
        continue;
      }
      net::send_all(it->fd, encode(reply ? *reply : StoreMessage{StoreOp::kTimeout, {}}));
      it = parked_.erase(it);
    }
  }

  const int listen_fd_;
  const int wake_fd_;
  const std::string token_;
  std::atomic<int>& refused_;
  StoreState state_;
  std::map<int, Connection> connections_;
  std::list<Parked> parked_;
};

StoreServer::StoreServer(const std::string& address, int port, std::string token)
    : listener_(listen_for_store(address, port)) {
  int wake[2];
  if (::pipe2(wake, O_CLOEXEC) != 0) throw Error("rendezvous store: pipe: " + net::errno_text());
  wake_read_.reset(wake[0]);
  wake_write_.reset(wake[1]);
  loop_ = std::make_unique<Loop>(listener_.fd.get(), wake_read_.get(), std::move(token), refused_);
  thread_ = std::thread([this] { loop_->run(); });
}

StoreServer::~StoreServer() {
  const char byte = 0;
  [[maybe_unused]] const ssize_t n = ::write(wake_write_.get(), &byte, 1);
  thread_.join();
}  // then the loop closes every connection, and the members their descriptors

}  // namespace ddp::comm
