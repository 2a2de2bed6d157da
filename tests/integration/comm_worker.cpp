// One rank of the multi-process comm tests, started by test_comm.cpp with the env contract or by
// mpirun. Checks every collective against closed-form results and exits 0 only if all hold.
//   comm_worker BACKEND SCENARIO...   each SCENARIO in turn on one group of BACKEND, its lines
//       prefixed "[SCENARIO] " and ending with "rank r/w: N checks, M failures"
//       (support/scenario_runner.h); exits 0 only if every one passed. SCENARIO:
//       collectives          every collective against closed forms
//       shm-collectives      the same through the shared-memory group over the group (gloo's)
//       shm-buffers          that shared-memory group's buffers (allocate_buffer): every op of
//           a whole buffer and of views at odd offsets against closed forms, several dtypes and
//           sizes, bit for bit the staged all_reduce of the same values; buffers all-reduced in
//           flight together; a buffer that outlives its group
//       shm-buffer=NUMEL     a buffer of NUMEL float32 a rank in that group: whether it is
//           shared memory, and closed forms of every op of it, all-gathers into it and
//           reduce-scatters of it included (a test makes /dev/shm too small for it)
//       shm-gathers          all-gathers into and reduce-scatters of that group's buffers, on
//           it and on a subgroup of every rank: closed forms, odd sizes, four dtypes, past a slot,
//           the shard from a plain tensor or the rank's own block, and bit for bit the staged ones;
//           rank 0's memory in a buffer and the others' not
//       versus-gloo          that shared-memory group and the gloo group under it: every
//           collective of both on the same inputs, random floats included; shm's sums are the
//           rank-order sums of every rank's input, bit for bit, and equal gloo's (exactly where the
//           values are integers or at 2 ranks, to float rounding otherwise)
//       hierarchical=HOST,HOST,...   rank r on host HOST[r] (the layout a test chooses):
//           comm::hierarchical's all_reduce equals the flat one, for every op, several dtypes and
//           sizes, several in flight at once
//   comm_worker BACKEND skip TIMEOUT_MS   the last rank never joins all_reduce #2
//   comm_worker BACKEND setup             only creates the group (bad env, bad backend)
//   comm_worker BACKEND mismatch TIMEOUT_MS KIND...   for each KIND, 8 collectives through
//       ddp::init_process_group, rank 1 calling another op, dtype or shape at the 5th, or skipping
//       it (KIND: op, dtype, shape, skip); prints how long each took to fail, and exits 0 when
//       every one failed with InputError (TORCH_DISTRIBUTED_DEBUG=DETAIL: at once)
//   comm_worker shm die-in-all-reduce   the last rank kills itself (SIGKILL) at all_reduce #2;
//       the others report how their all_reduce ended
//   comm_worker shm die-in-buffer-all-reduce   the same, all-reducing a buffer of the group
//       (allocate_buffer, not a numbered collective: the kill is at all_reduce #2 again)
//   comm_worker shm die-in-buffer-all-gather   the same, all-gathering into a buffer of the group
//   comm_worker shm buffer-mismatch   rank 0 all-reduces a buffer of the group, the others a
//       plain tensor of its size: each rank says how its all_reduce ended
//   comm_worker BACKEND all-reduce-until-error TIMEOUT_MS   all_reduces until one fails (a test
//       stops, resumes or kills a rank from outside), a line every 200 ms saying how many passed
//   comm_worker gloo shm-set-up-faults DIR RANK:K:MODE,...   for each case, in a process
//       forked for it: the shared-memory group made over a gloo group of its own, then a buffer of
//       it allocated, where rank RANK, at the K-th collective over gloo, kills itself (SIGKILL,
//       MODE kill) or throws instead (fail; K past the set-up's: it kills itself once the buffer
//       is made); every rank says how its set-up ended (Note [Nothing left in /dev/shm]). Case
//       I's lines are between "[case I] begin" and "[case I] rank R: exit E" (E: the exit code,
//       128 + the signal that ended it, or "timeout"); rank 0 writes the port of each case's
//       group into DIR, where the others read it
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <thread>
#include <vector>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backends/backends.h"  // make_shm_process_group, for versus-gloo
#include "ddp/comm/hierarchical.h"
#include "ddp/comm/rendezvous.h"
#include "ddp/common/socket.h"
#include "scenario_runner.h"
#include "shared_segments.h"

namespace comm_worker {

namespace {

using ddp::comm::ReduceOp;

int g_failures = 0;
int g_checks = 0;

void expect_equal(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ++g_checks;
  if (!at::equal(got, want)) {
    ++g_failures;
    std::cout << "MISMATCH " << what << ": max abs diff "
              << (got.to(at::kDouble) - want.to(at::kDouble)).abs().max().item<double>()
              << std::endl;
  }
}

// Element i of rank r holds (r + 1) * (i % 97): sums, min and max have closed forms.
at::Tensor pattern(int64_t n, at::ScalarType dtype) {
  return at::arange(n, at::kLong).remainder(97).to(dtype);
}

void check_collectives(ddp::comm::ProcessGroup& pg) {
  const int w = pg.world_size();
  const int r = pg.rank();
  const int64_t sum_of_ranks = static_cast<int64_t>(w) * (w + 1) / 2;  // of (r + 1)
  for (auto dtype : {at::kFloat, at::kDouble, at::kLong}) {
    // Up to 2^20 + 3 elements (8 MB of double): several of gloo's and MPI's chunks, and not a
    // power of two. The 3,000,000 and 10,000,000 of earlier runs cost CI minutes (four ranks on
    // two cores) and found nothing more.
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1000}, (int64_t{1} << 20) + 3}) {
      const std::string tag = fmt::format("{} n={}", c10::toString(dtype), n);
      const auto base = pattern(n, dtype);

      auto t = base * (r + 1);
      pg.all_reduce(t, ReduceOp::kSum)->wait();
      expect_equal(t, base * sum_of_ranks, "all_reduce(sum) " + tag);

      t = base * (r + 1);
      pg.all_reduce(t, ReduceOp::kAvg)->wait();
      const auto avg = at::isIntegralType(dtype, false) ? (base * sum_of_ranks).div(w, "trunc")
                                                        : (base * sum_of_ranks).div(w);
      expect_equal(t, avg, "all_reduce(avg) " + tag);

      t = base + r;
      pg.all_reduce(t, ReduceOp::kMin)->wait();
      expect_equal(t, base, "all_reduce(min) " + tag);
      t = base + r;
      pg.all_reduce(t, ReduceOp::kMax)->wait();
      expect_equal(t, base + (w - 1), "all_reduce(max) " + tag);

      // Broadcast from the last rank of a seeded random tensor; the others start from zeros.
      auto gen = at::detail::createCPUGenerator(1234 + static_cast<uint64_t>(n));
      const auto seeded =
          at::randint(-1000000, 1000000, {n}, gen, at::TensorOptions(at::kLong)).to(dtype);
      t = r == w - 1 ? seeded.clone() : at::zeros({n}, dtype);
      pg.broadcast(t, w - 1)->wait();
      expect_equal(t, seeded, "broadcast " + tag);

      // All-gather: rank q's block is base + q, in rank order.
      if (n <= (int64_t{1} << 20)) {
        auto out = at::empty({n * w}, dtype);
        pg.all_gather(out, base + r)->wait();
        std::vector<at::Tensor> blocks;
        for (int q = 0; q < w; ++q) blocks.push_back(base + q);
        expect_equal(out, at::cat(blocks), "all_gather " + tag);
      }
    }
  }
  // Several collectives in flight at once complete in order.
  std::vector<at::Tensor> ts;
  std::vector<ddp::comm::WorkPtr> works;
  for (int i = 0; i < 4; ++i) {
    ts.push_back(at::full({1000}, static_cast<double>(i + r), at::kDouble));
    works.push_back(pg.all_reduce(ts.back()));
  }
  for (auto& work : works) work->wait();
  for (int i = 0; i < 4; ++i) {
    expect_equal(ts[i], at::full({1000}, static_cast<double>(i * w + (w - 1) * w / 2), at::kDouble),
                 fmt::format("overlapped all_reduce {}", i));
  }
  pg.barrier()->wait();
}

