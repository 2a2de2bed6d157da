#pragma once
// Hosts for tests, played by network namespaces (needs root and `ip`): a bridge in the root
// namespace and one namespace per host, each with its own address on a private test subnet, so
// the launcher, gloo and mpirun see several machines that reach each other only over that subnet.

#include <string>
#include <vector>

namespace ddp::testing {

// Host i is the namespace ddp-h<i> with loopback and the interface ddp-h<i> at 10.213.0.<i+1>/24;
// the other end of its veth pair, ddp-h<i>-br, is a port of the bridge ddpbr0 (10.213.0.254/24)
// in the root namespace. At most 253 hosts. The namespaces have no default route (and nothing
// here enables forwarding): their traffic stays between them and the bridge.
class NetnsHosts {
 public:
  // Removes what a killed former run left under the same names, then makes the hosts; throws
  // std::runtime_error with the failing `ip` command and its output.
  explicit NetnsHosts(int count);
  // Whether this process can make them: root (CAP_SYS_ADMIN) and iproute2.
  static bool can_make();
  // Kills the processes still in the namespaces, removes the namespaces, the veths and the bridge.
  ~NetnsHosts();
  NetnsHosts(const NetnsHosts&) = delete;
  NetnsHosts& operator=(const NetnsHosts&) = delete;

  int count() const { return count_; }
  static std::string name(int i);     // the namespace: ddp-h<i>
  static std::string ifname(int i);   // its interface (for GLOO_SOCKET_IFNAME): ddp-h<i>
  static std::string address(int i);  // 10.213.0.<i+1>
  static std::string bridge_address() { return "10.213.0.254"; }
  static std::string subnet() { return "10.213.0.0/24"; }

  // `argv` run inside host i: nsenter --net=/run/netns/ddp-h<i> argv...
  std::vector<std::string> in_host(int i, const std::vector<std::string>& argv) const;
  // Takes host i's bridge port down (its traffic is lost, as with a pulled cable) or up again.
  void set_link(int i, bool up) const;
  // The pids of the processes in host i's namespace (ip netns pids).
  std::vector<int> pids(int i) const;

 private:
  static void remove_all();
  static std::vector<int> pids_of(const std::string& ns);
  void check_bridged() const;
  int count_;
};

}  // namespace ddp::testing
