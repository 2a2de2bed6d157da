#pragma once
// Starts the ranks of a job for tests, with torchrun's env contract or with mpirun, each with a
// time limit.

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "subprocess.h"

namespace ddp::testing {

// `world` processes of `argv` with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
// MASTER_ADDR=127.0.0.1 and a free MASTER_PORT (plus `extra`); waits for all until `limit`.
// A job whose rank 0 found its port taken runs again on another.
std::vector<ProcessResult> run_env_ranks(int world, const std::vector<std::string>& argv,
                                         std::chrono::seconds limit,
                                         const std::map<std::string, std::string>& extra = {});

// Whether rank 0 exited because its MASTER_PORT was taken (the job never started).
bool port_was_taken(const ProcessResult& rank0);

// A reference run of PyTorch (Debian's python3-torch): tests/python/`script` OUT_DIR as `world`
// gloo ranks with the env contract, writing into `out_dir`. Returns whether every rank exited 0
// (each failure is also a test failure, with the rank's output).
bool run_python_reference(const std::string& script, int world, const std::string& out_dir);

// Every rank's exit code is 0 (a test failure for each that is not); their outputs, joined.
std::string expect_all_exit_zero(const std::vector<ProcessResult>& ranks);

// The words of mpirun -np `np` as root on one host (--allow-run-as-root, --oversubscribe), to which
// a program's words are added.
std::vector<std::string> mpirun_argv(int np);

// mpirun_argv(np) and `argv`, until `limit`.
ProcessResult run_mpirun(int np, const std::vector<std::string>& argv, std::chrono::seconds limit);

}  // namespace ddp::testing