// The same values on every rank for rank `r`'s block `q`: pattern + 8 r + q, exact in every dtype
// (at most 96 + 8 * 3 + 3 < 256, which bfloat16 holds exactly); for bool, an uneven test of it.
at::Tensor block_value(int64_t n, int r, int q, at::ScalarType dtype) {
  const auto v = pattern(n, at::kLong) + (8 * r + q);
  return dtype == at::kBool ? v.remainder(3).eq(0) : v.to(dtype);
}

at::Tensor blocks_of(int w, const std::function<at::Tensor(int q)>& block) {
  std::vector<at::Tensor> blocks;
  for (int q = 0; q < w; ++q) blocks.push_back(block(q));
  return at::cat(blocks);
}

// reduce_scatter: rank r's block q is (base + q) * (r + 1) (sum, avg) or base + q + r (min,
// max); rank r receives the reduction of the blocks r.
void check_reduce_scatter(ddp::comm::ProcessGroup& pg) {
  const int w = pg.world_size();
  const int r = pg.rank();
  const int64_t sum_of_ranks = static_cast<int64_t>(w) * (w + 1) / 2;
  for (auto dtype : {at::kFloat, at::kDouble, at::kLong}) {
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{300000}}) {
      const std::string tag = fmt::format("{} block={}", c10::toString(dtype), n);
      const auto base = pattern(n, dtype);
      const auto scaled = blocks_of(w, [&](int q) { return (base + q) * (r + 1); });
      const auto shifted = blocks_of(w, [&](int q) { return base + q + r; });
      const auto sum = (base + r) * sum_of_ranks;
      const auto avg = at::isIntegralType(dtype, false) ? sum.div(w, "trunc") : sum.div(w);
      auto out = at::empty({n}, dtype);
      pg.reduce_scatter(out, scaled, ReduceOp::kSum)->wait();
      expect_equal(out, sum, "reduce_scatter(sum) " + tag);
      pg.reduce_scatter(out, scaled, ReduceOp::kAvg)->wait();
      expect_equal(out, avg, "reduce_scatter(avg) " + tag);
      pg.reduce_scatter(out, shifted, ReduceOp::kMin)->wait();
      expect_equal(out, base + r, "reduce_scatter(min) " + tag);
      pg.reduce_scatter(out, shifted, ReduceOp::kMax)->wait();
      expect_equal(out, base + r + (w - 1), "reduce_scatter(max) " + tag);
    }
  }
}

// Data movement of every dtype, the ones gloo's and MPI's type tables lack included.
void check_data_movement(ddp::comm::ProcessGroup& pg) {
  const int w = pg.world_size();
  const int r = pg.rank();
  for (auto dtype : {at::kFloat, at::kLong, at::kBFloat16, at::kHalf, at::kShort, at::kBool}) {
    for (int64_t n : {int64_t{1}, int64_t{1001}}) {
      const std::string tag = fmt::format("{} n={}", c10::toString(dtype), n);
      // all_to_all: block q of the input goes to rank q, block q of the output came from rank q.
      const auto input = blocks_of(w, [&](int q) { return block_value(n, r, q, dtype); });
      auto out = at::empty({n * w}, dtype);
      pg.all_to_all(out, input)->wait();
      expect_equal(out, blocks_of(w, [&](int q) { return block_value(n, q, r, dtype); }),
                   "all_to_all " + tag);
      auto gathered = at::empty({n * w}, dtype);
      pg.all_gather(gathered, block_value(n, r, 0, dtype))->wait();
      expect_equal(gathered, blocks_of(w, [&](int q) { return block_value(n, q, 0, dtype); }),
                   "all_gather " + tag);
      auto t = r == w - 1 ? block_value(n, r, 1, dtype) : at::zeros({n}, dtype);
      pg.broadcast(t, w - 1)->wait();
      expect_equal(t, block_value(n, w - 1, 1, dtype), "broadcast " + tag);
    }
  }
}

// float16 and bfloat16 reductions, with values exact in both: rank r holds (r + 1) * (i % 7) / 2,
// so sums and averages are multiples of 1/8 below 64.
void check_16bit_reductions(ddp::comm::ProcessGroup& pg) {
  const int w = pg.world_size();
  const int r = pg.rank();
  const double sum_of_ranks = w * (w + 1) / 2.0;
  for (auto dtype : {at::kHalf, at::kBFloat16}) {
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{100003}}) {
      const std::string tag = fmt::format("{} n={}", c10::toString(dtype), n);
      const auto base = at::arange(n, at::kLong).remainder(7).to(at::kFloat).mul(0.5);
      auto t = (base * (r + 1)).to(dtype);
      pg.all_reduce(t, ReduceOp::kSum)->wait();
      expect_equal(t, (base * sum_of_ranks).to(dtype), "all_reduce(sum) " + tag);
      t = (base * (r + 1)).to(dtype);
      pg.all_reduce(t, ReduceOp::kAvg)->wait();
      expect_equal(t, (base * sum_of_ranks / w).to(dtype), "all_reduce(avg) " + tag);
      t = (base + r).to(dtype);
      pg.all_reduce(t, ReduceOp::kMin)->wait();
      expect_equal(t, base.to(dtype), "all_reduce(min) " + tag);
      t = (base + r).to(dtype);
      pg.all_reduce(t, ReduceOp::kMax)->wait();
      expect_equal(t, (base + (w - 1)).to(dtype), "all_reduce(max) " + tag);

      const auto input = blocks_of(w, [&](int q) { return ((base + q) * (r + 1)).to(dtype); });
      auto out = at::empty({n}, dtype);
      pg.reduce_scatter(out, input, ReduceOp::kSum)->wait();
      expect_equal(out, ((base + r) * sum_of_ranks).to(dtype), "reduce_scatter(sum) " + tag);
      pg.reduce_scatter(out, input, ReduceOp::kAvg)->wait();
      expect_equal(out, ((base + r) * sum_of_ranks / w).to(dtype), "reduce_scatter(avg) " + tag);
    }
  }
}

// gloo sums bfloat16 in float32 and rounds once: rank 0 holds 256, the others 1. With 3 ranks the
// sum is 258; a bfloat16 accumulation (8 significant bits: 256 + 1 rounds to 256) gives 256.
// With 4, 259 rounds to 260 where bfloat16 gives 256. MPI combines in pairs, rounding each time,
// in an order of its choosing, so there the result is not pinned down.
void check_float32_accumulation(ddp::comm::ProcessGroup& pg) {
  const int w = pg.world_size();
  const double value = pg.rank() == 0 ? 256.0 : 1.0;
  const auto want = at::full({5}, 256.0 + (w - 1), at::kFloat).to(at::kBFloat16);
  auto t = at::full({5}, value, at::kFloat).to(at::kBFloat16);
  pg.all_reduce(t, ReduceOp::kSum)->wait();
  expect_equal(t, want, "bfloat16 all_reduce sums in float32");
  auto out = at::empty({5}, at::kBFloat16);
  pg.reduce_scatter(out, at::full({5 * w}, value, at::kFloat).to(at::kBFloat16))->wait();
  expect_equal(out, want, "bfloat16 reduce_scatter sums in float32");
}

