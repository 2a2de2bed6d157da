#include "ddp/common/socket.h"

#include <fmt/format.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <thread>

namespace ddp::net {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr int kBacklog = 128;  // connections the kernel queues: a job's ranks arrive at once
constexpr auto kConnectRetry = milliseconds(50);

void set_no_delay(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// The numeric host of `address`.
std::string numeric_host(const sockaddr* address, socklen_t length) {
  char host[NI_MAXHOST];
  if (::getnameinfo(address, length, host, sizeof host, nullptr, 0, NI_NUMERICHOST) != 0) {
    return "?";
  }
  return host;
}

// Every interface: IPv6's wildcard, IPv4's where the host has no IPv6.
Resolved resolve_listen_address(const std::string& address, int port) {
  if (!address.empty()) return resolve_tcp(address, port, AF_UNSPEC, AI_PASSIVE);
  Resolved six = resolve_tcp("", port, AF_INET6, AI_PASSIVE);
  return six.addresses ? six : resolve_tcp("", port, AF_INET, AI_PASSIVE);
}

// One connect(2) to each address of host:port; none, with `last_error`, when all failed.
UniqueFd try_connect(const std::string& host, int port, std::string& last_error) {
  const Resolved found = resolve_tcp(host, port);
  if (!found.addresses) {
    last_error = fmt::format("cannot resolve {}: {}", host, found.error);
    return {};
  }
  for (const addrinfo* a = found.addresses.get(); a != nullptr; a = a->ai_next) {
    UniqueFd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (!fd) continue;
    if (::connect(fd.get(), a->ai_addr, a->ai_addrlen) == 0) return fd;
    last_error = errno_text();
  }
  return {};
}

}  // namespace

void UniqueFd::reset(int fd) noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

std::string host_name() {
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  return name;
}

std::string errno_text() {
  return std::strerror(errno);
}

Resolved resolve_tcp(const std::string& host, int port, int family, int flags) {
  addrinfo hints{};
  hints.ai_family = family;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = flags | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const bool wildcard = host.empty() && (flags & AI_PASSIVE) != 0;
  const int rc = ::getaddrinfo(wildcard ? nullptr : host.c_str(), service.c_str(), &hints, &found);
  if (rc != 0) return {nullptr, ::gai_strerror(rc)};
  return {std::shared_ptr<addrinfo>(found, ::freeaddrinfo), ""};
}

UniqueFd bind_tcp(const addrinfo& address) {
  UniqueFd fd(::socket(address.ai_family, address.ai_socktype | SOCK_CLOEXEC, address.ai_protocol));
  if (!fd) return fd;
  const int one = 1, zero = 0;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (address.ai_family == AF_INET6) {
    ::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
  }
  if (::bind(fd.get(), address.ai_addr, address.ai_addrlen) != 0) {
    const int error = errno;
    fd.reset();
    errno = error;  // close(2) may have changed it
  }
  return fd;
}

int local_port(int fd) {
  sockaddr_storage bound{};
  socklen_t length = sizeof bound;
  char service[NI_MAXSERV];
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length) != 0 ||
      ::getnameinfo(reinterpret_cast<sockaddr*>(&bound), length, nullptr, 0, service,
                    sizeof service, NI_NUMERICSERV) != 0) {
    return 0;
  }
  return std::atoi(service);
}

std::string peer_address(int fd) {
  sockaddr_storage peer{};
  socklen_t length = sizeof peer;
  char host[NI_MAXHOST], port[NI_MAXSERV];
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &length) != 0 ||
      ::getnameinfo(reinterpret_cast<sockaddr*>(&peer), length, host, sizeof host, port,
                    sizeof port, NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "?";
  }
  return fmt::format("{}:{}", host, port);
}

Route route_to(const std::string& host) {
  Route route;
  const Resolved found = resolve_tcp(host, 9);  // any port: only the address serves
  if (!found.addresses) return route;
  const addrinfo& a = *found.addresses;
  // connect(2) on a UDP socket sends nothing: it only asks the kernel's routing table which
  // local address would be the source, which getsockname(2) then reads.
  UniqueFd fd(::socket(a.ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  sockaddr_storage local{};
  socklen_t length = sizeof local;
  char address[NI_MAXHOST];
  if (!fd || ::connect(fd.get(), a.ai_addr, a.ai_addrlen) != 0 ||
      ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&local), &length) != 0 ||
      ::getnameinfo(reinterpret_cast<sockaddr*>(&local), length, address, sizeof address, nullptr,
                    0, NI_NUMERICHOST) != 0) {
    return route;
  }
  route.source = address;
  ifaddrs* interfaces = nullptr;
  if (::getifaddrs(&interfaces) != 0) return route;
  for (const ifaddrs* i = interfaces; i != nullptr; i = i->ifa_next) {
    char candidate[NI_MAXHOST];
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != local.ss_family) continue;
    const socklen_t size =
        i->ifa_addr->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    if (::getnameinfo(i->ifa_addr, size, candidate, sizeof candidate, nullptr, 0, NI_NUMERICHOST) ==
            0 &&
        route.source == candidate) {
      route.interface = i->ifa_name;
      break;
    }
  }
  ::freeifaddrs(interfaces);
  return route;
}

