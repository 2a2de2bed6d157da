// The tests' worker programs (the ranks that the multi-process tests start) in one executable,
// ddp_test_workers, which runs the worker its name says: the build links each worker's name to
// it (ddp_comm_worker -> ddp_test_workers, tests/CMakeLists.txt), as busybox does. One program
// instead of seven is one compilation of LibTorch's headers instead of seven: GCC spends about
// 4 s of CPU on them in every source that includes them, whatever the source holds
// (docs/design.md, "Build and CI time").
#include <cstdio>
#include <string_view>

namespace comm_worker {
int run(int argc, char** argv);
}
namespace ddp_worker {
int run(int argc, char** argv);
}
namespace fsdp_worker {
int run(int argc, char** argv);
}
namespace join_worker {
int run(int argc, char** argv);
}
namespace powersgd_worker {
int run(int argc, char** argv);
}
namespace sync_bn_worker {
int run(int argc, char** argv);
}
namespace two_gpu_worker {
int run(int argc, char** argv);
}

namespace {

struct Worker {
  const char* name;
  int (*run)(int, char**);
};

constexpr Worker kWorkers[] = {
    {"ddp_comm_worker", comm_worker::run},         {"ddp_ddp_worker", ddp_worker::run},
    {"ddp_fsdp_worker", fsdp_worker::run},         {"ddp_join_worker", join_worker::run},
    {"ddp_powersgd_worker", powersgd_worker::run}, {"ddp_sync_bn_worker", sync_bn_worker::run},
    {"ddp_two_gpu_worker", two_gpu_worker::run},
};

}  // namespace

int main(int argc, char** argv) {
  std::string_view name = argc > 0 ? argv[0] : "";
  if (const auto slash = name.rfind('/'); slash != std::string_view::npos) {
    name.remove_prefix(slash + 1);
  }
  for (const Worker& worker : kWorkers) {
    if (name == worker.name) {
      return worker.run(argc, argv);
    }
  }
  std::fprintf(stderr,
               "ddp_test_workers: started as '%.*s', which names no worker; start it as one of:",
               static_cast<int>(name.size()), name.data());
  for (const Worker& worker : kWorkers) {
    std::fprintf(stderr, " %s", worker.name);
  }
  std::fprintf(stderr, " (links to this program in its build directory)\n");
  return 2;
}