// Two-phase all_reduces (bfloat16 on gloo) in flight with other collectives, waited on in
// reverse order: each one's second half must still line up on every rank.
void check_overlapped_16bit(ddp::comm::ProcessGroup& pg) {
  const int w = pg.world_size();
  const int r = pg.rank();
  std::vector<at::Tensor> ts;
  std::vector<ddp::comm::WorkPtr> works;
  for (int i = 0; i < 4; ++i) {
    const auto dtype = i % 2 == 1 ? at::kBFloat16 : at::kFloat;
    ts.push_back(at::full({333}, static_cast<double>(i + r), dtype));
    works.push_back(pg.all_reduce(ts.back()));
  }
  if (pg.backend_name() == "gloo") {
    ++g_checks;  // not complete until waited on, or until the next collective is issued
    if (works[3]->is_completed()) {
      ++g_failures;
      std::cout << "MISMATCH a bfloat16 all_reduce on gloo completed before wait()" << std::endl;
    }
  }
  for (int i = 3; i >= 0; --i) works[static_cast<size_t>(i)]->wait();
  for (int i = 0; i < 4; ++i) {
    expect_equal(ts[static_cast<size_t>(i)],
                 at::full({333}, static_cast<double>(i * w + (w - 1) * w / 2), ts[i].scalar_type()),
                 fmt::format("overlapped 16-bit all_reduce {}", i));
  }
}

std::string new_group_error(ddp::comm::ProcessGroup& pg, std::vector<int> ranks) {
  try {
    pg.new_group(std::move(ranks));
  } catch (const ddp::InputError& e) {
    return e.what();
  }
  return "no error";
}

void expect_contains(const std::string& text, const std::string& part, const std::string& what) {
  ++g_checks;
  if (text.find(part) == std::string::npos) {
    ++g_failures;
    std::cout << "MISMATCH " << what << ": '" << text << "' lacks '" << part << "'" << std::endl;
  }
}

void expect_true(bool ok, const std::string& what) {
  ++g_checks;
  if (!ok) {
    ++g_failures;
    std::cout << "MISMATCH " << what << std::endl;
  }
}

// Collectives of a subgroup whose members are the parent ranks `members` (sorted), against closed
// forms in the parent ranks.
void check_subgroup(ddp::comm::ProcessGroup& g, const std::vector<int>& members, int parent_rank) {
  const int gw = g.world_size();
  const std::string tag = fmt::format("subgroup {}", fmt::join(members, ","));
  expect_true(gw == static_cast<int>(members.size()) && members[g.rank()] == parent_rank,
              tag + ": rank and size");
  const auto base = pattern(1000, at::kDouble);
  double sum = 0;
  std::vector<at::Tensor> gathered_blocks;
  for (int m : members) {
    sum += m + 1;
    gathered_blocks.push_back(base + m);
  }
  auto t = base * (parent_rank + 1);
  g.all_reduce(t)->wait();
  expect_equal(t, base * sum, tag + " all_reduce");
  t = g.rank() == gw - 1 ? base + 100 * parent_rank : at::zeros({1000}, at::kDouble);
  g.broadcast(t, gw - 1)->wait();
  expect_equal(t, base + 100 * members.back(), tag + " broadcast");
  auto out = at::empty({1000 * gw}, at::kDouble);
  g.all_gather(out, base + parent_rank)->wait();
  expect_equal(out, at::cat(gathered_blocks), tag + " all_gather");
  const auto input = blocks_of(gw, [&](int k) { return (base + k) * (parent_rank + 1); });
  auto block = at::empty({1000}, at::kDouble);
  g.reduce_scatter(block, input)->wait();
  expect_equal(block, (base + g.rank()) * sum, tag + " reduce_scatter");
  g.barrier()->wait();
  expect_true(g.last_seq() == 5, tag + ": its own sequence numbers");
}

// new_group: the even ranks (listed backwards: they are sorted) and the odd ranks, a group of the
// last rank alone, a subgroup of a subgroup, and the errors.
void check_new_group(ddp::comm::ProcessGroup& pg) {
  const int w = pg.world_size();
  const int r = pg.rank();
  std::vector<int> evens;
  std::vector<int> odds;
  for (int q = 0; q < w; ++q) (q % 2 == 0 ? evens : odds).push_back(q);
  const uint64_t before = pg.last_seq();
  auto even = pg.new_group(std::vector<int>(evens.rbegin(), evens.rend()));
  expect_true(pg.last_seq() == before + 1, "new_group is one collective of the parent");
  expect_true(pg.recorder().records().back().op ==
                  fmt::format("new_group(ranks {})", fmt::join(evens, ",")),
              "new_group is recorded, with its ranks sorted");
  auto odd = odds.empty() ? nullptr : pg.new_group(odds);  // none in a world of one
  expect_true((even != nullptr) == (r % 2 == 0) && (odd != nullptr) == (r % 2 == 1),
              "members get a group, the others nullptr");
  auto& mine = r % 2 == 0 ? even : odd;
  check_subgroup(*mine, r % 2 == 0 ? evens : odds, r);
  // A subgroup of the subgroup: its first rank alone.
  auto first = mine->new_group({0});
  expect_true((first != nullptr) == (mine->rank() == 0), "subgroup of a subgroup");
  if (first) check_subgroup(*first, {r}, r);

  auto last = pg.new_group({w - 1});
  expect_true((last != nullptr) == (r == w - 1), "a group of one rank");
  if (last) check_subgroup(*last, {r}, r);

  const uint64_t seq = pg.last_seq();
  expect_contains(
      new_group_error(pg, {0, w}),
      fmt::format("new_group: rank {} is not a rank of this group (ranks 0-{})", w, w - 1),
      "new_group out of range");
  expect_contains(new_group_error(pg, {-1}), "rank -1 is not a rank", "new_group negative");
  expect_contains(new_group_error(pg, {0, 0}), "rank 0 is listed twice", "new_group repeated");
  expect_true(pg.last_seq() == seq, "an invalid new_group issues nothing");
  // The parent still works after its subgroups' traffic.
  auto t = at::full({10}, static_cast<double>(r), at::kDouble);
  pg.all_reduce(t)->wait();
  expect_equal(t, at::full({10}, (w - 1) * w / 2.0, at::kDouble), "parent after subgroups");
}

// mismatch: collectives alternate all_reduce(sum, float32[10]) and broadcast(float32[10]) from
// rank 0; rank 1's 5th call differs (or is skipped, making its 5th the others' 6th).
void run_mismatch(ddp::comm::ProcessGroup& pg, const std::string& kind) {
  for (int call = 1; call <= 8; ++call) {
    auto t = at::ones({10}, at::kFloat);
    if (pg.rank() == 1 && call == 5) {
      if (kind == "skip") continue;
      if (kind == "op") {
        auto other = at::ones({12}, at::kFloat);
        pg.broadcast(other, 0)->wait();
        continue;
      }
      if (kind == "dtype") t = t.to(at::kDouble);
      if (kind == "shape") t = at::ones({12}, at::kFloat);
    }
    if (call % 2 == 1) {
      pg.all_reduce(t)->wait();
    } else {
      pg.broadcast(t, 0)->wait();
    }
  }
}

