// layers/models/zoo.h: every model the library builds by name, what train_resnet's -a (and any app taking an
// architecture) chooses from: the ResNets (layers/models/resnet.h), mobilenet_v2, efficientnet_b0 .. b7,
// convnext_tiny / small / base / large, and unet / unet_gn (segmentation: per-pixel logits).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "layers/module.h"

namespace ringtrain {

struct ModelOptions {
  int64_t in_channels = 3;
  int64_t num_classes = 1000;
  DType dtype = DType::F32;  // parameter dtype (F64 for gradient checks)
};

struct ModelInfo {
  std::string name;
  bool segmentation = false;     // per-pixel logits (N, H, W, classes) against (N, H, W) label maps
  int64_t min_side = 1;          // the smallest input side it takes (and H, W must be multiples of it for UNets)
  int64_t default_side = 224;    // its synthetic inputs' side when --image-size says nothing
  bool multiple_of_min = false;  // H and W must be multiples of min_side (UNet)
};

// The architectures in the order --help lists them.
const std::vector<ModelInfo>& model_zoo();
std::vector<std::string> model_names();
// The named architecture's facts; an unknown name is an error listing the valid ones.
const ModelInfo& model_info(const std::string& name);
// Builds it, initialised as torchvision (or, for the UNet, PyTorch) initialises it, from the default generator.
std::shared_ptr<Module> make_model(const std::string& name, const ModelOptions& options);

}  // namespace ringtrain
