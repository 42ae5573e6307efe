#!/usr/bin/env python3
"""Converts between ringtrain HDF5 checkpoints and PyTorch state dicts.

ringtrain keeps activations NHWC and convolution filters KRSC (out, kh, kw, in); PyTorch keeps OIHW.
4-D tensors are permuted at conversion time, everything else is copied as is.

  torch_interop.py to-torch CKPT.h5 OUT.pth        ringtrain checkpoint -> torch.save(state_dict)
  torch_interop.py from-torch IN.pth OUT.h5        state_dict (or a whole model) -> ringtrain checkpoint
  torch_interop.py export-golden OUT_DIR           torchvision ResNet-18, a CIFAR ResNet-20, MobileNetV2,
                                                   EfficientNet-B0, ConvNeXt-Tiny and the UNet, PyTorch-
                                                   initialised, as checkpoints plus the logits and
                                                   gradients PyTorch computes on a fixed input (the C++
                                                   interop test compares against them)
  torch_interop.py check-back-into-torch DIR       the checkpoints ringtrain trained from those (in
                                                   DIR/trained) give ringtrain's logits in PyTorch
Run with Debian's interpreter (python3-torch, python3-torchvision, python3-h5py).
"""
import json
import os
import sys

import h5py
import numpy as np
import torch
import torch.nn.functional as F

FORMAT = "ringtrain-checkpoint"


def to_ringtrain(t):
    t = t.detach().cpu()
    return t.permute(0, 2, 3, 1).contiguous() if t.dim() == 4 else t


def to_torch(a):
    t = torch.from_numpy(np.ascontiguousarray(a))
    return t.permute(0, 3, 1, 2).contiguous() if t.dim() == 4 else t


def write_checkpoint(path, state, meta=None):
    tmp = os.path.join(os.path.dirname(os.path.abspath(path)), "." + os.path.basename(path) + ".tmp")
    with h5py.File(tmp, "w") as f:
        f.attrs["format"] = np.bytes_(FORMAT)
        f.attrs["format_version"] = np.int32(1)
        f.attrs["layout"] = np.bytes_("NHWC activations, KRSC filters")
        model = f.create_group("model")
        for name, t in state.items():
            t = to_ringtrain(t)
            if t.dtype == torch.bfloat16:
                d = model.create_dataset(name, data=t.view(torch.int16).numpy().view(np.uint16))
                d.attrs["dtype"] = np.bytes_("bf16")
            elif t.dtype == torch.float16:
                d = model.create_dataset(name, data=t.numpy().view(np.uint16))
                d.attrs["dtype"] = np.bytes_("f16")
            else:
                model.create_dataset(name, data=t.numpy())
        f.create_group("optimizer")
        f.create_group("meta").create_dataset("json", data=np.bytes_(json.dumps(meta or {})))
    os.replace(tmp, path)


def read_checkpoint(path):
    state = {}
    with h5py.File(path, "r") as f:
        fmt = f.attrs.get("format", b"")
        fmt = fmt.decode() if isinstance(fmt, bytes) else str(fmt)
        if fmt != FORMAT:
            raise SystemExit(f"{path}: not a ringtrain checkpoint (format '{fmt}')")
        for name, d in f["model"].items():
            a = d[()]
            dtype = d.attrs.get("dtype", b"")
            dtype = dtype.decode() if isinstance(dtype, bytes) else str(dtype)
            if dtype == "bf16":
                t = torch.from_numpy((a.astype(np.uint32) << 16).view(np.float32).copy())
            elif dtype == "f16":
                t = torch.from_numpy(a.view(np.float16).copy())
            else:
                t = torch.from_numpy(np.asarray(a))
            state[name] = to_torch(t.numpy()) if t.dim() == 4 else t
    return state