// Each kind in turn on one group: with DETAIL every rank throws at the same check, before the
// collective is issued, so the group stays usable and the next kind starts from the next number.
int mismatch(const std::string& backend, const std::vector<std::string>& kinds,
             std::chrono::milliseconds timeout) {
  auto pg = ddp::init_process_group(
      ddp::InitProcessGroupOptions().backend(backend).timeout(timeout).rendezvous_timeout(
          std::chrono::seconds(30)));
  for (const std::string& kind : kinds) {
    const auto start = std::chrono::steady_clock::now();
    const auto seconds = [&] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    };
    try {
      run_mismatch(*pg, kind);
      std::cout << fmt::format("rank {}: {}: all 8 collectives returned after {:.2f} s", pg->rank(),
                               kind, seconds())
                << std::endl;
      return 1;
    } catch (const ddp::InputError& e) {
      std::cout << fmt::format("rank {}: {}: failed after {:.2f} s: {}", pg->rank(), kind,
                               seconds(), e.what())
                << std::endl;
    }
  }
  return 0;
}

// Rank r's input: integer values (exact in float32 for these sizes, so every summation order
// gives the same float), or random doubles (equal to rounding).
at::Tensor hierarchical_input(int rank, int64_t n, at::ScalarType dtype) {
  if (dtype == at::kDouble) {
    at::manual_seed(1000 + rank);
    return at::rand({n}, at::kDouble);
  }
  auto i = at::arange(n, at::kLong);
  return ((i * (rank + 1)) % 13 - 6).to(dtype);
}

void check_hierarchical(ddp::comm::ProcessGroup& flat, ddp::comm::ProcessGroup& tiered) {
  for (const auto op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
    for (const auto dtype : {at::kFloat, at::kLong, at::kDouble}) {
      // Several in flight at once, waited on in reverse: the steps keep the calls' order.
      std::vector<at::Tensor> want, got;
      std::vector<ddp::comm::WorkPtr> works;
      for (const int64_t n : {1, 7, 1000, (1 << 18) + 3}) {
        auto input = hierarchical_input(flat.rank(), n, dtype);
        want.push_back(input.clone());
        flat.all_reduce(want.back(), op)->wait();
        got.push_back(input.clone());
        works.push_back(tiered.all_reduce(got.back(), op));
      }
      for (auto w = works.rbegin(); w != works.rend(); ++w) (*w)->wait();
      for (size_t k = 0; k < want.size(); ++k) {
        const std::string what =
            fmt::format("hierarchical all_reduce({}) of {} {}", ddp::comm::to_string(op),
                        want[k].numel(), ddp::comm::dtype_name(dtype));
        ++g_checks;
        const bool same = dtype == at::kDouble ? at::allclose(got[k], want[k], 1e-12, 0)
                                               : at::equal(got[k], want[k]);
        if (!same) {
          ++g_failures;
          std::cout << "FAIL " << what << ": differs from the flat all_reduce" << std::endl;
        }
      }
    }
  }
}

// 2^20 + 3 elements carry a 4- or 8-byte dtype past a slot of the shared-memory backend's (4 MiB
// at most), into several rounds. A narrower dtype would need 2 or 4 times as many elements for
// that, and its rounds are the channel's own tests' (tests/shm/test_channel.cpp, 4 KiB slots): the
// large size is for the wide ones. Random inputs and reductions of 10 dtypes of that size were most
// of these scenarios' CPU time, at 2, 3 and 4 ranks, under ASan too.
constexpr int64_t kPastASlot = (int64_t{1} << 20) + 3;
bool wide(at::ScalarType dtype) { return c10::elementSize(dtype) >= 4; }

// Rank r's input for versus-gloo: random values of `dtype` from seed r (any rank can make any
// rank's), integers in a range that sums exactly in every dtype. Floats are uniform in (-256, 256):
// a normal distribution's sines and logarithms took a quarter of these scenarios' CPU time.
at::Tensor random_input(int r, int64_t n, at::ScalarType dtype) {
  at::manual_seed(1000 + r);
  if (at::isFloatingType(dtype)) return at::rand({n}, at::kDouble).sub(0.5).mul(512).to(dtype);
  if (dtype == at::kBool) return at::randint(0, 2, {n}, at::kLong).to(dtype);
  return at::randint(-20, 20, {n}, at::kLong).to(dtype);
}

// The sum over ranks in rank order, as the shared-memory channel adds (Note [A fixed reduction
// order]): 16-bit floats in float32, rounded once.
at::Tensor rank_order_sum(int world, int64_t n, at::ScalarType dtype) {
  const bool narrow = dtype == at::kHalf || dtype == at::kBFloat16;
  at::Tensor sum = random_input(0, n, dtype);
  if (narrow) sum = sum.to(at::kFloat);
  for (int r = 1; r < world; ++r) {
    const at::Tensor x = random_input(r, n, dtype);
    sum = dtype == at::kBool ? sum.logical_or(x) : sum.add(narrow ? x.to(at::kFloat) : x);
  }
  return sum.to(dtype);
}

void versus_gloo(ddp::comm::ProcessGroup* gloo, ddp::comm::ProcessGroup* shm) {
  expect_true(shm != nullptr && shm->backend_name() == "shm", "the ranks of one host share memory");
  if (shm == nullptr) return;
  const int w = shm->world_size();
  const int me = shm->rank();
  for (auto dtype : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kInt, at::kLong,
                     at::kChar, at::kByte, at::kShort, at::kBool}) {
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{1001}, kPastASlot}) {
      if (n == kPastASlot && !wide(dtype)) continue;
      const std::string what = fmt::format("{} of {}", n, ddp::comm::dtype_name(dtype));
      at::Tensor mine = random_input(me, n, dtype);
      at::Tensor by_shm = mine.clone();
      shm->all_reduce(by_shm, ReduceOp::kSum)->wait();
      expect_equal(by_shm, rank_order_sum(w, n, dtype),
                   "shm all_reduce is the rank-order sum, " + what);
      // Gloo adds in its ring's order: at 2 ranks a + b == b + a; integers are exact anyway.
      // Otherwise within a few roundings of the largest partial sum (float16 on gloo rounds to
      // 16 bits after every addition).
      at::Tensor by_gloo = mine.clone();
      gloo->all_reduce(by_gloo, ReduceOp::kSum)->wait();
      const bool exact = n == 0 || w == 2 || !at::isFloatingType(dtype);
      const double eps = dtype == at::kHalf ? 0x1p-10 : dtype == at::kBFloat16 ? 0x1p-7 : 1e-6;
      const double tolerance = w * 1024.0 * eps;  // |inputs| < 256
      ++g_checks;
      if (exact ? !at::equal(by_shm, by_gloo)
                : (by_shm.to(at::kDouble) - by_gloo.to(at::kDouble)).abs().max().item<double>() >
                      tolerance) {
        ++g_failures;
        std::cout << "MISMATCH shm and gloo all_reduce, " << what << std::endl;
      }
      for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
        at::Tensor a = mine.clone();
        at::Tensor b = mine.clone();
        shm->all_reduce(a, op)->wait();
        gloo->all_reduce(b, op)->wait();
        expect_equal(a, b, fmt::format("shm and gloo all_reduce({}), {}", to_string(op), what));
      }
      // Data movement: the same bytes as gloo's.
      at::Tensor g1 = at::empty({w * n}, mine.options());
      at::Tensor g2 = at::empty({w * n}, mine.options());
      shm->all_gather(g1, mine)->wait();
      gloo->all_gather(g2, mine)->wait();
      expect_equal(g1, g2, "shm and gloo all_gather, " + what);
      at::Tensor b1 = mine.clone();
      shm->broadcast(b1, w - 1)->wait();
      expect_equal(b1, random_input(w - 1, n, dtype), "shm broadcast from the last rank, " + what);
    }
  }
  shm->barrier()->wait();
}

