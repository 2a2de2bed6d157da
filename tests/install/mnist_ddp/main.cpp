// pytorch/examples' cpp/mnist made data-parallel, as its users would port it: torch::data's MNIST
// dataset and loader, a plain `struct Net : torch::nn::Module` in a std::shared_ptr, torch::optim's
// SGD; ddp adds the process group, the wrapper, the sampler and rank-0 saving. The install test
// (tests/scripts/install_example_test.sh) runs it and checks what it writes to OUT_DIR:
//   indices.rank<R>  the sample indices of each batch rank R trained, one batch a line
//   weights.pt       rank 0's weights after the epoch, as nn.DataParallel(Net()) names them
//   sampler.rank<R>.pt  with --stop-after: the sampler's state after that many batches
//
//   mnist_ddp MNIST_DIR OUT_DIR [--batch-size 32] [--images 1024] [--workers 2]
//             [--stop-after BATCHES | --resume FROM_DIR]
// MNIST_DIR holds MNIST's four unpacked files (Fashion-MNIST's have the same names).
#include <ddp/comm/rendezvous.h>
#include <ddp/core/distributed_data_parallel.h>
#include <ddp/data/distributed_sampler.h>
#include <ddp/train/state_dict.h>
#include <torch/torch.h>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>

// cpp/mnist's Net without its dropout: the test compares 2 ranks with one process, and dropout's
// random masks would differ between them.
struct Net : torch::nn::Module {
  Net()
      : conv1(torch::nn::Conv2dOptions(1, 10, /*kernel_size=*/5)),
        conv2(torch::nn::Conv2dOptions(10, 20, /*kernel_size=*/5)),
        fc1(320, 50),
        fc2(50, 10) {
    register_module("conv1", conv1);
    register_module("conv2", conv2);
    register_module("fc1", fc1);
    register_module("fc2", fc2);
  }

  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(torch::max_pool2d(conv1->forward(x), 2));
    x = torch::relu(torch::max_pool2d(conv2->forward(x), 2));
    x = x.view({-1, 320});
    x = torch::relu(fc1->forward(x));
    return torch::log_softmax(fc2->forward(x), /*dim=*/1);
  }

  torch::nn::Conv2d conv1, conv2;
  torch::nn::Linear fc1, fc2;
};

// MNIST with each example's index beside its label (target = {label, index}), so that the test
// can see which samples each rank trained. A ported program has no need of it.
struct Indexed : torch::data::datasets::Dataset<Indexed> {
  explicit Indexed(const std::string& root) : mnist(root) {}
  torch::data::Example<> get(size_t index) override {
    auto example = mnist.get(index);
    return {example.data,
            torch::stack({example.target, torch::tensor(static_cast<int64_t>(index))})};
  }
  c10::optional<size_t> size() const override { return mnist.size(); }
  torch::data::datasets::MNIST mnist;
};

struct Args {
  std::string data, out, resume;
  int64_t batch_size = 32, images = 1024, workers = 2, stop_after = 0;
};

Args parse(int argc, char** argv) {
  if (argc < 3) throw std::invalid_argument("usage: mnist_ddp MNIST_DIR OUT_DIR [options]");
  Args a{argv[1], argv[2]};
  for (int i = 3; i + 1 < argc; i += 2) {
    const std::string key = argv[i], value = argv[i + 1];
    if (key == "--batch-size")
      a.batch_size = std::stoll(value);
    else if (key == "--images")
      a.images = std::stoll(value);
    else if (key == "--workers")
      a.workers = std::stoll(value);
    else if (key == "--stop-after")
      a.stop_after = std::stoll(value);
    else if (key == "--resume")
      a.resume = value;
    else
      throw std::invalid_argument("mnist_ddp: unknown option " + key);
  }
  return a;
}

int main(int argc, char** argv) try {
  const Args args = parse(argc, argv);
  auto group = ddp::init_process_group();  // launcher, mpirun, or one process alone
  const int rank = group->rank(), world = group->world_size();
  const std::string me = args.out + "/indices.rank" + std::to_string(rank);

  torch::manual_seed(1);
  auto net = std::make_shared<Net>();
  ddp::DistributedDataParallel model(net, group);  // rank 0's weights on every rank

  auto dataset = Indexed(args.data)
                     .map(torch::data::transforms::Normalize<>(0.1307, 0.3081))
                     .map(torch::data::transforms::Stack<>());
  // The first --images samples, this rank's share of them, as torch's DistributedSampler.
  ddp::data::DistributedSampler sampler(args.images, world, rank, /*shuffle=*/true);
  if (!args.resume.empty()) {
    torch::serialize::InputArchive archive;
    archive.load_from(args.resume + "/sampler.rank" + std::to_string(rank) + ".pt");
    sampler.load(archive);
  }
  auto loader = torch::data::make_data_loader(
      std::move(dataset), sampler,
      torch::data::DataLoaderOptions(static_cast<size_t>(args.batch_size)).workers(args.workers));
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.5));

  std::ofstream indices(me);
  const int64_t epoch = 1;
  sampler.set_epoch(epoch);  // after a load: the same epoch, so it resumes
  int64_t batches = 0, trained = 0;
  double loss_sum = 0;
  for (auto& batch : *loader) {
    const auto labels = batch.target.select(1, 0), ids = batch.target.select(1, 1);
    for (int64_t i = 0; i < ids.size(0); ++i) indices << (i ? " " : "") << ids[i].item<int64_t>();
    indices << "\n";
    optimizer.zero_grad();
    auto loss = torch::nll_loss(model->forward(batch.data), labels);
    loss.backward();  // the gradients averaged over the ranks when this returns
    optimizer.step();
    loss_sum += loss.item<double>();
    trained += ids.size(0);
    if (++batches == args.stop_after) {
      // The loader's workers fetch ahead of this loop: save what was trained, not what was fetched.
      torch::serialize::OutputArchive archive;
      sampler.save(archive, trained);
      archive.save_to(args.out + "/sampler.rank" + std::to_string(rank) + ".pt");
      break;
    }
  }
  std::cout << "rank " << rank << "/" << world << ": epoch " << epoch << ", " << batches
            << " batches, mean loss " << loss_sum / std::max<int64_t>(batches, 1) << std::endl;
  if (rank == 0) ddp::train::save_weights(*net, args.out + "/weights.pt");  // Python: DataParallel
  return 0;
} catch (const std::exception& e) {
  std::cerr << "mnist_ddp: " << e.what() << "\n";
  return 1;
}
