// interop_roundtrip DIR: the other direction of the interop test. For each family exported by
// scripts/torch_interop.py export-golden into DIR (MobileNetV2, EfficientNet-B0, ConvNeXt-Tiny, the UNet), ringtrain
// loads PyTorch's weights, trains three SGD steps on the fixed batch (dropout and stochastic depth on, batch norm
// statistics moving), and writes the trained checkpoint and its eval-mode logits on the fixed input into DIR/trained;
// `torch_interop.py check-back-into-torch DIR` then loads each checkpoint into the PyTorch model and compares.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/autograd.h"
#include "core/check.h"
#include "core/ops.h"
#include "io/checkpoint.h"
#include "layers/models/zoo.h"
#include "optim/optimizer.h"

using namespace ringtrain;
namespace fs = std::filesystem;

int main(int argc, char** argv) try {
  RT_CHECK(argc == 2, "usage: interop_roundtrip DIR (torch_interop.py export-golden's folder)");
  const fs::path dir(argv[1]);
  fs::create_directories(dir / "trained");
  struct Family {
    std::string arch;
    int64_t hw, classes;
    bool segmentation;
  };
  for (const Family& f : {Family{"mobilenet_v2", 64, 10, false}, Family{"efficientnet_b0", 64, 10, false},
                          Family{"convnext_tiny", 32, 10, false}, Family{"unet", 32, 4, true}}) {
    RT_CHECK(fs::exists(dir / (f.arch + ".h5")), "no export ", (dir / (f.arch + ".h5")).string(),
             ": run scripts/torch_interop.py export-golden first");
    manual_seed(3);
    std::shared_ptr<Module> model = make_model(f.arch, {.in_channels = 3, .num_classes = f.classes});
    model->load_state_dict(load_checkpoint(dir / (f.arch + ".h5")).model);
    std::vector<double> xs(static_cast<size_t>(4 * f.hw * f.hw * 3));
    for (size_t i = 0; i < xs.size(); ++i) xs[i] = std::sin(0.05 * static_cast<double>(i));
    const Tensor x = Tensor::from_vector(xs, Shape{4, f.hw, f.hw, 3});
    std::vector<double> ls;
    if (f.segmentation) {
      for (int64_t i = 0; i < 4 * f.hw * f.hw; ++i) ls.push_back(static_cast<double>((i * 3) % f.classes));
    } else {
      ls = {1, 4, 7, 2};
    }
    const Tensor labels = Tensor::from_vector(ls, f.segmentation ? Shape{4, f.hw, f.hw} : Shape{4}, DType::I64);
    std::vector<NamedParameter> params;
    for (auto& [n, t] : model->named_parameters()) params.push_back({n, t});
    Sgd sgd(params, SgdOptions{.momentum = 0.9});
    model->train();
    for (int step = 0; step < 3; ++step) {
      model->zero_grad();
      cross_entropy((*model)(x), labels).backward();
      sgd.step(0.05);
    }
    model->eval();
    Tensor logits;
    {
      NoGradGuard no_grad;
      logits = (*model)(x);
    }
    save_checkpoint(dir / "trained" / (f.arch + ".h5"), Checkpoint{model->state_dict(), {}, "{}", true});
    std::ofstream(dir / "trained" / (f.arch + "_logits.json")) << nlohmann::json(logits.to_vector()).dump();
    std::printf("%s: trained 3 steps in ringtrain, checkpoint and eval logits written\n", f.arch.c_str());
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "interop_roundtrip: %s\n", e.what());
  return 1;
}
