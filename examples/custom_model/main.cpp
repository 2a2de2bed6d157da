// Your own LibTorch program, trained data-parallel with ddp, one process per rank:
//   launcher --nproc 2 custom_model MNIST_DIR [WEIGHTS_PATH]   (or mpirun -np 2 ...)
// MNIST_DIR holds the four unpacked files of MNIST or Fashion-MNIST (the same names), as
// torch::data::datasets::MNIST reads them. Lines marked "ddp:" are what data-parallel adds to
// the single-process program; the rest is plain LibTorch (docs/porting.md goes through them).
#include <ddp/comm/rendezvous.h>
#include <ddp/common/log.h>
#include <ddp/core/distributed_data_parallel.h>
#include <ddp/data/distributed_sampler.h>
#include <ddp/train/state_dict.h>
#include <torch/torch.h>

#include <iostream>

// A small CNN for 28x28 grey images. Python: the same three layers in an nn.Module.
struct Net : torch::nn::Module {
  Net() {
    register_module("conv1", conv1);  // the names become the keys of the weights file
    register_module("conv2", conv2);
    register_module("fc", fc);
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(conv1(x)), 2);  // 16 x 14 x 14
    x = torch::max_pool2d(torch::relu(conv2(x)), 2);  // 32 x 7 x 7
    return fc(x.flatten(1));
  }
  torch::nn::Conv2d conv1{torch::nn::Conv2dOptions(1, 16, 3).padding(1)};
  torch::nn::Conv2d conv2{torch::nn::Conv2dOptions(16, 32, 3).padding(1)};
  torch::nn::Linear fc{32 * 7 * 7, 10};
};

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: custom_model MNIST_DIR [WEIGHTS_PATH]\n";
    return 2;
  }
  const std::string data_dir = argv[1];
  const std::string weights_path = argc > 2 ? argv[2] : "custom_model.pt";
  try {
    // ddp: the process group of however we were started (launcher, torchrun, mpirun, Slurm or
    // none): shared memory on one host (mpi across hosts under mpirun), local alone. Python:
    // init_process_group().
    auto group = ddp::init_process_group();
    const int rank = group->rank(), world = group->world_size();
    ddp::log::init(rank, "info");  // ddp: info on rank 0; others warnings and errors only
    ddp::log::info("world size {}, backend {}", world, group->backend_name());

    using torch::data::datasets::MNIST;
    const auto normalize = torch::data::transforms::Normalize<>(0.2860, 0.3530);  // Fashion-MNIST
    auto train_set =
        MNIST(data_dir, MNIST::Mode::kTrain).map(normalize).map(torch::data::transforms::Stack<>());
    auto test_set =
        MNIST(data_dir, MNIST::Mode::kTest).map(normalize).map(torch::data::transforms::Stack<>());
    const int64_t test_size = static_cast<int64_t>(test_set.size().value());

    // ddp: each rank loads its shard of the first 6,000 training images (so the example runs in
    // seconds), reshuffled every epoch exactly as PyTorch's DistributedSampler does.
    ddp::data::DistributedSampler sampler(6000, world, rank, /*shuffle=*/true);
    auto train_loader = torch::data::make_data_loader(
        std::move(train_set), sampler, torch::data::DataLoaderOptions(32).workers(2));

    // The model, wrapped. ddp: rank 0's weights go to every rank, and backward averages gradients.
    torch::manual_seed(0);  // the same initial weights on every run
    auto net = std::make_shared<Net>();
    ddp::DistributedDataParallel model(net, group);
    torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));

    for (int64_t epoch = 0; epoch < 2; ++epoch) {
      sampler.set_epoch(epoch);  // ddp: as in Python; it reaches the loader's copy
      double loss_sum = 0;
      int64_t batches = 0;
      for (auto& batch : *train_loader) {
        optimizer.zero_grad();
        auto loss = torch::cross_entropy_loss(model->forward(batch.data), batch.target);
        loss.backward();  // gradients averaged over the ranks when this returns
        optimizer.step();
        loss_sum += loss.item<double>();
        ++batches;
      }
      // ddp: the mean loss over all ranks; every rank joins the collective, rank 0 logs it.
      auto mean_loss = torch::tensor({loss_sum / static_cast<double>(batches)});
      group->all_reduce(mean_loss, ddp::comm::ReduceOp::kAvg)->wait();
      ddp::log::info("epoch {}: train loss {:.4f}", epoch + 1, mean_loss.item<double>());
    }

    // Test accuracy. ddp: every test image on exactly one rank (unpadded shards), counts summed
    // over the ranks. The net itself, not the wrapper: its forward is no collective, so the
    // ranks' shard sizes may differ.
    torch::NoGradGuard no_grad;
    auto test_loader = torch::data::make_data_loader(
        std::move(test_set), ddp::data::DistributedSampler::for_evaluation(test_size, world, rank),
        torch::data::DataLoaderOptions(200));
    int64_t correct = 0, seen = 0;
    for (auto& batch : *test_loader) {
      correct += net->forward(batch.data).argmax(1).eq(batch.target).sum().item<int64_t>();
      seen += batch.target.size(0);
    }
    auto counts = torch::tensor({correct, seen});
    group->all_reduce(counts)->wait();  // sum
    ddp::log::info("test accuracy {:.4f} on {} images",
                   counts[0].item<double>() / counts[1].item<double>(), counts[1].item<int64_t>());

    // ddp: rank 0 writes the weights; Python loads them into nn.DataParallel(Net()) (`module.`).
    if (rank == 0) {
      ddp::train::save_weights(*net, weights_path);
      ddp::log::info("weights written to {}", weights_path);
    }
    group->barrier()->wait();  // every rank leaves once the file is there
    return 0;
  } catch (const std::exception& e) {
    ddp::log::error("{}", e.what());  // logged by every rank that fails
    return 1;
  }
}
