#!/usr/bin/env python3
"""Converts between ringtrain HDF5 checkpoints and PyTorch state dicts.

ringtrain keeps activations NHWC and convolution filters KRSC (out, kh, kw, in); PyTorch keeps OIHW.
4-D tensors are permuted at conversion time, everything else is copied as is.

  torch_interop.py to-torch CKPT.h5 OUT.pth        ringtrain checkpoint -> torch.save(state_dict)
  torch_interop.py from-torch IN.pth OUT.h5        state_dict (or a whole model) -> ringtrain checkpoint
  torch_interop.py export-golden OUT_DIR           torchvision ResNet-18 and a CIFAR ResNet-20, PyTorch-
                                                   initialised, as checkpoints plus the logits and
                                                   gradients PyTorch computes on a fixed input (the C++
                                                   interop test compares against them)
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


def main(argv):
    if len(argv) == 4 and argv[1] == "to-torch":
        torch.save(read_checkpoint(argv[2]), argv[3])
    elif len(argv) == 4 and argv[1] == "from-torch":
        obj = torch.load(argv[2], map_location="cpu")
        state = obj.state_dict() if hasattr(obj, "state_dict") else obj
        write_checkpoint(argv[3], state)
    elif len(argv) == 3 and argv[1] == "export-golden":
        export_golden(argv[2])
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