def export_golden(out_dir):
    import torchvision
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from make_goldens import CifarResNet
    torch.set_default_dtype(torch.float32)  # make_goldens switches the default to float64 on import

    os.makedirs(out_dir, exist_ok=True)
    # 64x64 for ResNet-18 keeps 2x2 positions per channel in layer4: train-mode batch norm over
    # 4 images x 1x1 would amplify float rounding into visible differences.
    for arch, make, hw, classes in [("resnet18", lambda: torchvision.models.resnet18(num_classes=10), 64, 10),
                                    ("resnet20", lambda: CifarResNet(20), 32, 10)]:
        torch.manual_seed(0)
        model = make()  # PyTorch's own initialisation
        write_checkpoint(os.path.join(out_dir, arch + ".h5"), model.state_dict(), {"arch": arch})
        # Computed in float64 and rounded once, as the C++ test does, so both inputs are bit-identical.
        x_nhwc = torch.sin(0.05 * torch.arange(4 * hw * hw * 3, dtype=torch.float64)).float().reshape(4, hw, hw, 3)
        labels = torch.tensor([0, 3, 5, 9])
        model.train()
        logits = model(x_nhwc.permute(0, 3, 1, 2))
        loss = F.cross_entropy(logits, labels)
        loss.backward()
        expected = {"logits": logits.detach().reshape(-1).tolist(), "loss": loss.item(),
                    "grad_fc_weight": model.fc.weight.grad.reshape(-1).tolist(),
                    "grad_conv1_weight": to_ringtrain(model.conv1.weight.grad).reshape(-1).tolist()}
        with open(os.path.join(out_dir, arch + "_expected.json"), "w") as f:
            json.dump(expected, f)
        print("wrote", os.path.join(out_dir, arch + ".h5"))


# The new families (layers/models/): torchvision's with PyTorch's own random init, dropout and stochastic depth off
# (a training step is then a function of the weights); 64x64 for the classifiers that end at stride 32 (train-mode
# batch norm over 4 images x 2x2 positions), 32x32 for ConvNeXt (LayerNorm) and the UNet.
def family_models():
    import torchvision
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from make_goldens import UNet, no_randomness
    torch.set_default_dtype(torch.float32)  # make_goldens switches the default to float64 on import
    return [("mobilenet_v2", lambda: no_randomness(torchvision.models.mobilenet_v2(num_classes=10)), 64, 10, False),
            ("efficientnet_b0", lambda: no_randomness(torchvision.models.efficientnet_b0(num_classes=10)), 64, 10, False),
            ("convnext_tiny", lambda: no_randomness(torchvision.models.convnext_tiny(num_classes=10)), 32, 10, False),
            ("unet", lambda: UNet(3, 4), 32, 4, True)]


# The parameters whose gradients the C++ test compares: the first layer (the whole backward runs through it), a
# normalisation or squeeze-and-excitation parameter in the middle, the last layer.
WATCHED = {"mobilenet_v2": ["features.0.0.weight", "features.7.conv.1.1.weight", "features.18.1.bias",
                            "classifier.1.weight"],
           "efficientnet_b0": ["features.0.0.weight", "features.4.1.block.2.fc2.weight", "features.8.1.weight",
                               "classifier.1.weight"],
           "convnext_tiny": ["features.0.0.weight", "features.5.4.layer_scale", "features.5.4.block.2.weight",
                             "features.6.1.bias", "classifier.2.weight"],
           "unet": ["inc.double_conv.0.weight", "down2.maxpool_conv.1.double_conv.4.weight", "up1.up.weight",
                    "up3.conv.double_conv.3.weight", "outc.conv.bias"]}


def family_input(hw):
    # Computed in float64 and rounded once, as the C++ test does, so both inputs are bit-identical.
    return torch.sin(0.05 * torch.arange(4 * hw * hw * 3, dtype=torch.float64)).float().reshape(4, hw, hw, 3)


def family_labels(hw, classes, segmentation):
    if not segmentation:
        return torch.tensor([0, 3, 5, 9])
    labels = (torch.arange(4 * hw * hw) * 7 % classes).reshape(4, hw, hw)
    labels[1, 2, 3] = 255
    return labels


def family_loss(logits, labels, segmentation):
    return F.cross_entropy(logits, labels, ignore_index=255) if segmentation else F.cross_entropy(logits, labels)


