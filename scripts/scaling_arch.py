#!/usr/bin/python3
"""Writes docs/scaling/arch.json: each network's gradient tensors in backward order, for scaling_model.py.

    /usr/bin/python3 scripts/scaling_arch.py [--out docs/scaling/arch.json]

Needs PyTorch and torchvision (Debian's python3-torch and python3-torchvision; not needed by anything that reads
the file). For every network it builds torchvision's model with random weights (ResNeXt-101 32x4d and SE-ResNeXt-101
32x4d, which torchvision lacks by name, from its ResNet class), runs one forward pass of one image (224x224,
Inception V3 299x299) with hooks on every module that owns parameters, and records per gradient tensor, in the
order backward produces them (the reverse of the forward's order of first use):

    numel        elements of the tensor
    ready_flops  the share of the backward's FLOPs done when this gradient is ready: the backward of its layer
                 and of every layer after it in the forward. A layer's backward is taken as twice its forward
                 multiply-adds (input and weight gradients), convolutions and linear layers only.
    ready_bytes  the same share counted in gradient bytes instead of FLOPs (what the model assumed before)

ResNet-18/34/50/101/152 are also the library's own ResNets (models/resnet.cpp builds torchvision's layers and
parameter order). Inception V3 is built without its auxiliary classifier, as TensorFlow's benchmark trains it
(tf_cnn_benchmarks' inception3 has no auxiliary head).
"""
import argparse
import json
import os
import sys

ARCHS = {  # name: (torchvision constructor, keyword arguments, input side)
    "resnet18": ("resnet18", {}, 224),
    "resnet34": ("resnet34", {}, 224),
    "resnet50": ("resnet50", {}, 224),
    "resnet101": ("resnet101", {}, 224),
    "resnet152": ("resnet152", {}, 224),
    "resnext50_32x4d": ("resnext50_32x4d", {}, 224),
    "resnext101_32x8d": ("resnext101_32x8d", {}, 224),
    # NVIDIA DeepLearningExamples' ResNeXt-101 32x4d and SE-ResNeXt-101 32x4d (torchvision has neither by name)
    "resnext101_32x4d": ("ResNet", {"block": "Bottleneck", "layers": [3, 4, 23, 3], "groups": 32,
                                    "width_per_group": 4}, 224),
    "se_resnext101_32x4d": ("ResNet", {"block": "SEBottleneck", "layers": [3, 4, 23, 3], "groups": 32,
                                       "width_per_group": 4}, 224),
    "vgg16": ("vgg16", {}, 224),
    "alexnet": ("alexnet", {}, 224),
    "inception_v3": ("inception_v3", {"aux_logits": False, "init_weights": False}, 299),
}


def se_bottleneck(torch, models):
    """torchvision's Bottleneck with squeeze-and-excitation (Hu et al. 2018: reduction 16, two 1x1 layers with
    bias) on the residual branch before the sum, as SE-ResNeXt has it: the SE follows bn3, so torchvision's own
    forward runs it."""

    class SqueezeExcite(torch.nn.Module):
        def __init__(self, c):
            super().__init__()
            self.reduce = torch.nn.Conv2d(c, c // 16, 1)
            self.expand = torch.nn.Conv2d(c // 16, c, 1)

        def forward(self, x):
            return x * torch.sigmoid(self.expand(torch.relu(self.reduce(x.mean((2, 3), keepdim=True)))))

    class SEBottleneck(models.resnet.Bottleneck):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.bn3 = torch.nn.Sequential(self.bn3, SqueezeExcite(self.conv3.out_channels))

    return SEBottleneck


def describe(torch, models, ctor, kwargs, side):
    blocks = {"Bottleneck": lambda: models.resnet.Bottleneck, "SEBottleneck": lambda: se_bottleneck(torch, models)}
    built = dict(kwargs, block=blocks[kwargs["block"]]()) if "block" in kwargs else kwargs
    net = getattr(models, ctor)(**built).eval()
    order, macs = [], {}

    def hook(module, inputs, output):
        if module not in macs:
            order.append(module)
            macs[module] = 0
        if isinstance(module, torch.nn.Conv2d):
            k = module.kernel_size[0] * module.kernel_size[1] * module.in_channels // module.groups
            macs[module] += output.numel() * k
        elif isinstance(module, torch.nn.Linear):
            macs[module] += output.numel() * module.in_features

    handles = [m.register_forward_hook(hook) for m in net.modules()
               if any(True for _ in m.parameters(recurse=False))]
    with torch.no_grad():
        net(torch.zeros(1, 3, side, side))
    for h in handles:
        h.remove()
    owned = [p for m in net.modules() for p in m.parameters(recurse=False)]
    used = [p for m in order for p in m.parameters(recurse=False)]
    if len(used) != len(owned):
        raise SystemExit(f"{ctor}: {len(owned) - len(used)} parameters not used by the forward pass")
    total_flops = sum(macs.values()) or 1
    total_bytes = sum(p.numel() for p in used)
    tensors, flops_done, numel_done = [], 0, 0
    for m in reversed(order):  # backward: the last layer of the forward first
        flops_done += macs[m]
        params = list(m.parameters(recurse=False))
        for p in reversed(params):
            numel_done += p.numel()
            tensors.append({"numel": p.numel(), "ready_flops": round(flops_done / total_flops, 6),
                            "ready_bytes": round(numel_done / total_bytes, 6)})
    return {"source": f"torchvision.models.{ctor}({', '.join(f'{k}={v}' for k, v in kwargs.items())})",
            "input": side, "params": total_bytes, "gflops_forward": round(2 * total_flops / 1e9, 3),
            "tensors": tensors}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs",
                                                 "scaling", "arch.json"))
    args = p.parse_args()
    try:
        import torch
        import torchvision
        from torchvision import models
    except ImportError as e:
        print(f"scaling_arch.py: error: needs PyTorch and torchvision ({e})", file=sys.stderr)
        return 1
    doc = {"comment": "written by scripts/scaling_arch.py (torchvision " + torchvision.__version__ + "); "
                      "tensors in backward order", "archs": {}}
    for name, (ctor, kwargs, side) in ARCHS.items():
        doc["archs"][name] = describe(torch, models, ctor, kwargs, side)
        a = doc["archs"][name]
        print(f"{name}: {len(a['tensors'])} tensors, {a['params'] / 1e6:.2f} M parameters, "
              f"{a['gflops_forward']} GFLOPs forward")
    with open(args.out, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