// ---- The group's buffers (ProcessGroup::allocate_buffer) on shared memory ----

// One rank's input for the buffers' closed forms, exact in every dtype checked: i % 97, or for
// bfloat16 (i % 7) / 2, whose sums and averages bfloat16 holds exactly (check_16bit_reductions).
at::Tensor exact_base(int64_t n, at::ScalarType dtype) {
  const auto i = at::arange(n, at::kLong);
  return dtype == at::kBFloat16 ? i.remainder(7).to(at::kDouble).mul(0.5)
                                : i.remainder(97).to(at::kDouble);
}

// `t`, a buffer of `pg` or a view of one, all-reduced by every op against the closed forms.
void check_ops_in_place(ddp::comm::ProcessGroup& pg, at::Tensor t, const std::string& tag) {
  const int w = pg.world_size();
  const int r = pg.rank();
  const auto dtype = t.scalar_type();
  const auto base = exact_base(t.numel(), dtype);
  const auto sum = base * (w * (w + 1) / 2);
  struct Case {
    ReduceOp op;
    at::Tensor mine;
    at::Tensor want;
  };
  const std::vector<Case> cases = {
      {ReduceOp::kSum, base * (r + 1), sum},
      {ReduceOp::kAvg, base * (r + 1),
       at::isIntegralType(dtype, false) ? sum.div(w, "floor") : sum / w},
      {ReduceOp::kMin, base + r, base},
      {ReduceOp::kMax, base + r, base + (w - 1)}};
  for (const auto& c : cases) {
    t.copy_(c.mine);
    pg.all_reduce(t, c.op)->wait();
    expect_equal(t, c.want.to(dtype), fmt::format("all_reduce({}) of {}", to_string(c.op), tag));
  }
}

// Random values in `t` (a buffer or a view of one) reduced in place equal, bit for bit, the staged
// all-reduce of the same values in a plain tensor, and the rank-order sum.
void check_in_place_is_staged(ddp::comm::ProcessGroup& pg, at::Tensor t, const std::string& tag) {
  const auto mine = random_input(pg.rank(), t.numel(), t.scalar_type());
  t.copy_(mine);
  auto plain = mine.clone();
  pg.all_reduce(t)->wait();
  pg.all_reduce(plain)->wait();
  expect_equal(t, plain, "in place equals staged, " + tag);
  expect_equal(t, rank_order_sum(pg.world_size(), t.numel(), t.scalar_type()),
               "in place is the rank-order sum, " + tag);
}

// Views of `buffer` at odd offsets (off any cache line and any vector width), each reduced in
// place while the rest of this rank's copy keeps its marker (exact in bfloat16 too).
void check_views(ddp::comm::ProcessGroup& pg, at::Tensor& buffer, const std::string& tag) {
  const int64_t n = buffer.numel();
  const double marker = 64 + pg.rank();
  for (const auto& [offset, length] : std::vector<std::pair<int64_t, int64_t>>{
           {1, n - 2}, {3, 5}, {17, n / 2}, {n / 3 + 1, n / 3}}) {
    if (length < 1 || offset + length > n) continue;
    const std::string what = fmt::format("{} at {} of {}", length, offset, tag);
    buffer.fill_(marker);
    auto view = buffer.narrow(0, offset, length);
    check_ops_in_place(pg, view, what);
    check_in_place_is_staged(pg, view, what);
    ++g_checks;
    if (!buffer.narrow(0, 0, offset).eq(marker).all().item<bool>() ||
        !buffer.narrow(0, offset + length, n - offset - length).eq(marker).all().item<bool>()) {
      ++g_failures;
      std::cout << "MISMATCH the all_reduce of " << what << " wrote outside it" << std::endl;
    }
  }
}

// Buffers of every size and dtype, kept alive together: each all-reduced whole and in views,
// then all of them at once, in flight together.
void check_buffers(ddp::comm::ProcessGroup& pg) {
  const int w = pg.world_size();
  const int r = pg.rank();
  std::vector<at::Tensor> buffers;
  for (auto dtype : {at::kFloat, at::kDouble, at::kLong, at::kBFloat16}) {
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1000}, kPastASlot}) {
      if (n == kPastASlot && !wide(dtype)) continue;
      const std::string tag = fmt::format("a buffer of {} {}", n, ddp::comm::dtype_name(dtype));
      buffers.push_back(pg.allocate_buffer(n, at::TensorOptions(dtype)));
      at::Tensor& buffer = buffers.back();
      expect_true(buffer.numel() == n && buffer.eq(0).all().item<bool>(), tag + " is zero-filled");
      expect_true(ddp::testing::in_shared_segment(buffer.data_ptr()), tag + " is shared memory");
      check_ops_in_place(pg, buffer, tag);
      check_in_place_is_staged(pg, buffer, tag);
      check_views(pg, buffer, tag);
    }
  }
  std::vector<ddp::comm::WorkPtr> works;
  for (size_t k = 0; k < buffers.size(); ++k) {
    buffers[k].fill_(static_cast<double>(k % 8 + r));
    works.push_back(pg.all_reduce(buffers[k]));
  }
  for (auto& work : works) work->wait();
  for (size_t k = 0; k < buffers.size(); ++k) {
    const double want = static_cast<double>(k % 8) * w + w * (w - 1) / 2;
    expect_true(
        buffers[k].eq(want).all().item<bool>(),
        fmt::format("buffer {} of {}, all-reduced with the others in flight", k, buffers.size()));
  }
}

// ---- All-gathers into and reduce-scatters of the group's buffers: in place on shared memory ----

// Blocks q = 0..w-1 of `part(q)`, one tensor of `dtype`.
at::Tensor blocks_of(int w, at::ScalarType dtype, const std::function<at::Tensor(int)>& part) {
  std::vector<at::Tensor> blocks;
  for (int q = 0; q < w; ++q) blocks.push_back(part(q).to(dtype));
  return at::cat(blocks);
}

// Shards of `n` elements gathered by `pg` into `out` (w * n elements: a buffer of pg's, or of the
// group a subgroup pg was made from): each rank's shard (q + 1) * base, from a plain tensor and
// from the rank's own block of the buffer; the closed form, and bit for bit the staged all-gather
// into a plain tensor.
void check_gather_into_buffer(ddp::comm::ProcessGroup& pg, at::Tensor out, int64_t n,
                              const std::string& tag) {
  const int w = pg.world_size();
  const int r = pg.rank();
  const auto dtype = out.scalar_type();
  const auto base = exact_base(n, dtype);
  const auto want = blocks_of(w, dtype, [&](int q) { return base * (q + 1); });
  const auto mine = (base * (r + 1)).to(dtype);
  out.fill_(-1);
  auto plain = at::empty({w * n}, dtype);
  pg.all_gather(out, mine)->wait();
  pg.all_gather(plain, mine)->wait();
  expect_equal(out, want, "all_gather into " + tag);
  expect_equal(out, plain, "all_gather into " + tag + " equals the staged one");
  out.fill_(-1);
  auto own_block = out.narrow(0, r * n, n);
  own_block.copy_(mine);
  pg.all_gather(out, own_block)->wait();
  expect_equal(out, want, "all_gather from its own block of " + tag);
}