def family_pass(model, x, labels, segmentation, arch, mode):
    """One training- or eval-mode pass: logits (NHWC for the UNet), loss and the watched gradients."""
    model.zero_grad()
    model.train(mode == "train")
    logits = model(x)
    loss = family_loss(logits, labels, segmentation)
    loss.backward()
    if segmentation:
        logits = logits.permute(0, 2, 3, 1)
    params = dict(model.named_parameters())
    return logits.detach(), loss.item(), {n: to_ringtrain(params[n].grad) for n in WATCHED[arch]}


def export_families(out_dir):
    """The new families as checkpoints plus what PyTorch computes on a fixed input: training-mode logits, loss and
    the watched parameters' gradients, then the same in eval mode, which reads the running statistics the training
    pass moved (the C++ interop test does the same and compares). Beside each figure: how far PyTorch's own f32
    result lies from its f64 result on the same weights (largest difference over the largest magnitude), the
    float rounding a model's training pass amplifies (MobileNetV2's ReLU6 saturates at init: its first layer's
    gradient moves by percents), which no f32 implementation can be held below."""
    import copy
    for arch, make, hw, classes, segmentation in family_models():
        torch.manual_seed(0)
        model = make()
        exact = copy.deepcopy(model).double()
        write_checkpoint(os.path.join(out_dir, arch + ".h5"), model.state_dict(), {"arch": arch})
        x = family_input(hw).permute(0, 3, 1, 2)
        labels = family_labels(hw, classes, segmentation)
        expected = {}
        noise = lambda a, b: float((a.double() - b).abs().max() / b.abs().max().clamp_min(1e-30))
        for mode in ["train", "eval"]:
            logits, loss, grads = family_pass(model, x, labels, segmentation, arch, mode)
            logits64, _, grads64 = family_pass(exact, x.double(), labels, segmentation, arch, mode)
            expected[mode] = {"logits": logits.reshape(-1).tolist(), "loss": loss,
                              "grads": {n: g.reshape(-1).tolist() for n, g in grads.items()},
                              "noise": {"logits": noise(logits, logits64),
                                        "grads": {n: noise(grads[n], grads64[n]) for n in grads}}}
        with open(os.path.join(out_dir, arch + "_expected.json"), "w") as f:
            json.dump(expected, f)
        print("wrote", os.path.join(out_dir, arch + ".h5"))


def check_back_into_torch(out_dir):
    """The checkpoints ringtrain trained from those exports (tests/layers/interop_roundtrip.cpp) load into the
    torchvision models, whose eval-mode logits on the fixed input are the ones ringtrain computed."""
    torch.set_default_dtype(torch.float32)
    worst = 0.0
    for arch, make, hw, classes, segmentation in family_models():
        path = os.path.join(out_dir, "trained", arch + ".h5")
        model = make()
        model.load_state_dict(read_checkpoint(path))
        model.eval()
        with torch.no_grad():
            logits = model(family_input(hw).permute(0, 3, 1, 2))
        if segmentation:
            logits = logits.permute(0, 2, 3, 1)
        with open(os.path.join(out_dir, "trained", arch + "_logits.json")) as f:
            theirs = torch.tensor(json.load(f), dtype=torch.float32)
        mine = logits.reshape(-1)
        error = float((mine - theirs).abs().max() / mine.abs().max())
        worst = max(worst, error)
        print("%s: ringtrain's trained checkpoint in PyTorch: logits within %.2e of the largest" % (arch, error))
        if not error < 1e-4:
            raise SystemExit("%s: PyTorch's logits differ from ringtrain's by %.3e relative" % (arch, error))
    print("back into torch: every trained checkpoint gives ringtrain's logits (worst %.2e)" % worst)


def main(argv):
    if len(argv) == 4 and argv[1] == "to-torch":
        torch.save(read_checkpoint(argv[2]), argv[3])
    elif len(argv) == 4 and argv[1] == "from-torch":
        obj = torch.load(argv[2], map_location="cpu")
        state = obj.state_dict() if hasattr(obj, "state_dict") else obj
        write_checkpoint(argv[3], state)
    elif len(argv) == 3 and argv[1] == "export-golden":
        export_golden(argv[2])
        export_families(argv[2])
    elif len(argv) == 3 and argv[1] == "check-back-into-torch":
        check_back_into_torch(argv[2])
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
