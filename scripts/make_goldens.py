#!/usr/bin/env python3
"""Writes the PyTorch golden dumps the C++ tests compare against (tests/golden/*.json).

Run with Debian's interpreter after `apt-get install python3-torch`:
    /usr/bin/python3 scripts/make_goldens.py [OUT_DIR]
Each file maps a tensor name to {"shape": [...], "data": [...]} (float64 values, row-major), plus
"meta" with the scalar settings. Everything is computed in float64 so the C++ f64 results must match
to ~1e-12; the f32 tests use looser tolerances.
"""
import json
import os
import sys

import torch
import torch.nn.functional as F

torch.set_default_dtype(torch.float64)


def dump(t):
    t = t.detach().to(torch.float64).contiguous()
    return {"shape": list(t.shape), "data": [float(v) for v in t.reshape(-1).tolist()]}


def write(out_dir, name, tensors, meta=None):
    payload = {k: dump(v) for k, v in tensors.items()}
    payload["meta"] = dict(meta or {}, torch_version=torch.__version__)
    path = os.path.join(out_dir, name + ".json")
    with open(path, "w") as f:
        json.dump(payload, f, indent=None, separators=(",", ":"))
        f.write("\n")
    print("wrote", path)


def matmul_golden(out_dir):
    g = torch.Generator().manual_seed(1)
    a = torch.randn(5, 7, generator=g, requires_grad=True)
    b = torch.randn(7, 3, generator=g, requires_grad=True)
    upstream = torch.randn(5, 3, generator=g)
    c = a @ b
    c.backward(upstream)
    # Batched: (2, 4, 3) x (2, 3, 5)
    ba = torch.randn(2, 4, 3, generator=g, requires_grad=True)
    bb = torch.randn(2, 3, 5, generator=g, requires_grad=True)
    bc = torch.bmm(ba, bb)
    bc.sum().backward()
    write(out_dir, "matmul", {"a": a, "b": b, "upstream": upstream, "c": c, "grad_a": a.grad, "grad_b": b.grad,
                              "batched_a": ba, "batched_b": bb, "batched_c": bc,
                              "batched_grad_a": ba.grad, "batched_grad_b": bb.grad})


def cross_entropy_golden(out_dir):
    g = torch.Generator().manual_seed(2)
    smoothing = 0.1
    logits = (torch.randn(6, 5, generator=g) * 3).requires_grad_(True)
    labels = torch.tensor([0, 4, 2, 2, 1, 3])
    loss = F.cross_entropy(logits, labels, label_smoothing=smoothing)
    loss.backward()
    plain_logits = logits.detach().clone().requires_grad_(True)
    plain = F.cross_entropy(plain_logits, labels)
    plain.backward()
    write(out_dir, "cross_entropy", {"logits": logits, "labels": labels.to(torch.float64), "loss": loss,
                                     "grad_logits": logits.grad, "loss_no_smoothing": plain,
                                     "grad_logits_no_smoothing": plain_logits.grad},
          {"label_smoothing": smoothing})


def composed_golden(out_dir):
    # A small network-like expression touching broadcasting, reductions and the softmax family.
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 6, generator=g, requires_grad=True)
    w = torch.randn(5, 6, generator=g, requires_grad=True)
    b = torch.randn(5, generator=g, requires_grad=True)
    h = torch.relu(F.linear(x, w, b))
    z = torch.tanh(h) * torch.exp(-h / 2) + torch.sigmoid(h - h.mean(dim=1, keepdim=True))
    loss = (F.softmax(z, dim=1) * z).sum() / 4 + torch.sqrt(h * h + 1).max(dim=0).values.sum() \
        - F.log_softmax(z, dim=1).mean()
    loss.backward()
    write(out_dir, "composed", {"x": x, "w": w, "b": b, "loss": loss, "grad_x": x.grad, "grad_w": w.grad,
                                "grad_b": b.grad})


def optimizer_golden(out_dir):
    # Parameters after each of 5 steps on a fixed quadratic, for SGD (momentum, Nesterov, weight decay)
    # and AdamW; a matrix and a bias so DecayPolicy.ExceptBiasAndNorm can be checked too.
    g = torch.Generator().manual_seed(4)
    x = torch.randn(6, 3, generator=g)
    y = torch.randn(6, 2, generator=g)
    w0 = torch.randn(2, 3, generator=g)
    b0 = torch.randn(2, generator=g)
    tensors = {"x": x, "y": y, "w0": w0, "b0": b0}
    configs = {
        "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
        "sgd_plain": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.0),
        "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.01, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1),
        "sgd_nodecay_bias": lambda ps: torch.optim.SGD([{"params": [ps[0]], "weight_decay": 0.05},
                                                        {"params": [ps[1]], "weight_decay": 0.0}],
                                                       lr=0.1, momentum=0.9),
    }
    for name, make in configs.items():
        w = w0.clone().requires_grad_(True)
        b = b0.clone().requires_grad_(True)
        opt = make([w, b])
        ws, bs = [], []
        for _ in range(5):
            opt.zero_grad()
            loss = ((x @ w.t() + b - y) ** 2).sum()
            loss.backward()
            opt.step()
            ws.append(w.detach().clone())
            bs.append(b.detach().clone())
        tensors[name + "_w"] = torch.stack(ws)
        tensors[name + "_b"] = torch.stack(bs)
    write(out_dir, "optimizer", tensors)