// `buffer` (as check_gather_into_buffer's), w blocks of `n`, reduce-scattered by `pg` (block q of
// rank r is (r + 1) * base + q) for every op: into a plain tensor and into this rank's own block,
// against the closed forms and bit for bit the staged reduce-scatter of a plain copy; the other
// blocks of the buffer stay.
void check_scatter_of_buffer(ddp::comm::ProcessGroup& pg, at::Tensor buffer, int64_t n,
                             const std::string& tag) {
  const int w = pg.world_size();
  const int r = pg.rank();
  const auto dtype = buffer.scalar_type();
  const auto base = exact_base(n, dtype);
  const auto input = blocks_of(w, dtype, [&](int q) { return base * (r + 1) + q; });
  const auto sum = (base * (w * (w + 1) / 2) + r * w).to(dtype);
  const std::vector<std::pair<ReduceOp, at::Tensor>> cases = {
      {ReduceOp::kSum, sum},
      {ReduceOp::kAvg, at::isIntegralType(dtype, false) ? sum.div(w, "trunc") : sum.div(w)},
      {ReduceOp::kMin, (base + r).to(dtype)},
      {ReduceOp::kMax, (base * w + r).to(dtype)}};
  for (const auto& [op, want] : cases) {
    const std::string what = fmt::format("reduce_scatter({}) of {}", to_string(op), tag);
    buffer.copy_(input);
    auto out = at::empty({n}, dtype);
    auto staged = at::empty({n}, dtype);
    auto plain = input.clone();
    pg.reduce_scatter(out, buffer, op)->wait();
    pg.reduce_scatter(staged, plain, op)->wait();
    expect_equal(out, want, what);
    expect_equal(out, staged, what + " equals the staged one");
    auto own_block = buffer.narrow(0, r * n, n);
    pg.reduce_scatter(own_block, buffer, op)->wait();
    expect_equal(own_block, want, what + " into its own block");
    expect_equal(buffer.narrow(0, 0, r * n), input.narrow(0, 0, r * n), what + ": blocks before");
    expect_equal(buffer.narrow(0, (r + 1) * n, (w - r - 1) * n),
                 input.narrow(0, (r + 1) * n, (w - r - 1) * n), what + ": blocks after");
  }
}

// Rank 0's memory in a buffer, the others' plain (an FSDP unit that found a free slot on one rank
// only): every rank's all-gather and reduce-scatter staged, and right.
void check_some_ranks_in_buffers(ddp::comm::ProcessGroup& owner, ddp::comm::ProcessGroup& pg) {
  const int w = pg.world_size();
  const int r = pg.rank();
  constexpr int64_t n = 1001;
  auto memory = r == 0 ? owner.allocate_buffer(w * n, at::TensorOptions(at::kFloat))
                       : at::empty({w * n}, at::kFloat);
  if (r != 0) owner.allocate_buffer(w * n, at::TensorOptions(at::kFloat));  // a collective
  check_gather_into_buffer(pg, memory, n, "rank 0's buffer and plain tensors");
  check_scatter_of_buffer(pg, memory, n, "rank 0's buffer and plain tensors");
}

// Both on the group and on a subgroup of every rank (its buffers are the group's, as FSDP's
// reduce-scatters on its reduce group are of the buffers its group allocated), for odd sizes in
// four dtypes and past a slot.
void check_gathers_and_scatters(ddp::comm::ProcessGroup& pg) {
  std::vector<int> everyone(static_cast<size_t>(pg.world_size()));
  for (int q = 0; q < pg.world_size(); ++q) everyone[static_cast<size_t>(q)] = q;
  auto sub = pg.new_group(everyone);
  expect_true(sub->backend_name() == "shm", "the subgroup of every rank shares memory");
  for (auto dtype : {at::kFloat, at::kDouble, at::kLong, at::kBFloat16}) {
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1001}, kPastASlot / pg.world_size()}) {
      if (n > 1001 && !wide(dtype)) continue;
      const std::string tag = fmt::format("a buffer of {} blocks of {} {}", pg.world_size(), n,
                                          ddp::comm::dtype_name(dtype));
      auto buffer = pg.allocate_buffer(pg.world_size() * n, at::TensorOptions(dtype));
      check_gather_into_buffer(pg, buffer, n, tag);
      check_scatter_of_buffer(pg, buffer, n, tag);
      check_gather_into_buffer(*sub, buffer, n, tag + " on a subgroup");
      check_scatter_of_buffer(*sub, buffer, n, tag + " on a subgroup");
    }
  }
  check_some_ranks_in_buffers(pg, pg);
  check_some_ranks_in_buffers(pg, *sub);
}

// A buffer of a group that is then destroyed (a subgroup of every rank, shared memory again):
// the tensor keeps its memory mapped, readable and writable.
void check_buffer_outlives_its_group(ddp::comm::ProcessGroup& pg) {
  const int w = pg.world_size();
  std::vector<int> everyone(static_cast<size_t>(w));
  for (int q = 0; q < w; ++q) everyone[static_cast<size_t>(q)] = q;
  at::Tensor kept;
  {
    auto group = pg.new_group(everyone);
    expect_true(group->backend_name() == "shm", "the subgroup of every rank shares memory");
    kept = group->allocate_buffer(1001, at::TensorOptions(at::kDouble));
    kept.fill_(pg.rank() + 1);
    group->all_reduce(kept)->wait();
  }
  const double sum = w * (w + 1) / 2.0;
  expect_true(ddp::testing::in_shared_segment(kept.data_ptr()),
              "a buffer after its group is gone is still mapped");
  expect_equal(kept, at::full({1001}, sum, at::kDouble), "a buffer after its group is gone");
  kept.add_(1);
  expect_equal(kept, at::full({1001}, sum + 1, at::kDouble), "a buffer written after its group");
}

// A buffer of `numel` float32 elements a rank, which says where it lies: where it does not fit (a
// test's small /dev/shm), ordinary memory, and its all-reduces still right.
void check_buffer_of(ddp::comm::ProcessGroup& pg, int64_t numel) {
  auto buffer = pg.allocate_buffer(numel, at::TensorOptions(at::kFloat));
  std::cout << "rank " << pg.rank() << ": the buffer is "
            << (ddp::testing::in_shared_segment(buffer.data_ptr()) ? "shared" : "ordinary")
            << " memory" << std::endl;
  expect_true(buffer.numel() == numel && buffer.eq(0).all().item<bool>(), "zero-filled");
  check_ops_in_place(pg, buffer, fmt::format("a buffer of {} float32", numel));
  const int64_t shard = numel / pg.world_size();
  const std::string tag = fmt::format("a buffer of {} float32 blocks", shard);
  auto blocks = buffer.narrow(0, 0, shard * pg.world_size());
  check_gather_into_buffer(pg, blocks, shard, tag);
  check_scatter_of_buffer(pg, blocks, shard, tag);
}