Listener listen_tcp(const std::string& address, int port) {
  const Resolved found = resolve_listen_address(address, port);
  if (!found.addresses) {
    throw InputError(fmt::format("cannot resolve '{}': {}", address, found.error));
  }
  std::string last_error = "no address";
  for (const addrinfo* a = found.addresses.get(); a != nullptr; a = a->ai_next) {
    UniqueFd fd = bind_tcp(*a);
    if (fd && ::listen(fd.get(), kBacklog) == 0) {
      const int bound_port = local_port(fd.get());
      return {std::move(fd), numeric_host(a->ai_addr, a->ai_addrlen), bound_port};
    }
    if (errno == EADDRINUSE) {
      throw AddressInUseError(fmt::format("port {} is already in use on {}", port,
                                          address.empty() ? "this host" : address));
    }
    last_error = errno_text();
  }
  throw Error(
      fmt::format("cannot listen on {}:{}: {}", address.empty() ? "*" : address, port, last_error));
}

UniqueFd accept_tcp(int listener) {
  UniqueFd fd(::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC));
  if (fd) set_no_delay(fd.get());
  return fd;
}

UniqueFd connect_tcp(const std::string& host, int port, milliseconds timeout,
                     const std::string& peer_name) {
  const auto deadline = Clock::now() + timeout;
  std::string last_error;
  while (true) {
    UniqueFd fd = try_connect(host, port, last_error);
    if (fd) {
      set_no_delay(fd.get());
      return fd;
    }
    if (Clock::now() >= deadline) {
      throw Error(
          fmt::format("cannot connect to {} at {}:{}: {}", peer_name, host, port, last_error));
    }
    std::this_thread::sleep_for(kConnectRetry);
  }
}

namespace {

// One connection attempt to host:port within `timeout`: 0 (accepted), ETIMEDOUT (no answer), or
// the errno of the failure (ECONNREFUSED: the host is up and nothing listens on the port); -1
// with `unresolved` set when the host does not resolve.
int connect_once(const std::string& host, int port, milliseconds timeout, std::string& unresolved) {
  const Resolved found = resolve_tcp(host, port);
  if (!found.addresses) {
    unresolved = fmt::format("cannot resolve {}: {}", host, found.error);
    return -1;
  }
  const addrinfo& a = *found.addresses;
  UniqueFd fd(::socket(a.ai_family, a.ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a.ai_protocol));
  if (!fd) return errno;
  if (::connect(fd.get(), a.ai_addr, a.ai_addrlen) == 0) return 0;
  if (errno != EINPROGRESS) return errno;
  pollfd p{fd.get(), POLLOUT, 0};
  if (::poll(&p, 1, static_cast<int>(timeout.count())) == 0) return ETIMEDOUT;
  int error = 0;
  socklen_t length = sizeof error;
  ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &error, &length);
  return error;
}

}  // namespace

std::string unreachable_reason(const std::string& host, int port, milliseconds timeout) {
  std::string unresolved;
  const int error = connect_once(host, port, timeout, unresolved);
  if (error == -1) return unresolved;
  if (error == 0 || error == ECONNREFUSED) return "";  // a host that refuses is up and reachable
  if (error == ETIMEDOUT) return fmt::format("no answer within {} s", timeout.count() / 1000.0);
  return std::strerror(error);
}

bool refuses_connections(const std::string& host, int port, milliseconds timeout) {
  std::string unresolved;
  return connect_once(host, port, timeout, unresolved) == ECONNREFUSED;
}

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

bool wait_readable(int fd, milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (true) {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(std::clamp<int64_t>(left, 0, INT_MAX)));
    if (ready < 0 && errno == EINTR) continue;
    return ready != 0;  // an error of poll(2) itself: the read that follows reports it
  }
}

bool receive_some(int fd, std::string& in) {
  char buffer[65536];
  while (true) {
    const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    in.append(buffer, static_cast<size_t>(n));
    return true;
  }
}

}  // namespace ddp::net
