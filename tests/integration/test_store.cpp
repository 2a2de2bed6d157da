// The job's rendezvous store (src/comm/store/job_store.h) over real sockets: its wire format,
// c10d's Store semantics for clients with the job token (get waits for set, add counts, wait times
// out), and refusals, counted and logged, for a client without the token, with another job's, or
// speaking another protocol. Then a real job under the launcher that an intruder tries to join.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <torch/version.h>
#include <unistd.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <thread>

#include "built_paths.h"
#include "ddp/common/error.h"
#include "errors.h"
#include "store/job_store.h"
#include "subprocess.h"
#include "torch_compat.h"

namespace {

using ddp::testing::input_error_of;

using namespace ddp::comm;
using ddp::testing::Child;
using ddp::testing::TempDir;
using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;

std::vector<uint8_t> bytes(const std::string& s) {
  return {s.begin(), s.end()};
}

TEST(StoreProtocol, MessagesRoundTripAndAPartialOneWaits) {
  const StoreMessage m{StoreOp::kSet, {"key", std::string("\0\xff", 2), ""}};
  const std::string one = encode(m);
  std::string partial = one.substr(0, one.size() - 1);
  EXPECT_FALSE(decode(partial, 1024));
  EXPECT_EQ(partial.size(), one.size() - 1);  // nothing taken
  std::string two = one + one;
  const auto first = decode(two, 1024);
  ASSERT_TRUE(first);
  EXPECT_EQ(first->code, StoreOp::kSet);
  EXPECT_EQ(first->fields, m.fields);
  EXPECT_EQ(two, one);
  ASSERT_TRUE(decode(two, 1024));
  EXPECT_TRUE(two.empty());
}

TEST(StoreProtocol, MalformedOrOversizedMessagesAreInputErrors) {
  std::string big = encode({StoreOp::kSet, {std::string(2000, 'x')}});
  EXPECT_NE(input_error_of([&] { decode(big, 1000); }).find("at most 1000"), std::string::npos);
  std::string http = "GET / HTTP/1.1\r\n\r\n";  // its first 4 bytes read as a huge length
  EXPECT_THROW(decode(http, 4096), ddp::InputError);
  // A field that claims more bytes than its message has.
  std::string lying = encode({StoreOp::kSet, {"abc"}});
  lying[9] = 100;
  EXPECT_NE(input_error_of([&] { decode(lying, 4096); }).find("past the end"), std::string::npos);
  std::string trailing = encode({StoreOp::kSet, {"abc"}});
  trailing[0] = static_cast<char>(trailing[0] + 1);
  trailing += 'x';
  EXPECT_NE(input_error_of([&] { decode(trailing, 4096); }).find("after the last field"),
            std::string::npos);
}

TEST(StoreProtocol, TokensCompareWholeAndOneHostListensOnMasterAddrOnly) {
  EXPECT_TRUE(same_token("3f9a", "3f9a"));
  EXPECT_TRUE(same_token("", ""));
  EXPECT_FALSE(same_token("3f9a", "3f9b"));
  EXPECT_FALSE(same_token("3f9a", "3f9"));
  EXPECT_FALSE(same_token("", "3f9a"));
  LaunchInfo one_host;
  one_host.world_size = one_host.local_world_size = 4;
  EXPECT_TRUE(store_listens_on_master_addr_only(one_host));
  LaunchInfo two_hosts = one_host;
  two_hosts.world_size = 8;
  EXPECT_FALSE(store_listens_on_master_addr_only(two_hosts));
}

TEST(JobStore, ClientsWithTheTokenShareKeysWaitAndCount) {
  StoreServer server("127.0.0.1", 0, "secret");
  EXPECT_EQ(server.listen_address(), "127.0.0.1");
  StoreClient a("127.0.0.1", server.port(), "secret", seconds(5));
  StoreClient b("127.0.0.1", server.port(), "secret", seconds(5));

  // get() waits until another client sets the key.
  const auto start = Clock::now();
  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(300));
    b.set("k", bytes("v"));
  });
  EXPECT_EQ(a.get("k"), bytes("v"));
  EXPECT_GE(Clock::now() - start, milliseconds(250));
  setter.join();

  EXPECT_EQ(a.add("n", 2), 2);
  EXPECT_EQ(b.add("n", 3), 5);
  EXPECT_EQ(a.get("n"), bytes("5"));  // decimal text, as c10d's add
  EXPECT_TRUE(a.check({"k", "n"}));
  EXPECT_FALSE(a.check({"k", "absent"}));
  EXPECT_EQ(a.getNumKeys(), 2);
  EXPECT_EQ(a.compareSet("k", bytes("v"), bytes("w")), bytes("w"));   // matched: swapped
  EXPECT_EQ(a.compareSet("k", bytes("v"), bytes("x")), bytes("w"));   // did not: unchanged
  EXPECT_EQ(a.compareSet("new", bytes(""), bytes("y")), bytes("y"));  // absent and "": set
  EXPECT_TRUE(a.deleteKey("k"));
  EXPECT_FALSE(a.deleteKey("k"));
  a.wait({"n", "new"}, milliseconds(100));  // both there: returns at once

  // wait() gives up at its timeout.
  const auto waited = Clock::now();
  EXPECT_THROW(a.wait({"never"}, milliseconds(300)), ddp::Error);
  EXPECT_GE(Clock::now() - waited, milliseconds(250));
  EXPECT_LT(Clock::now() - waited, seconds(5));
  // A clone is a second connection to the same keys.
  EXPECT_EQ(a.clone()->get("new"), bytes("y"));
  EXPECT_EQ(server.refused(), 0);
}