// The last rank dies at the second collective (`kind`: all-reduce, buffer-all-reduce or
// buffer-all-gather, the last gathering 1000 floats a rank into a buffer of the group); the
// others print how theirs ended.
void die_in(ddp::comm::ProcessGroup& pg, const std::string& kind) {
  const int64_t n = kind == "buffer-all-gather" ? 1000 * pg.world_size() : 1000;
  auto t = kind == "all-reduce" ? at::ones({n}, at::kFloat)
                                : pg.allocate_buffer(n, at::TensorOptions(at::kFloat)).fill_(1);
  const auto collective = [&] {
    if (kind == "buffer-all-gather") return pg.all_gather(t, at::ones({1000}, at::kFloat));
    return pg.all_reduce(t);
  };
  collective()->wait();
  std::cout << "rank " << pg.rank() << ": pid " << ::getpid() << ", backend " << pg.backend_name()
            << std::endl;
  if (pg.rank() == pg.world_size() - 1) ::raise(SIGKILL);
  const auto start = std::chrono::steady_clock::now();
  try {
    collective()->wait();
    std::cout << "rank " << pg.rank() << ": the last collective returned" << std::endl;
  } catch (const ddp::comm::CommError& e) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - start);
    std::cout << "rank " << pg.rank() << ": after " << ms.count() << " ms: " << e.what()
              << std::endl;
    throw;
  }
}

// Rank 0 all-reduces a buffer of the group, the others a plain tensor of the same size.
void buffer_mismatch(ddp::comm::ProcessGroup& pg) {
  auto buffer = pg.allocate_buffer(1000, at::TensorOptions(at::kFloat));
  auto t = pg.rank() == 0 ? buffer : at::ones({1000}, at::kFloat);
  pg.all_reduce(t)->wait();
  std::cout << "rank " << pg.rank() << ": all_reduce returned" << std::endl;
}

void all_reduce_until_error(ddp::comm::ProcessGroup& pg) {
  std::cout << "rank " << pg.rank() << ": pid " << ::getpid() << ", backend " << pg.backend_name()
            << std::endl;
  auto t = at::ones({64}, at::kFloat);
  auto said = std::chrono::steady_clock::now();
  for (int64_t n = 1;; ++n) {
    pg.all_reduce(t)->wait();
    if (n == 1 || std::chrono::steady_clock::now() - said > std::chrono::milliseconds(200)) {
      std::cout << "rank " << pg.rank() << ": " << n << " all_reduces" << std::endl;
      said = std::chrono::steady_clock::now();
    }
  }
}

// The group a ShmProcessGroup sets up over: every collective goes to `inner`, except that rank
// `rank`'s `k`-th kills this process or throws.
class FaultAtCollective : public ddp::comm::ProcessGroup {
 public:
  FaultAtCollective(std::shared_ptr<ProcessGroup> inner, int rank, int k, std::string mode)
      : ProcessGroup(inner->rank(), inner->world_size(), inner->options()),
        inner_(std::move(inner)),
        k_(rank == inner_->rank() ? k : 0),
        mode_(std::move(mode)) {
    wrap(*inner_);
  }
  std::string backend_name() const override { return inner_->backend_name(); }
  // After the set-up: K was past its collectives.
  void fault_if_not_yet() const {
    if (k_ > 0) ::raise(SIGKILL);
  }

 protected:
  using WorkPtr = ddp::comm::WorkPtr;
  using Info = ddp::comm::CollectiveInfo;
  using Op = ddp::comm::ReduceOp;
  WorkPtr do_all_reduce(at::Tensor& t, Op op, const Info&) override {
    fault();
    return inner_->all_reduce(t, op);
  }
  WorkPtr do_broadcast(at::Tensor& t, int root, const Info&) override {
    fault();
    return inner_->broadcast(t, root);
  }
  WorkPtr do_all_gather(at::Tensor& out, const at::Tensor& in, const Info&) override {
    fault();
    return inner_->all_gather(out, in);
  }
  WorkPtr do_reduce_scatter(at::Tensor& out, const at::Tensor& in, Op op, const Info&) override {
    fault();
    return inner_->reduce_scatter(out, in, op);
  }
  WorkPtr do_all_to_all(at::Tensor& out, const at::Tensor& in, const Info&) override {
    fault();
    return inner_->all_to_all(out, in);
  }
  WorkPtr do_barrier(const Info&) override {
    fault();
    return inner_->barrier();
  }
  std::shared_ptr<ProcessGroup> do_new_group(const std::vector<int>& ranks, const Info&) override {
    return inner_->new_group(ranks);
  }

 private:
  void fault() {
    if (k_ == 0 || --k_ > 0) return;
    std::cout << "rank " << rank() << ": fault (" << mode_ << ") at a set-up collective"
              << std::endl;
    if (mode_ == "kill") ::raise(SIGKILL);
    throw ddp::Error("fault: this rank's set-up failed here");
  }

  std::shared_ptr<ProcessGroup> inner_;
  int k_;
  std::string mode_;
};

int shm_set_up_fault(const std::shared_ptr<ddp::comm::ProcessGroup>& gloo, int rank, int k,
                     const std::string& mode) {
  auto faulty = std::make_shared<FaultAtCollective>(gloo, rank, k, mode);
#ifndef DDP_HAVE_GLOO  // the shm backend is built over gloo only (a wheel without gloo's headers)
  std::cout << "rank " << gloo->rank() << ": no shm backend in this build (no gloo)" << std::endl;
  return 1;
#else
  try {
    auto shm = ddp::comm::make_shm_process_group(faulty, gloo->options());
    auto buffer = shm->allocate_buffer(1000, at::TensorOptions(at::kFloat));
    faulty->fault_if_not_yet();
    std::cout << "rank " << gloo->rank() << ": set-up done, backend " << shm->backend_name()
              << std::endl;
    shm->barrier()->wait();
  } catch (const ddp::Error& e) {
    std::cout << "rank " << gloo->rank() << ": set-up ended: " << e.what() << std::endl;
    return 1;
  }
  return 0;
#endif
}

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> out;
  size_t begin = 0;
  for (size_t at; (at = text.find(separator, begin)) != std::string::npos; begin = at + 1) {
    out.push_back(text.substr(begin, at - begin));
  }
  out.push_back(text.substr(begin));
  return out;
}
std::vector<std::string> split_commas(const std::string& text) { return split(text, ','); }

