#include "netns.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "subprocess.h"

namespace ddp::testing {

namespace {

const char* const kBridge = "ddpbr0";

// Runs `ip args...` (10 s at most); its output, or a throw naming the command when it fails.
std::string ip(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"ip"};
  argv.insert(argv.end(), args.begin(), args.end());
  const auto r = run_process(argv, {}, std::chrono::seconds(10));
  if (r.exit_code != 0) {
    std::string command;
    for (const auto& a : argv) command += (command.empty() ? "" : " ") + a;
    throw std::runtime_error("netns: `" + command + "` failed (exit " +
                             std::to_string(r.exit_code) + "): " + r.output);
  }
  return r.output;
}

// Every match of group 1 of `pattern` in `text`.
std::vector<std::string> matches(const std::string& text, const std::string& pattern) {
  std::vector<std::string> found;
  const std::regex re(pattern);
  for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator();
       ++it) {
    found.push_back((*it)[1]);
  }
  return found;
}

// Whether `pid` exists and is not a zombie.
bool process_running(int pid) {
  const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  const auto end_of_name = stat.rfind(')');
  return end_of_name != std::string::npos && stat.size() > end_of_name + 2 &&
         stat[end_of_name + 2] != 'Z';
}

}  // namespace

std::string NetnsHosts::name(int i) {
  return "ddp-h" + std::to_string(i);
}
std::string NetnsHosts::ifname(int i) {
  return name(i);
}
std::string NetnsHosts::address(int i) {
  return "10.213.0." + std::to_string(i + 1);
}

bool NetnsHosts::can_make() {
  return ::geteuid() == 0 &&
         run_process({"ip", "netns", "list"}, {}, std::chrono::seconds(10)).exit_code == 0;
}

NetnsHosts::NetnsHosts(int count) : count_(count) {
  if (count < 1 || count > 253) throw std::invalid_argument("netns: 1 .. 253 hosts");
  remove_all();  // what a killed former run left
  try {
    ip({"link", "add", kBridge, "type", "bridge"});
    ip({"addr", "add", bridge_address() + "/24", "dev", kBridge});
    ip({"link", "set", kBridge, "up"});
    for (int i = 0; i < count; ++i) {
      const std::string ns = name(i), port = ifname(i) + "-br";
      ip({"netns", "add", ns});
      // Without loopback a host cannot reach itself at 127.0.0.1 (the launcher's own store).
      ip({"-n", ns, "link", "set", "lo", "up"});
      ip({"link", "add", port, "type", "veth", "peer", "name", ifname(i), "netns", ns});
      ip({"link", "set", port, "master", kBridge, "up"});
      ip({"-n", ns, "addr", "add", address(i) + "/24", "dev", ifname(i)});
      ip({"-n", ns, "link", "set", ifname(i), "up"});
    }
    check_bridged();
  } catch (...) {
    remove_all();
    throw;
  }
}

NetnsHosts::~NetnsHosts() {
  try {
    remove_all();
  } catch (...) {  // a destructor must not throw; the next constructor cleans up
  }
}

// Every ddp-h<N> namespace (its processes killed first: a namespace with processes outlives
// `ip netns del`, and so would its interface), every ddp-h<N>-br link, and the bridge.
void NetnsHosts::remove_all() {
  std::vector<int> killed;
  for (const auto& ns : matches(ip({"netns", "list"}), R"((?:^|\n)(ddp-h\d+)\b)")) {
    for (int attempt = 0; attempt < 50; ++attempt) {
      const auto left = pids_of(ns);
      if (left.empty()) break;
      for (int pid : left) ::kill(pid, SIGKILL);
      killed.insert(killed.end(), left.begin(), left.end());
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ip({"netns", "del", ns});
  }
  // A killed process leaves its namespace first and its memory later: wait until it is gone (or
  // a zombie), so no ddp_train outlives the hosts.
  for (int pid : killed) {
    for (int i = 0; i < 100 && process_running(pid); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  for (const auto& port : matches(ip({"-o", "link", "show"}), R"(\d+: (ddp-h\d+-br)@)")) {
    run_process({"ip", "link", "del", port}, {}, std::chrono::seconds(10));  // gone with its peer
  }
  if (run_process({"ip", "link", "show", kBridge}, {}, std::chrono::seconds(10)).exit_code == 0) {
    ip({"link", "del", kBridge});
  }
}

// Bridged traffic passes through iptables when br_netfilter is loaded
// (net.bridge.bridge-nf-call-iptables = 1, as on this machine), where a FORWARD policy of DROP
// (Docker's) would lose it silently and the tests would only see timeouts. A TCP connect from
// host 0 to a closed port of every other host is answered "Connection refused" when packets pass.
void NetnsHosts::check_bridged() const {
  for (int i = 1; i < count_; ++i) {
    const auto r = run_process(
        in_host(0, {"timeout", "5", "bash", "-c", "exec 3<>/dev/tcp/" + address(i) + "/9"}), {},
        std::chrono::seconds(10));
    if (r.output.find("Connection refused") == std::string::npos) {
      throw std::runtime_error("netns: " + name(0) + " cannot reach " + address(i) + " over " +
                               kBridge + " (a firewall on bridged traffic? see " +
                               "net.bridge.bridge-nf-call-iptables): " + r.output);
    }
  }
}

std::vector<std::string> NetnsHosts::in_host(int i, const std::vector<std::string>& argv) const {
  // nsenter enters the network namespace only. `ip netns exec` would also make a mount namespace
  // and remount "/" as a slave, which fails where "/" is not a mount point (the trixie chroot
  // that CI's second platform runs in).
  std::vector<std::string> wrapped = {"nsenter", "--net=/run/netns/" + name(i)};
  wrapped.insert(wrapped.end(), argv.begin(), argv.end());
  return wrapped;
}

void NetnsHosts::set_link(int i, bool up) const {
  ip({"link", "set", ifname(i) + "-br", up ? "up" : "down"});
}

std::vector<int> NetnsHosts::pids(int i) const {
  return pids_of(name(i));
}

std::vector<int> NetnsHosts::pids_of(const std::string& ns) {
  std::vector<int> pids;
  std::istringstream in(ip({"netns", "pids", ns}));
  for (int pid; in >> pid;) pids.push_back(pid);
  return pids;
}

}  // namespace ddp::testing
