#pragma once
// TCP socket helpers shared by the launcher (a free port, a port check, a name check) and the
// job's rendezvous store (listen, accept, connect with retry, whole writes, reads with a time
// limit). POSIX sockets, IPv4 and IPv6; every descriptor is owned by a UniqueFd and is
// close-on-exec, so that no worker the launcher starts inherits one.

#include <netdb.h>

#include <chrono>
#include <memory>
#include <string>

#include "ddp/common/error.h"

namespace ddp::net {

// Another socket holds the address and port (EADDRINUSE): a port the user can change.
class AddressInUseError : public InputError {
 public:
  using InputError::InputError;
};

// Owns a file descriptor and closes it once; move-only. -1 is "none".
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) noexcept : fd_(fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }
  int release() noexcept {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset(int fd = -1) noexcept;  // closes the one it owned

 private:
  int fd_ = -1;
};

// strerror(3)'s text of the current errno, e.g. "Address already in use".
std::string errno_text();

// This host's name (gethostname), at most 255 bytes.
std::string host_name();

// What getaddrinfo(3) found for a TCP host and port: `addresses` (freed with it), or null and
// `error`, gai_strerror(3)'s text (e.g. "Name or service not known").
struct Resolved {
  std::shared_ptr<addrinfo> addresses;
  std::string error;
};
// `host` "" with AI_PASSIVE in `flags` is the wildcard address of `family` (without it, "" is no
// host). The service is always the number `port`.
Resolved resolve_tcp(const std::string& host, int port, int family = AF_UNSPEC, int flags = 0);

// A TCP socket bound to `address`, with SO_REUSEADDR (a port in TIME_WAIT is no obstacle) and,
// for IPv6, IPV6_V6ONLY off (the wildcard takes IPv4 too). None, with errno set, on failure.
UniqueFd bind_tcp(const addrinfo& address);

// The port a bound socket has (the kernel's choice after binding port 0); 0 when unknown.
int local_port(int fd);

// "10.0.0.5:41234": the numeric address of a connected socket's peer; "?" when unknown.
std::string peer_address(int fd);

// The local side of the route to `host`: the address this host's packets to it leave from, and
// the interface holding that address (as `ip route get` says). Empty fields when `host` does not
// resolve or no route leads there.
struct Route {
  std::string source;     // numeric, e.g. "10.213.0.2"
  std::string interface;  // e.g. "eth0"; "" when no interface holds `source`
};
Route route_to(const std::string& host);

struct Listener {
  UniqueFd fd;
  std::string address;  // numeric, e.g. "127.0.0.1", "::" for every interface
  int port = 0;
};
// Listens on `address` ("" for every interface: IPv6's wildcard, which also takes IPv4, or IPv4's
// where the host has no IPv6) at `port` (0: the kernel picks a free one). Throws
// AddressInUseError "port <port> is already in use on <address | this host>",
// InputError "cannot resolve '<address>': <reason>", Error "cannot listen on <address | *>:<port>:
// <reason>".
Listener listen_tcp(const std::string& address, int port);

// The next connection waiting on `listener` (none when accept(2) failed), with TCP_NODELAY: the
// store's messages are small requests that wait for their reply, which Nagle's delay would hold.
UniqueFd accept_tcp(int listener);

// Connects to host:port, resolving and retrying every 50 ms until `timeout` while nobody listens
// yet (the server may start after its clients), with TCP_NODELAY. Throws Error "cannot connect to
// <peer_name> at <host>:<port>: <last reason>" when the time is up.
UniqueFd connect_tcp(const std::string& host, int port, std::chrono::milliseconds timeout,
                     const std::string& peer_name);

// Why host:port cannot be reached within `timeout` ("no answer within 3 s", "No route to host",
// "cannot resolve ..."); "" when the host answered, by accepting or by refusing the connection.
// One attempt: a probe of the network, not of a server.
std::string unreachable_reason(const std::string& host, int port,
                               std::chrono::milliseconds timeout);
// Whether host:port refused a connection within `timeout` (the host is up, nothing listens on the
// port); false when it accepted, did not answer, or cannot be resolved. One attempt.
bool refuses_connections(const std::string& host, int port, std::chrono::milliseconds timeout);

// Sends all of `bytes` (no SIGPIPE); false when the peer is gone.
bool send_all(int fd, const std::string& bytes);

// Waits until `fd` has something to read (bytes, end of stream or an error) or `timeout` passes;
// false when it passed.
bool wait_readable(int fd, std::chrono::milliseconds timeout);

// Appends what one recv(2) on `fd` gives to `in` (waiting for bytes unless some are there); false
// at the end of the stream or on an error: the peer is gone.
bool receive_some(int fd, std::string& in);

}  // namespace ddp::net
