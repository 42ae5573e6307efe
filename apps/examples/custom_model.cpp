// apps/examples/custom_model: your own CNN (not a ResNet) trained data-parallel on shard files.
//   mpirun -np 2 ./custom_model DATA_DIR [EPOCHS=2] [BATCH_PER_RANK=64]   (DATA_DIR from make_shards)
// The running example of docs/LIBRARY.md; apps/examples/out_of_tree builds it against an installed ringtrain.
#include <cstdio>
#include <string>

#include "comm/grad_sync.h"
#include "comm/world.h"
#include "core/autograd.h"
#include "core/optim/optimizer.h"
#include "data/loader.h"
#include "layers/basic.h"
#include "layers/batchnorm.h"
#include "layers/conv2d.h"
#include "layers/linear.h"
#include "layers/loss.h"
#include "layers/pooling.h"

using namespace ringtrain;

// conv-bn-relu, pool, conv-bn-relu, global average pool, linear. Modules registered in a Sequential get
// dotted names ("0.weight", "1.running_mean", ...) for state dicts and checkpoints.
std::shared_ptr<Sequential> make_net(int64_t channels, int64_t classes) {
  auto conv = [](int64_t in, int64_t out) { return std::make_shared<Conv2d>(in, out, Conv2dOptions{.padding = 1}); };
  auto net = std::make_shared<Sequential>();
  net->add(conv(channels, 32)).add(std::make_shared<BatchNorm2d>(32)).add(std::make_shared<ReLU>());
  net->add(std::make_shared<MaxPool2d>(2, 2));
  net->add(conv(32, 64)).add(std::make_shared<BatchNorm2d>(64)).add(std::make_shared<ReLU>());
  net->add(std::make_shared<GlobalAvgPool>()).add(std::make_shared<Linear>(64, classes));
  return net;
}

int main(int argc, char** argv) {
  return comm::run_main(argc, argv, [&](comm::World& world) {
    RT_CHECK(argc >= 2, "usage: custom_model DATA_DIR [EPOCHS] [BATCH_PER_RANK]");
    const int epochs = argc > 2 ? std::stoi(argv[2]) : 2, batch = argc > 3 ? std::stoi(argv[3]) : 64;
    world.bind(Device::cpu(), /*threads=*/0, /*allow_shared_gpu=*/false);  // threads: cores / local ranks

    auto train = data::ShardDataset::open(argv[1], "train"), test = data::ShardDataset::open(argv[1], "test");
    data::LoaderOptions lo{.transform = {.pad_crop = 2, .hflip = true}, .seed = 1};
    data::Loader train_loader(train, lo), test_loader(test, {.transform = {.train = false}});
    data::DistributedSampler sampler({.dataset_size = train.size(), .global_batch = batch * world.size(),
                                      .rank = world.rank(), .world_size = world.size(), .chunk = train.chunk_records()});

    manual_seed(1);
    auto net = make_net(train.info().channels, train.info().num_classes);
    // Broadcasts rank 0's weights, checks every rank holds the same model, then averages gradients
    // bucket by bucket while backward is still running.
    comm::GradSync sync(*net, comm::make_communicator(comm::Backend::Ring, world.comm()));
    Sgd opt(as_named(net->named_parameters()), {.momentum = 0.9, .weight_decay = 5e-4});
    LrSchedule lr({.base_lr = 0.1, .total_steps = epochs * sampler.batches_per_epoch(), .shape = LrShape::Cosine});
    CrossEntropyLoss loss_fn;

    int64_t step = 0;
    for (int epoch = 0; epoch < epochs; ++epoch) {
      sampler.set_epoch(epoch);
      train_loader.start_epoch(sampler, epoch);
      double loss_sum = 0;
      int64_t batches = 0;
      while (auto b = train_loader.next()) {
        Tensor loss = loss_fn((*net)(b->images), b->labels);
        loss.backward();  // full buckets start their all-reduce from here
        sync.finish();    // gradients now hold the average over ranks
        opt.step(lr.at(step++));
        sync.zero_grad();
        loss_sum += loss.item();
        ++batches;
      }
      // Exact test accuracy of one model: BatchNorm running statistics (per rank) are averaged, each rank
      // scores its share of the test split (padding slots past `valid` are not scored), counts are summed.
      sync.average_buffers();
      net->eval();
      NoGradGuard no_grad;
      test_loader.start(data::eval_batches(test.size(), world.rank(), world.size(), batch), epoch);
      double counts[2] = {0, 0};  // correct, seen
      while (auto b = test_loader.next()) {
        if (b->valid == 0) continue;
        Tensor predicted = argmax((*net)(b->images.slice(0, b->valid)), 1);
        counts[0] += sum(eq(predicted, b->labels.slice(0, b->valid)).to(DType::F64)).item();
        counts[1] += static_cast<double>(b->valid);
      }
      MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, counts, 2, MPI_DOUBLE, MPI_SUM, world.comm()));
      net->train();
      if (world.is_root())
        std::printf("epoch %d: train loss %.4f (rank 0), test accuracy %.2f%% of %.0f images on %d ranks\n", epoch + 1,
                    loss_sum / static_cast<double>(batches), 100 * counts[0] / counts[1], counts[1], world.size());
    }
    return 0;
  });
}
