#pragma once
// Paths into this tree that the tests use: the sources and the programs built. Each is a variable
// of one file that CMake generates (built_paths.cpp in the build's tests/ folder), named to the
// tests by a macro (DDP_TRAIN_BIN is ::ddp::test::built::train_bin: tests/CMakeLists.txt). So no
// other compile command holds a path into the tree, and a test's object does not depend on where
// the tree was cloned: CI's ccache serves it in a fresh clone (scripts/lib/ccache.sh).

namespace ddp::test::built {

extern const char* const source_dir;
extern const char* const train_bin;
extern const char* const fault_train_bin;
extern const char* const slow_writes_lib;
extern const char* const launcher_bin;
// The worker programs of the multi-process tests, one per test program that has one.
extern const char* const ddp_comm_worker_bin;
extern const char* const ddp_ddp_worker_bin;
extern const char* const ddp_powersgd_worker_bin;
extern const char* const ddp_join_worker_bin;
extern const char* const ddp_fsdp_worker_bin;
extern const char* const ddp_sync_bn_worker_bin;
extern const char* const ddp_two_gpu_worker_bin;

}  // namespace ddp::test::built
