// One rank of the PowerSGD equivalence test (test_powersgd.cpp): reads what PyTorch's own
// powerSGD_hook made of known gradients (tests/python/powersgd_reference.py wrote DIR/rank<r>.pt
// on every rank), runs ours on the same inputs over a real process group, and exits 0 only if
//   - every result equals PyTorch's within 1e-5 (relative to the largest magnitude),
//   - the plain all-reduce steps equal the average of the ranks' inputs (read from their files),
//   - the PowerSGD steps differ from that average (compression happened),
//   - the state counted every iteration.
//   powersgd_worker BACKEND DIR
#include <fmt/format.h>
#include <torch/torch.h>

#include <iostream>

#include "ddp/core/powersgd.h"
#include "ddp/train/pt_file.h"
#include "worker_group.h"

namespace powersgd_worker {

namespace {

int g_failures = 0;

void expect(bool ok, const std::string& what) {
  if (!ok) ++g_failures;
  std::cout << (ok ? "ok   " : "FAIL ") << what << "\n";
}

double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}

c10::IValue field(const c10::IValue& dict, const std::string& key) {
  return dict.toGenericDict().at(key);
}

ddp::GradBucket make_bucket(size_t index, const c10::IValue& shapes, torch::Tensor buffer) {
  const auto list = shapes.toList();
  std::vector<torch::Tensor> gradients;
  int64_t offset = 0;
  for (size_t i = 0; i < list.size(); ++i) {
    std::vector<int64_t> shape;
    const auto dims = list.get(i).toList();
    for (size_t d = 0; d < dims.size(); ++d) shape.push_back(dims.get(d).toInt());
    const int64_t numel = c10::multiply_integers(shape);
    gradients.push_back(buffer.narrow(0, offset, numel).view(shape));
    offset += numel;
  }
  return ddp::GradBucket(index, 2, buffer, gradients, gradients);
}

// The average over ranks of bucket `b`'s input at `step` of configuration `c`.
torch::Tensor average_input(const std::vector<c10::IValue>& files, size_t c, size_t step,
                            size_t b) {
  torch::Tensor sum;
  for (const auto& file : files) {
    const auto config = field(file, "configs").toList().get(c);
    const auto input =
        field(field(config, "steps").toList().get(step), "inputs").toList().get(b).toTensor();
    sum = sum.defined() ? sum + input : input.clone();
  }
  return sum / static_cast<double>(files.size());
}

void check_config(const std::shared_ptr<ddp::comm::ProcessGroup>& group,
                  const std::vector<c10::IValue>& files, size_t c) {
  const auto& mine = files[static_cast<size_t>(group->rank())];
  const auto config = field(mine, "configs").toList().get(c);
  const auto start = field(config, "start").toInt();
  auto state =
      ddp::PowerSGDState(group, ddp::PowerSGDOptions()
                                    .matrix_approximation_rank(field(config, "rank").toInt())
                                    .start_powerSGD_iter(start)
                                    .warm_start(field(config, "warm_start").toBool())
                                    .use_error_feedback(field(config, "error_feedback").toBool()));
  const auto steps = field(config, "steps").toList();
  for (size_t step = 0; step < steps.size(); ++step) {
    const auto inputs = field(steps.get(step), "inputs").toList();
    const auto outputs = field(steps.get(step), "outputs").toList();
    for (size_t b = 0; b < inputs.size(); ++b) {
      auto bucket =
          make_bucket(b, field(mine, "shapes").toList().get(b), inputs.get(b).toTensor().clone());
      const auto ours = ddp::powersgd_hook(state, bucket)->wait();
      const auto theirs = outputs.get(b).toTensor();
      const double scale = std::max(1.0, theirs.abs().max().item<double>());
      const double diff = max_abs_diff(ours, theirs);
      const auto where =
          fmt::format("rank {} config {} step {} bucket {}", group->rank(), c, step, b);
      expect(diff <= 1e-5 * scale, fmt::format("{}: |ours - PyTorch's| = {:.3g}", where, diff));
      const double from_average = max_abs_diff(ours, average_input(files, c, step, b));
      if (static_cast<int64_t>(step) < start) {
        expect(from_average <= 1e-6 * scale,
               fmt::format("{}: plain all-reduce, |ours - average| = {:.3g}", where, from_average));
      } else {
        expect(from_average > 1e-3,
               fmt::format("{}: compressed, |ours - average| = {:.3g}", where, from_average));
      }
    }
  }
  expect(state.iter() == static_cast<int64_t>(steps.size()),
         fmt::format("rank {} config {}: {} iterations counted", group->rank(), c, state.iter()));
}

}  // namespace

int run(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: powersgd_worker BACKEND DIR\n";
    return 64;
  }
  try {
    const auto group = ddp::testing::worker_group(argv[1]);
    std::vector<c10::IValue> files;
    for (int r = 0; r < group->world_size(); ++r) {
      files.push_back(ddp::train::read_pt_file(fmt::format("{}/rank{}.pt", argv[2], r)));
    }
    const auto configs = field(files[0], "configs").toList().size();
    for (size_t c = 0; c < configs; ++c) check_config(group, files, c);
    std::cout << fmt::format("rank {}/{}: {} failures\n", group->rank(), group->world_size(),
                             g_failures);
    return g_failures == 0 ? 0 : 3;
  } catch (const std::exception& e) {
    std::cout << "error: " << e.what() << std::endl;
    return 2;
  }
}

}  // namespace powersgd_worker
