// apps/examples/fashion_mnist_mlp: the smallest end-to-end job on built-in data. Trains a 2-layer MLP
// (784-256-10, ReLU, label-smoothed cross-entropy, SGD with momentum) on Fashion-MNIST straight from
// the idx files (gzipped or not; Debian's dataset-fashion-mnist puts them in
// /usr/share/datasets/fashion-mnist) using only the tensor/autograd core, and reports test accuracy.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/check.h"
#include "core/ops.h"
#include "core/parallel.h"
#include "core/parse.h"
#include "data/idx.h"

using namespace ringtrain;
namespace fs = std::filesystem;

namespace {

struct Split {
  Tensor images;  // (N, 784) f32 in [0, 1], normalised below
  Tensor labels;  // (N) i64
};

Split load_split(const fs::path& dir, const std::string& prefix) {
  const std::string image_name = prefix + "-images-idx3-ubyte", label_name = prefix + "-labels-idx1-ubyte";
  // A missing file most likely means the dataset package is not installed: say how to get it.
  for (const std::string& name : {image_name, label_name})
    if (!fs::exists(dir / name) && !fs::exists(dir / (name + ".gz")))
      RT_THROW("Fashion-MNIST file '", (dir / name).string(),
               "' (or .gz) not found; install Debian's dataset-fashion-mnist or pass the folder with --data");
  const data::IdxSplit split = data::read_idx_split(dir / image_name, dir / label_name);
  const int64_t n = split.images.count, pixels = split.images.rows * split.images.cols;
  Tensor raw = Tensor::empty(Shape{n, pixels}, DType::U8);
  std::memcpy(raw.data_ptr(), split.images.pixels.data(), static_cast<size_t>(n * pixels));
  Tensor lab = Tensor::empty(Shape{n}, DType::U8);
  std::memcpy(lab.data_ptr(), split.labels.labels.data(), static_cast<size_t>(n));
  // Fashion-MNIST mean/std of pixel/255.
  Tensor x = mul(add(mul(raw.to(DType::F32), 1.0 / 255.0), -0.2860), 1.0 / 0.3530);
  return {x, lab.to(DType::I64)};
}

// The value after `name`, a whole number in [1, hi] (core/parse.h: nothing wraps or truncates), or `fallback`.
int flag_int(int argc, char** argv, const char* name, int fallback, int hi) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) {
      RT_CHECK(i + 1 < argc, name, " needs a value");
      return parse_number<int>(name, argv[i + 1], {1, hi});
    }
  return fallback;
}

}  // namespace

int main(int argc, char** argv) try {
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0) {
      std::printf("usage: fashion_mnist_mlp [--data DIR] [--epochs N=2] [--batch-size B=128] [--threads T]\n");
      return 0;
    }
    if (std::strcmp(argv[i], "--data") == 0 && i + 1 < argc) data_dir = argv[i + 1];
  }
  const int epochs = flag_int(argc, argv, "--epochs", 2, 1000000),
            batch = flag_int(argc, argv, "--batch-size", 128, 60000);
  if (int t = flag_int(argc, argv, "--threads", 0, 1024); t > 0) set_num_threads(t);

  Split train = load_split(data_dir, "train"), test = load_split(data_dir, "t10k");
  std::printf("Fashion-MNIST from %s: %lld train, %lld test images; %d CPU threads\n", data_dir.c_str(),
              static_cast<long long>(train.images.size(0)), static_cast<long long>(test.images.size(0)), num_threads());

  // He-initialised weights (PyTorch layout: (out, in)).
  const int64_t hidden = 256;
  Tensor w1 = Tensor::normal(Shape{hidden, 784}, 0, std::sqrt(2.0 / 784), 1).set_requires_grad();
  Tensor b1 = Tensor::zeros(Shape{hidden}).set_requires_grad();
  Tensor w2 = Tensor::normal(Shape{10, hidden}, 0, std::sqrt(2.0 / hidden), 2).set_requires_grad();
  Tensor b2 = Tensor::zeros(Shape{10}).set_requires_grad();
  std::vector<Tensor*> params{&w1, &b1, &w2, &b2};
  std::vector<Tensor> velocity;
  for (Tensor* p : params) velocity.push_back(Tensor::zeros(p->shape()));
  auto forward = [&](const Tensor& x) { return linear(relu(linear(x, w1, b1)), w2, b2); };

  const int64_t n = train.images.size(0), steps_per_epoch = n / batch;
  const double lr = 0.05, momentum = 0.9;
  auto start = std::chrono::steady_clock::now();
  for (int epoch = 0; epoch < epochs; ++epoch) {
    double loss_sum = 0;
    for (int64_t step = 0; step < steps_per_epoch; ++step) {
      // Epoch-dependent stride permutation of batches keeps it simple and deterministic.
      const int64_t b = (step * 7919 + epoch * 104729) % steps_per_epoch;
      Tensor loss = cross_entropy(forward(train.images.slice(b * batch, (b + 1) * batch)),
                                  train.labels.slice(b * batch, (b + 1) * batch), 0.1);
      loss.backward();
      loss_sum += loss.item();
      NoGradGuard no_grad;
      for (size_t i = 0; i < params.size(); ++i) {
        velocity[i].mul_(momentum).add_(params[i]->grad());
        params[i]->add_(velocity[i], -lr);
        params[i]->zero_grad();
      }
    }
    NoGradGuard no_grad;
    Tensor predicted = argmax(forward(test.images), 1);
    const double accuracy = sum(eq(predicted, test.labels).to(DType::I64)).item() / test.images.size(0);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("epoch %d: train loss %.4f, test top-1 %.2f%%, %.0f img/s\n", epoch + 1, loss_sum / steps_per_epoch,
                100 * accuracy, (epoch + 1) * steps_per_epoch * batch / seconds);
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "fashion_mnist_mlp: error: %s\n", e.what());
  return 1;
} catch (...) {
  std::fprintf(stderr, "fashion_mnist_mlp: error: an unknown exception\n");
  return 1;
}
