// layers/models/zoo.cpp: the architectures by name.
#include "layers/models/zoo.h"

#include "core/check.h"
#include "layers/models/convnext.h"
#include "layers/models/efficientnet.h"
#include "layers/models/mobilenet.h"
#include "layers/models/resnet.h"
#include "layers/models/unet.h"

namespace ringtrain {

const std::vector<ModelInfo>& model_zoo() {
  static const std::vector<ModelInfo> zoo = [] {
    std::vector<ModelInfo> z;
    for (const std::string& r : resnet_archs()) {
      const bool cifar = r == "resnet20" || r == "resnet32" || r == "resnet44" || r == "resnet56" || r == "resnet110";
      z.push_back({r, false, 1, cifar ? 32 : 224, false});
    }
    z.push_back({"mobilenet_v2", false, 1, 224, false});
    for (const char* v : {"b0", "b1", "b2", "b3", "b4", "b5", "b6", "b7"})
      z.push_back({std::string("efficientnet_") + v, false, 1, 224, false});
    for (const char* v : {"tiny", "small", "base", "large"})
      z.push_back({std::string("convnext_") + v, false, 32, 224, false});
    z.push_back({"unet", true, 8, 64, true});
    z.push_back({"unet_gn", true, 8, 64, true});
    return z;
  }();
  return zoo;
}

std::vector<std::string> model_names() {
  std::vector<std::string> names;
  for (const ModelInfo& m : model_zoo()) names.push_back(m.name);
  return names;
}

const ModelInfo& model_info(const std::string& name) {
  for (const ModelInfo& m : model_zoo())
    if (m.name == name) return m;
  std::string valid;
  for (const ModelInfo& m : model_zoo()) valid += (valid.empty() ? "" : ", ") + m.name;
  RT_THROW("unknown architecture '", name, "' (expected one of ", valid, ")");
}

std::shared_ptr<Module> make_model(const std::string& name, const ModelOptions& o) {
  const ModelInfo& info = model_info(name);  // the error for an unknown name
  if (name.rfind("resnet", 0) == 0)
    return std::make_shared<ResNet>(
        name, ResNetOptions{.in_channels = o.in_channels, .num_classes = o.num_classes, .dtype = o.dtype});
  if (name == "mobilenet_v2")
    return std::make_shared<MobileNetV2>(
        MobileNetV2Options{.in_channels = o.in_channels, .num_classes = o.num_classes, .dtype = o.dtype});
  if (name.rfind("efficientnet_", 0) == 0)
    return std::make_shared<EfficientNet>(EfficientNetOptions{
        .variant = name.substr(13), .in_channels = o.in_channels, .num_classes = o.num_classes, .dtype = o.dtype});
  if (name.rfind("convnext_", 0) == 0)
    return std::make_shared<ConvNeXt>(ConvNeXtOptions{
        .variant = name.substr(9), .in_channels = o.in_channels, .num_classes = o.num_classes, .dtype = o.dtype});
  RT_CHECK(info.segmentation, "make_model: no builder for '", name, "'");
  return std::make_shared<UNet>(UNetOptions{.in_channels = o.in_channels,
                                            .num_classes = o.num_classes,
                                            .groups = name == "unet_gn" ? 8 : 0,
                                            .dtype = o.dtype});
}

}  // namespace ringtrain