TEST(JobStore, ClientsWithoutTheJobTokenAreRefusedAndCounted) {
  StoreServer server("127.0.0.1", 0, "secret");
  const int port = server.port();
  const auto wrong =
      input_error_of([&] { StoreClient("127.0.0.1", port, "another-jobs-token", seconds(5)); });
  EXPECT_NE(wrong.find("refused this process: wrong job token (DDP_JOB_TOKEN)"), std::string::npos)
      << wrong;
  const auto none = input_error_of([&] { StoreClient("127.0.0.1", port, "", seconds(5)); });
  EXPECT_NE(none.find("refused this process: it has no job token"), std::string::npos) << none;

  // Another protocol (an HTTP probe): the server hangs up.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  const std::string probe = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_EQ(::send(fd, probe.data(), probe.size(), 0), static_cast<ssize_t>(probe.size()));
  char buffer[256];
  ssize_t n = 0;
  std::string reply;
  while ((n = ::recv(fd, buffer, sizeof buffer, 0)) > 0) reply.append(buffer, n);
  ::close(fd);
  EXPECT_NE(reply.find("not a ddp rank"), std::string::npos);  // the kDenied reason, then EOF

  EXPECT_EQ(server.refused(), 3);
  StoreClient member("127.0.0.1", port, "secret", seconds(5));  // the job's ranks still get in
  member.set("k", bytes("v"));
  EXPECT_EQ(member.get("k"), bytes("v"));
}

TEST(JobStore, WithoutATokenTheStoreIsOpenAsTcpStoreIs) {
  StoreServer server("127.0.0.1", 0, "");
  StoreClient client("127.0.0.1", server.port(), "anything", seconds(5));
  client.set("k", bytes("v"));
  EXPECT_EQ(client.get("k"), bytes("v"));
}

TEST(JobStore, APortInUseIsAnInputErrorAndEveryInterfaceIsTheWildcard) {
  StoreServer everywhere("", 0, "t");
  EXPECT_TRUE(everywhere.listen_address() == "::" || everywhere.listen_address() == "0.0.0.0")
      << everywhere.listen_address();
  const auto message = input_error_of([&] { StoreServer("127.0.0.1", everywhere.port(), "t"); });
  EXPECT_NE(message.find("already in use"), std::string::npos) << message;
}

TEST(JobStore, TheRendezvousNamesTheRanksThatDidNotArrive) {
  LaunchInfo launch;
  launch.launcher = Launcher::kEnv;
  launch.world_size = launch.local_world_size = 3;
  launch.master_addr = "127.0.0.1";
  launch.master_port = ddp::testing::free_port();
  launch.job_token = "t";
  try {
    connect_store(launch, milliseconds(500));  // rank 0 alone: ranks 1 and 2 never come
    FAIL() << "the rendezvous completed without ranks 1 and 2";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("rank(s) 1, 2 did not arrive"), std::string::npos)
        << e.what();
  }
}