def conv_golden(out_dir):
    # Tensors are dumped in ringtrain's layouts: activations NHWC, filters KRSC (out, kh, kw, in).
    g = torch.Generator().manual_seed(5)
    cases = {
        "plain": dict(stride=1, padding=1, dilation=1, groups=1, cin=4, cout=6, k=3, hw=(6, 5)),
        "strided": dict(stride=2, padding=0, dilation=1, groups=1, cin=3, cout=5, k=1, hw=(7, 7)),
        "dilated_grouped": dict(stride=1, padding=2, dilation=2, groups=2, cin=4, cout=6, k=3, hw=(6, 6)),
    }
    tensors = {}
    for name, c in cases.items():
        x = torch.randn(2, c["cin"], *c["hw"], generator=g, requires_grad=True)
        w = torch.randn(c["cout"], c["cin"] // c["groups"], c["k"], c["k"], generator=g, requires_grad=True)
        b = torch.randn(c["cout"], generator=g, requires_grad=True)
        y = F.conv2d(x, w, b, stride=c["stride"], padding=c["padding"], dilation=c["dilation"], groups=c["groups"])
        upstream = torch.randn(*y.shape, generator=g)
        y.backward(upstream)
        nhwc = lambda t: t.permute(0, 2, 3, 1)
        tensors.update({name + "_x": nhwc(x), name + "_w": nhwc(w), name + "_b": b, name + "_y": nhwc(y),
                        name + "_upstream": nhwc(upstream), name + "_grad_x": nhwc(x.grad),
                        name + "_grad_w": nhwc(w.grad), name + "_grad_b": b.grad})
    write(out_dir, "conv", tensors)


def norm_pool_golden(out_dir):
    # NHWC dumps. Batch norm in training (output, gradients, updated running statistics) and in eval;
    # max pooling 3x3/2 pad 1 (ResNet's stem) and 2x2/2; average pooling 3x3/2 pad 1.
    g = torch.Generator().manual_seed(6)
    nhwc = lambda t: t.permute(0, 2, 3, 1)
    x = (torch.randn(3, 4, 5, 5, generator=g) * 2 + 1).requires_grad_(True)
    bn = torch.nn.BatchNorm2d(4, momentum=0.1, eps=1e-5).double()
    with torch.no_grad():
        bn.weight.copy_(torch.randn(4, generator=g))
        bn.bias.copy_(torch.randn(4, generator=g))
        bn.running_mean.copy_(torch.randn(4, generator=g))
        bn.running_var.copy_(torch.rand(4, generator=g) + 0.5)
    tensors = {"bn_x": nhwc(x), "bn_weight": bn.weight, "bn_bias": bn.bias,
               "bn_running_mean_before": bn.running_mean.clone(), "bn_running_var_before": bn.running_var.clone()}
    y = bn(x)
    up = torch.randn(*y.shape, generator=g)
    y.backward(up)
    # Clones: the eval pass below accumulates into the same .grad tensors.
    tensors.update({"bn_y": nhwc(y), "bn_upstream": nhwc(up), "bn_grad_x": nhwc(x.grad).clone(),
                    "bn_grad_weight": bn.weight.grad.clone(), "bn_grad_bias": bn.bias.grad.clone(),
                    "bn_running_mean_after": bn.running_mean.clone(), "bn_running_var_after": bn.running_var.clone()})
    bn.eval()
    x.grad = None
    bn.weight.grad = None
    bn.bias.grad = None
    ye = torch.relu(bn(x))
    ye.backward(up)
    tensors.update({"bn_eval_relu_y": nhwc(ye), "bn_eval_relu_grad_x": nhwc(x.grad),
                    "bn_eval_relu_grad_weight": bn.weight.grad})
    px = torch.randn(2, 3, 7, 6, generator=g, requires_grad=True)
    for name, fn in {"maxpool3s2p1": lambda t: F.max_pool2d(t, 3, 2, 1),
                     "maxpool2s2": lambda t: F.max_pool2d(t, 2, 2),
                     "avgpool3s2p1": lambda t: F.avg_pool2d(t, 3, 2, 1)}.items():
        px.grad = None
        out = fn(px)
        pup = torch.randn(*out.shape, generator=g)
        out.backward(pup)
        tensors.update({name + "_y": nhwc(out), name + "_upstream": nhwc(pup), name + "_grad_x": nhwc(px.grad)})
    tensors["pool_x"] = nhwc(px)
    write(out_dir, "norm_pool", tensors, {"momentum": 0.1, "eps": 1e-5})


class CifarBlock(torch.nn.Module):
    def __init__(self, i, o, stride):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(i, o, 3, stride, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(o)
        self.conv2 = torch.nn.Conv2d(o, o, 3, 1, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(o)
        self.downsample = None
        if stride != 1 or i != o:
            self.downsample = torch.nn.Sequential(torch.nn.Conv2d(i, o, 1, stride, bias=False), torch.nn.BatchNorm2d(o))

    def forward(self, x):
        out = self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x)))))
        return torch.relu(out + (x if self.downsample is None else self.downsample(x)))


