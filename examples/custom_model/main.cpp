// Your own torch::nn::Module, trained data-parallel with ddp, one process per rank:
//   launcher --nproc 2 custom_model [FASHION_MNIST_DIR] [WEIGHTS_PATH]   (or mpirun -np 2 ...)
#include <ddp/comm/rendezvous.h>
#include <ddp/common/log.h>
#include <ddp/core/distributed_data_parallel.h>
#include <ddp/data/dataset.h>
#include <ddp/data/distributed_sampler.h>
#include <ddp/train/state_dict.h>
#include <torch/torch.h>

// A small CNN for 28x28 grey images. Python: the same three layers in an nn.Module.
struct NetImpl : torch::nn::Module {
  torch::nn::Conv2d conv1{torch::nn::Conv2dOptions(1, 16, 3).padding(1)};
  torch::nn::Conv2d conv2{torch::nn::Conv2dOptions(16, 32, 3).padding(1)};
  torch::nn::Linear fc{32 * 7 * 7, 10};
  NetImpl() {
    register_module("conv1", conv1);  // the names become the keys of the weights file
    register_module("conv2", conv2);
    register_module("fc", fc);
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(conv1(x)), 2);  // 16 x 14 x 14
    x = torch::max_pool2d(torch::relu(conv2(x)), 2);  // 32 x 7 x 7
    return fc(x.flatten(1));
  }
};
TORCH_MODULE(Net);

int main(int argc, char** argv) {
  const std::string data_dir = argc > 1 ? argv[1] : "/usr/share/datasets/fashion-mnist";
  const std::string weights_path = argc > 2 ? argv[2] : "custom_model.pt";
  try {
    // The process group of however we were started (launcher, torchrun, mpirun, Slurm or none):
    // gloo under the launcher, mpi under mpirun, local alone. Python: dist.init_process_group().
    auto group = ddp::init_process_group();
    const int rank = group->rank(), world = group->world_size();
    ddp::log::init(rank, "info");  // info on rank 0; others warnings and errors only
    ddp::log::info("world size {}, backend {}", world, group->backend_name());

    // Data: the first 6,000 training images, so the example runs in seconds, and the test set.
    using ddp::data::Split;
    const auto train = ddp::data::load_fashion_mnist(data_dir, Split::kTrain).slice(0, 6000);
    const auto test = ddp::data::load_fashion_mnist(data_dir, Split::kTest);

    // The model, wrapped: rank 0's weights go to every rank, and backward averages gradients.
    torch::manual_seed(0);  // the same initial weights on every run
    Net net;
    ddp::DistributedDataParallel model(net, group);
    torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));

    // Each rank trains on its shard, reshuffled every epoch exactly as PyTorch's sampler does.
    ddp::data::DistributedSampler sampler(train.size(), world, rank, /*shuffle=*/true);
    for (int64_t epoch = 0; epoch < 2; ++epoch) {
      sampler.set_epoch(epoch);
      double loss_sum = 0;
      const auto batches = sampler.indices().split(32);  // 32 images per rank and step
      for (const auto& indices : batches) {
        const auto batch = train.gather(indices);
        model->zero_grad();
        auto loss = torch::cross_entropy_loss(model->forward(batch.input), batch.target);
        loss.backward();  // gradients averaged over the ranks when this returns
        optimizer.step();
        loss_sum += loss.item<double>();
      }
      // The mean loss over all ranks: every rank joins the collective, rank 0 logs it.
      auto mean_loss = torch::tensor({loss_sum / static_cast<double>(batches.size())});
      group->all_reduce(mean_loss, ddp::comm::ReduceOp::kAvg)->wait();
      ddp::log::info("epoch {}: train loss {:.4f}", epoch + 1, mean_loss.item<double>());
    }

    // Test accuracy: every test image on exactly one rank, counts summed over the ranks. The
    // net itself, not the wrapper: its forward is no collective, so shard sizes may differ.
    torch::NoGradGuard no_grad;
    int64_t correct = 0;
    const auto mine = ddp::data::evaluation_indices(test.size(), world, rank);
    for (const auto& indices : mine.split(200)) {
      const auto batch = test.gather(indices);
      correct += net->forward(batch.input).argmax(1).eq(batch.target).sum().item<int64_t>();
    }
    auto counts = torch::tensor({correct, mine.size(0)});
    group->all_reduce(counts)->wait();  // sum
    ddp::log::info("test accuracy {:.4f} on {} images",
                   counts[0].item<double>() / counts[1].item<double>(), counts[1].item<int64_t>());

    // Rank 0 writes the weights; Python loads them into nn.DataParallel(Net()) (keys `module.`).
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