// A job of 2 ranks under the launcher while an intruder tries to join its store at
// MASTER_PORT: the intruder is refused (and rank 0 logs it), the job completes.
TEST(JobStore, AnIntruderIsRefusedWhileTheJobCompletes) {
  TempDir out;
  const int port = ddp::testing::free_port();
  Child job({DDP_LAUNCHER_BIN, "--nproc", "2", "--master-port", std::to_string(port), DDP_TRAIN_BIN,
             "--config", std::string(DDP_SOURCE_DIR) + "/configs/random_linear.yaml", "--epochs",
             "200", "--output-dir", out.path()},
            {});
  const auto deadline = Clock::now() + seconds(90);
  std::string refusal;
  while (refusal.empty() && Clock::now() < deadline) {
    try {
      StoreClient("127.0.0.1", port, "a-guess", milliseconds(200));
      FAIL() << "an intruder joined the job's store";
    } catch (const ddp::InputError& e) {
      refusal = e.what();
    } catch (const ddp::Error&) {
      std::this_thread::sleep_for(milliseconds(20));  // not listening yet
    }
  }
  EXPECT_NE(refusal.find("wrong job token"), std::string::npos) << refusal;
  const auto r = job.wait_until(deadline);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("[rank 0]"), std::string::npos);
  EXPECT_NE(r.output.find("rendezvous store: refused the connection from 127.0.0.1:"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("epoch 200/200"), std::string::npos) << r.output;
}

// The compatibility shim finds TCPStoreOptions::useLibUV where the LibTorch has it (2.2 on) and
// turns it off; elsewhere it leaves the options alone.
TEST(TorchCompat, TcpStoresUseTheClassicImplementationWhereLibuvIsAnOption) {
  constexpr bool has_libuv_option =
      TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 2);
  EXPECT_EQ(ddp::compat::HasUseLibUv<c10d::TCPStoreOptions>::value, has_libuv_option);
  struct WithLibUv {
    bool useLibUV = true;
  } with_libuv;
  ddp::compat::use_classic_tcp_store(with_libuv);
  EXPECT_FALSE(with_libuv.useLibUV);
  struct WithoutLibUv {
    int port = 29500;
  } without_libuv;
  ddp::compat::use_classic_tcp_store(without_libuv);
  EXPECT_EQ(without_libuv.port, 29500);
}

// torchrun's default static rendezvous: its agent serves a c10d TCPStore at MASTER_PORT, and the
// workers, told so by TORCHELASTIC_USE_AGENT_STORE=True, are its clients under the prefix
// /worker/attempt_<restart>. Debian's torchrun 1.13 cannot start workers under Python 3.11 (its
// --redirects parsing fails), so this Python plays the agent with PyTorch's own TCPStore.
TEST(Torchrun, WorkersJoinTheAgentsTcpStore) {
  TempDir out;
  const char* agent = R"(
import os, subprocess, sys
from datetime import timedelta
from torch.distributed import TCPStore
port = int(sys.argv[1])
args = ("127.0.0.1", port, None, True, timedelta(seconds=60))
try:  # torchrun 2.x's agent store; without libuv, which Debian's PyTorch 2.6 lacks
    store = TCPStore(*args, wait_for_workers=False, use_libuv=False)
except TypeError:  # PyTorch 1.13: no use_libuv, and no libuv server either
    store = TCPStore(*args, wait_for_workers=False)
env = dict(os.environ, WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
           MASTER_PORT=str(port), TORCHELASTIC_USE_AGENT_STORE="True",
           TORCHELASTIC_RESTART_COUNT="0")
workers = [subprocess.Popen(sys.argv[2:], env=dict(env, RANK=str(r), LOCAL_RANK=str(r)))
           for r in range(2)]
codes = [w.wait() for w in workers]
keys = store.num_keys()  # the workers' keys live in the agent's store
print("agent: exit codes", codes, "keys", keys, flush=True)
sys.exit(max(codes) if keys > 1 else 3)
)";
  const auto r = ddp::testing::run_process(
      {DDP_PYTHON, "-c", agent, std::to_string(ddp::testing::free_port()), DDP_TRAIN_BIN,
       "--config", std::string(DDP_SOURCE_DIR) + "/configs/random_linear.yaml", "--epochs", "2",
       "--output-dir", out.path()},
      {}, seconds(120));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("agent: exit codes [0, 0]"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("2 rank(s), backend shm"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("epoch 2/2"), std::string::npos) << r.output;
}

}  // namespace
