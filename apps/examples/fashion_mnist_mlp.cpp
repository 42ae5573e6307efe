// apps/examples/fashion_mnist_mlp: the smallest end-to-end job on built-in data. Trains a 2-layer MLP
// (784-256-10, ReLU, label-smoothed cross-entropy, SGD with momentum) on Fashion-MNIST straight from
// the idx files (gzipped or not; Debian's dataset-fashion-mnist puts them in
// /usr/share/datasets/fashion-mnist) using only the tensor/autograd core, and reports test accuracy.
#include <zlib.h>

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

using namespace ringtrain;
namespace fs = std::filesystem;

namespace {

struct Split {
  Tensor images;  // (N, 784) f32 in [0, 1], normalised below
  Tensor labels;  // (N) i64
};

// Reads a whole idx file, transparently gunzipping ("NAME" or "NAME.gz").
std::vector<uint8_t> read_idx_bytes(const fs::path& dir, const std::string& name) {
  fs::path path = dir / name;
  if (!fs::exists(path)) path = dir / (name + ".gz");
  if (!fs::exists(path))
    RT_THROW("Fashion-MNIST file '", (dir / name).string(), "' (or .gz) not found; install Debian's "
             "dataset-fashion-mnist or pass the folder with --data");
  gzFile file = gzopen(path.c_str(), "rb");
  if (!file) RT_THROW("cannot open '", path.string(), "'");
  std::vector<uint8_t> bytes;
  uint8_t buffer[1 << 16];
  int n;
  while ((n = gzread(file, buffer, sizeof buffer)) > 0) bytes.insert(bytes.end(), buffer, buffer + n);
  const bool failed = n < 0;
  gzclose(file);
  if (failed) RT_THROW("'", path.string(), "' is corrupt (gzip read failed)");
  return bytes;
}

uint32_t big_endian(const std::vector<uint8_t>& b, size_t at) {
  return (uint32_t{b[at]} << 24) | (uint32_t{b[at + 1]} << 16) | (uint32_t{b[at + 2]} << 8) | b[at + 3];
}

Split load_split(const fs::path& dir, const std::string& prefix) {
  const std::string image_name = prefix + "-images-idx3-ubyte", label_name = prefix + "-labels-idx1-ubyte";
  std::vector<uint8_t> images = read_idx_bytes(dir, image_name), labels = read_idx_bytes(dir, label_name);
  if (images.size() < 16 || big_endian(images, 0) != 0x803)
    RT_THROW("'", (dir / image_name).string(), "' is not an idx3 image file (bad magic)");
  if (labels.size() < 8 || big_endian(labels, 0) != 0x801)
    RT_THROW("'", (dir / label_name).string(), "' is not an idx1 label file (bad magic)");
  const int64_t n = big_endian(images, 4), rows = big_endian(images, 8), cols = big_endian(images, 12);
  if (static_cast<int64_t>(big_endian(labels, 4)) != n)
    RT_THROW("'", (dir / image_name).string(), "' has ", n, " images but '", (dir / label_name).string(), "' has ",
             big_endian(labels, 4), " labels");
  if (static_cast<int64_t>(images.size()) != 16 + n * rows * cols || static_cast<int64_t>(labels.size()) != 8 + n)
    RT_THROW("'", (dir / image_name).string(), "' or its labels are truncated");
  Tensor raw = Tensor::empty(Shape{n, rows * cols}, DType::U8);
  std::memcpy(raw.data_ptr(), images.data() + 16, static_cast<size_t>(n * rows * cols));
  Tensor lab = Tensor::empty(Shape{n}, DType::U8);
  std::memcpy(lab.data_ptr(), labels.data() + 8, static_cast<size_t>(n));
  // Fashion-MNIST mean/std of pixel/255.
  Tensor x = mul(add(mul(raw.to(DType::F32), 1.0 / 255.0), -0.2860), 1.0 / 0.3530);
  return {x, lab.to(DType::I64)};
}

int flag_int(int argc, char** argv, const char* name, int fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) {
      char* end = nullptr;
      long v = std::strtol(argv[i + 1], &end, 10);
      if (*end != '\0' || v <= 0) RT_THROW("flag ", name, " needs a positive integer, got '", argv[i + 1], "'");
      return static_cast<int>(v);
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
  const int epochs = flag_int(argc, argv, "--epochs", 2), batch = flag_int(argc, argv, "--batch-size", 128);
  if (int t = flag_int(argc, argv, "--threads", 0); t > 0) set_num_threads(t);

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
    std::printf("epoch %d: train loss %.4f, test top-1 %.2f%%, %.0f img/s\n", epoch + 1,
                loss_sum / steps_per_epoch, 100 * accuracy, (epoch + 1) * steps_per_epoch * batch / seconds);
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "fashion_mnist_mlp: error: %s\n", e.what());
  return 1;
}