class CifarResNet(torch.nn.Module):
    """ringtrain's CIFAR ResNet with the same parameter names (He et al. 2016, projection shortcuts)."""
    def __init__(self, depth, in_channels=3, num_classes=10):
        super().__init__()
        n = (depth - 2) // 6
        self.conv1 = torch.nn.Conv2d(in_channels, 16, 3, 1, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(16)
        i = 16
        for stage, o in enumerate([16, 32, 64]):
            blocks = []
            for b in range(n):
                blocks.append(CifarBlock(i, o, 2 if (stage > 0 and b == 0) else 1))
                i = o
            setattr(self, "layer%d" % (stage + 1), torch.nn.Sequential(*blocks))
        self.fc = torch.nn.Linear(64, num_classes)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def to_ringtrain_layout(name, t):
    return t.permute(0, 2, 3, 1) if t.dim() == 4 else t


def deterministic_state(model):
    """Fills every parameter and buffer from a formula of (entry index, flat index in ringtrain's
    layout), which the C++ test reproduces, so no weights need to be stored."""
    state = model.state_dict()
    for e, (name, t) in enumerate(state.items()):
        if name.endswith("num_batches_tracked"):
            continue
        shape = list(t.shape)
        rt_shape = [shape[0], shape[2], shape[3], shape[1]] if t.dim() == 4 else shape
        n = 1
        for d in rt_shape:
            n *= d
        i = torch.arange(n, dtype=torch.float64)
        wave = torch.sin(0.1 * i + 0.7 * e)
        if name.endswith("running_var"):
            v = 1.0 + 0.5 * wave.abs()
        elif name.endswith("running_mean") or name.endswith("bias"):
            v = 0.1 * wave
        elif t.dim() == 1:  # batch-norm weight
            v = 1.0 + 0.2 * wave
        else:
            fan_in = n // shape[0]
            v = wave * (2.0 / fan_in) ** 0.5
        v = v.reshape(rt_shape)
        if t.dim() == 4:
            v = v.permute(0, 3, 1, 2)
        state[name] = v.to(t.dtype)
    model.load_state_dict(state)


def resnet_golden(out_dir):
    import torchvision
    tensors = {}
    for arch, make, hw, classes in [("resnet20", lambda: CifarResNet(20), 16, 10),
                                    ("resnet18", lambda: torchvision.models.resnet18(num_classes=7), 64, 7)]:
        model = make().double()
        deterministic_state(model)
        n = 2
        i = torch.arange(n * hw * hw * 3, dtype=torch.float64)
        x_nhwc = torch.sin(0.05 * i).reshape(n, hw, hw, 3)
        x = x_nhwc.permute(0, 3, 1, 2).contiguous()
        labels = torch.tensor([1, classes - 1])
        model.train()
        logits = model(x)
        loss = F.cross_entropy(logits, labels, label_smoothing=0.1)
        loss.backward()
        params = dict(model.named_parameters())
        tensors.update({arch + "_logits": logits, arch + "_loss": loss})
        for name in ["conv1.weight", "layer1.0.bn1.weight", "layer2.0.downsample.0.weight", "fc.weight", "fc.bias"]:
            tensors[arch + "_grad_" + name] = to_ringtrain_layout(name, params[name].grad)
        tensors[arch + "_running_mean_bn1"] = model.bn1.running_mean.clone()
        model.eval()
        with torch.no_grad():
            tensors[arch + "_eval_logits"] = model(x)
    write(out_dir, "resnet", tensors)


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests", "golden")
    os.makedirs(out_dir, exist_ok=True)
    matmul_golden(out_dir)
    cross_entropy_golden(out_dir)
    composed_golden(out_dir)
    optimizer_golden(out_dir)
    conv_golden(out_dir)
    norm_pool_golden(out_dir)
    resnet_golden(out_dir)


if __name__ == "__main__":
    main()