// The port case `index`'s group meets on: rank 0 takes a free one and writes it into `dir` (a
// file renamed into place), the others wait for it there.
std::string case_port(const std::string& dir, int index, int rank) {
  const std::string path = fmt::format("{}/case-{}.port", dir, index);
  if (rank == 0) {
    const int port = ddp::net::listen_tcp("127.0.0.1", 0).port;
    {
      std::ofstream(path + ".tmp") << port;
    }
    std::filesystem::rename(path + ".tmp", path);
    return std::to_string(port);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  std::string port;
  while (!(std::ifstream(path) >> port) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return port;
}

// How the process `pid` ended: its exit code, 128 + the signal that ended it, or "timeout" (then
// it is killed) when it runs past `limit`.
std::string wait_for(pid_t pid, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return "timeout";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
}

// The set-up fault sweep in one launch: each case's ranks are processes forked from this one,
// which has loaded LibTorch already (a process that links it takes 0.45 s of CPU to start, 1 s
// under ASan: a launch a case cost the sweep 56 such starts). This process makes no thread and no
// group, so that a child starts as a fresh process would; the child's group is its own, on its own
// port, and the child ends as the worker of one case did.
int shm_set_up_faults(const std::string& backend, const std::string& dir,
                      const std::string& cases) {
  const int rank = ddp::comm::detect_launch(ddp::comm::current_env()).rank;
  int index = 0;
  for (const std::string& spec : split_commas(cases)) {
    const auto fields = split(spec, ':');
    if (fields.size() != 3) {
      throw ddp::InputError("comm_worker: a case is RANK:K:MODE, not " + spec);
    }
    const std::string port = case_port(dir, index, rank);
    // Flushed (endl) before the fork: the child copies no buffered output.
    std::cout << "[case " << index << "] begin" << std::endl;
    const pid_t child = ::fork();
    if (child == 0) {
      ::setenv("MASTER_PORT", port.c_str(), 1);
      // Before the gloo group: a rank whose group's creation fails (the other died at once at
      // its first collective) has said which process it was all the same.
      std::cout << "rank " << rank << ": pid " << ::getpid() << std::endl;
      ddp::comm::ProcessGroupOptions options;
      options.timeout = std::chrono::seconds(20);
      options.rendezvous_timeout = std::chrono::seconds(30);
      int code = 1;
      try {
        code = shm_set_up_fault(ddp::comm::create_process_group(
                                    backend, ddp::comm::detect_launch(ddp::comm::current_env()),
                                    options, /*cuda_device=*/false),
                                std::stoi(fields[0]), std::stoi(fields[1]), fields[2]);
      } catch (const ddp::Error& e) {
        std::cout << "error: " << e.what() << std::endl;
      }
      std::exit(code);
    }
    std::cout << "[case " << index << "] rank " << rank << ": exit "
              << wait_for(child, std::chrono::seconds(60)) << std::endl;
    ++index;
  }
  return 0;
}

// Every closed-form check of one group.
void check_all_collectives(ddp::comm::ProcessGroup& pg) {
  check_collectives(pg);
  check_reduce_scatter(pg);
  check_data_movement(pg);
  check_16bit_reductions(pg);
  if (pg.backend_name() == "gloo" || pg.backend_name() == "shm") check_float32_accumulation(pg);
  check_overlapped_16bit(pg);
  check_new_group(pg);
}

// The scenarios that look inside one group, in turn on one group of `backend`.
int run_group_scenarios(const std::string& backend, const std::vector<std::string>& scenarios) {
  const auto launch = ddp::comm::detect_launch(ddp::comm::current_env());
  ddp::comm::ProcessGroupOptions options;
  options.rendezvous_timeout = std::chrono::seconds(30);
  std::shared_ptr<ddp::comm::ProcessGroup> pg =
      ddp::comm::create_process_group(backend, launch, options, /*cuda_device=*/false);
  std::shared_ptr<ddp::comm::ProcessGroup> shm;  // over pg, made by the first scenario using it
  const auto shm_group = [&]() -> ddp::comm::ProcessGroup* {
#ifdef DDP_HAVE_GLOO
    if (!shm && backend == "gloo") shm = ddp::comm::make_shm_process_group(pg, options);
#endif
    return shm.get();
  };
  const auto run = [&](const std::string& scenario, const std::string& argument) {
    g_checks = g_failures = 0;
    if (scenario == "collectives") {
      check_all_collectives(*pg);
    } else if (scenario == "shm-collectives") {
      ddp::comm::ProcessGroup* group = shm_group();
      expect_true(group != nullptr, "a shared-memory group over " + backend);
      if (group != nullptr) check_all_collectives(*group);
    } else if (scenario == "shm-buffers" || scenario == "shm-buffer") {
      ddp::comm::ProcessGroup* group = shm_group();
      expect_true(group != nullptr, "a shared-memory group over " + backend);
      if (group != nullptr && scenario == "shm-buffers") {
        check_buffers(*group);
        check_buffer_outlives_its_group(*group);
      } else if (group != nullptr) {
        check_buffer_of(*group, std::stoll(argument));
      }
    } else if (scenario == "shm-gathers") {
      ddp::comm::ProcessGroup* group = shm_group();
      expect_true(group != nullptr, "a shared-memory group over " + backend);
      if (group != nullptr) check_gathers_and_scatters(*group);
    } else if (scenario == "versus-gloo") {
      expect_true(backend == "gloo", "versus-gloo runs on gloo, not " + backend);
      versus_gloo(pg.get(), shm_group());
    } else if (scenario == "hierarchical") {
      check_hierarchical(*pg, *ddp::comm::hierarchical(pg, split_commas(argument)));
    } else {
      throw ddp::InputError("comm_worker: no scenario " + scenario);
    }
    std::cout << fmt::format("rank {}/{}: {} checks, {} failures", pg->rank(), pg->world_size(),
                             g_checks, g_failures)
              << std::endl;
    return g_failures == 0 ? 0 : 3;
  };
  return ddp::testing::run_scenarios(scenarios, pg->rank(), run, [&] { pg->barrier()->wait(); });
}

}  // namespace

int run(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: comm_worker BACKEND SCENARIO...|skip|setup [TIMEOUT_MS]\n";
    return 64;
  }
  const std::string backend = argv[1];
  const std::string scenario = argv[2];
  try {
    if (scenario == "shm-set-up-faults" && argc > 4) {
      return shm_set_up_faults(backend, argv[3], argv[4]);
    }
    if (scenario == "mismatch" && argc > 4) {
      return mismatch(backend, std::vector<std::string>(argv + 4, argv + argc),
                      std::chrono::milliseconds(std::stoll(argv[3])));
    }
    const std::vector<std::string> single = {"skip",
                                             "setup",
                                             "die-in-all-reduce",
                                             "die-in-buffer-all-reduce",
                                             "die-in-buffer-all-gather",
                                             "buffer-mismatch",
                                             "all-reduce-until-error"};
    if (std::find(single.begin(), single.end(), scenario) == single.end()) {
      return run_group_scenarios(backend, std::vector<std::string>(argv + 2, argv + argc));
    }
    const auto launch = ddp::comm::detect_launch(ddp::comm::current_env());
    ddp::comm::ProcessGroupOptions options;
    if (argc > 3) options.timeout = std::chrono::milliseconds(std::stoll(argv[3]));
    options.rendezvous_timeout = std::chrono::seconds(30);
    std::shared_ptr<ddp::comm::ProcessGroup> pg =
        ddp::comm::create_process_group(backend, launch, options, /*cuda_device=*/false);
    if (scenario == "all-reduce-until-error") all_reduce_until_error(*pg);
    if (scenario.rfind("die-in-", 0) == 0) {
      die_in(*pg, scenario.substr(7));
      return 0;
    }
    if (scenario == "buffer-mismatch") {
      buffer_mismatch(*pg);
      return 0;
    }
    if (scenario == "skip") {
      auto t = at::ones({1000}, at::kFloat);
      pg->all_reduce(t)->wait();  // #1: everyone
      if (pg->rank() == pg->world_size() - 1) {
        std::cout << "rank " << pg->rank() << ": not joining all_reduce #2" << std::endl;
        // Long enough for the others to time out, short enough not to slow the test.
        std::this_thread::sleep_for(3 * options.timeout);
        return 0;
      }
      pg->all_reduce(t)->wait();  // #2: the last rank never comes
      std::cout << "rank " << pg->rank() << ": all_reduce #2 returned" << std::endl;
      return 0;
    }
    std::cout << "rank " << pg->rank() << ": group created, backend " << pg->backend_name()
              << std::endl;
    return 0;
  } catch (const ddp::Error& e) {
    std::cout << "error: " << e.what() << std::endl;
    return e.exit_code();
  }
}

}  // namespace comm_worker
