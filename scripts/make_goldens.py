#!/usr/bin/env python3
"""Writes the PyTorch golden dumps the C++ tests compare against (tests/golden/*.json).

Run with Debian's interpreter after `apt-get install python3-torch`:
    /usr/bin/python3 scripts/make_goldens.py [OUT_DIR] [NAME ...]
cnn_ops (the ops of core/ops_tensor.cpp and core/ops_nn.cpp) was written by PyTorch 2.15:
    /opt/torch2/bin/python scripts/make_goldens.py tests/golden cnn_ops
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


def cnn_ops_golden(out_dir):
    """The pieces of today's CNNs (core/ops.h): each op's output and input gradients for a fixed upstream, on
    odd sizes, one-element dims and values at the activations' corners. Images NHWC, transposed-convolution
    filters (Cin, kh, kw, Cout / groups) as ringtrain keeps them."""
    g = torch.Generator().manual_seed(7)
    nhwc = lambda t: t.permute(0, 2, 3, 1)
    tensors, meta = {}, {}

    def run(name, fn, inputs, layout=None):
        """fn(*inputs) -> output; dumps inputs, output, upstream and each input's gradient."""
        leaves = [t.clone().requires_grad_(t.is_floating_point()) for t in inputs]
        out = fn(*leaves)
        up = torch.randn(tuple(out.shape), generator=g)
        out.backward(up)
        lay = layout or (lambda t: t)
        tensors[name + "_y"] = lay(out)
        tensors[name + "_upstream"] = lay(up)
        for i, (t, leaf) in enumerate(zip(inputs, leaves)):
            tensors["%s_in%d" % (name, i)] = lay(t) if t.dim() == 4 else t
            if leaf.requires_grad and leaf.grad is not None:
                tensors["%s_grad%d" % (name, i)] = lay(leaf.grad) if t.dim() == 4 else leaf.grad

    # Moving elements
    run("cat", lambda a, b, c: torch.cat([a, b, c], dim=1),
        [torch.randn(2, 3, 4, generator=g), torch.randn(2, 1, 4, generator=g), torch.randn(2, 5, 4, generator=g)])
    run("permute", lambda x: x.permute(0, 3, 1, 2).contiguous(), [torch.randn(2, 3, 1, 5, generator=g)])
    run("narrow", lambda x: x.narrow(2, 1, 3), [torch.randn(3, 2, 5, 4, generator=g)])
    run("where", lambda c, a, b: torch.where(c > 0, a, b),
        [torch.randn(3, 1, generator=g), torch.randn(3, 4, generator=g), torch.randn(4, generator=g)])
    # Activations: random values plus each one's corners (0, +-3, 6, and a value far in each tail).
    corners = torch.tensor([0.0, -3.0, 3.0, 6.0, -1.0, 1.0, -8.0, 8.0, 1e-4, -1e-4, 2.5, -2.5])
    ax = torch.cat([torch.randn(3 * 5 * 7 - corners.numel(), generator=g) * 3, corners]).reshape(3, 5, 7)
    acts = {"clamp_both": lambda x: torch.clamp(x, -0.5, 1.5), "clamp_min": lambda x: torch.clamp(x, min=-1.0),
            "clamp_max": lambda x: torch.clamp(x, max=3.0), "hardtanh": lambda x: F.hardtanh(x, -2.0, 2.5),
            "relu6": F.relu6, "leaky_relu": lambda x: F.leaky_relu(x, 0.2), "gelu": F.gelu,
            "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu, "hardswish": F.hardswish,
            "hardsigmoid": F.hardsigmoid}
    for name, fn in acts.items():
        run(name, fn, [ax])
    # Normalisation over channels: NHWC x, ringtrain's LayerNorm over the last dim and GroupNorm over groups of C.
    lx = torch.randn(2, 3, 5, 7, generator=g) * 2 + 0.5
    run("layer_norm", lambda x, w, b: F.layer_norm(x, (7,), w, b, 1e-6),
        [lx, torch.randn(7, generator=g), torch.randn(7, generator=g)])
    run("layer_norm_plain", lambda x: F.layer_norm(x, (7,), None, None, 1e-5), [lx])
    gx = torch.randn(2, 6, 3, 5, generator=g) * 1.5 - 0.3  # NCHW for torch
    for groups in [1, 3, 6]:
        run("group_norm%d" % groups, lambda x, w, b: F.group_norm(x, groups, w, b, 1e-5),
            [gx, torch.randn(6, generator=g), torch.randn(6, generator=g)], layout=nhwc)
    run("group_norm_plain", lambda x: F.group_norm(x, 2, None, None, 1e-5), [gx], layout=nhwc)
    # Resizing
    px = torch.randn(2, 3, 7, 5, generator=g)
    for name, size in {"adaptive3x2": (3, 2), "adaptive1x1": (1, 1), "adaptive9x7": (9, 7)}.items():
        run(name, lambda x: F.adaptive_avg_pool2d(x, size), [px], layout=nhwc)
    ux = torch.randn(2, 3, 5, 3, generator=g)
    ups = {"up_nearest_size": lambda x: F.interpolate(x, size=(11, 7), mode="nearest"),
           "up_nearest_scale2": lambda x: F.interpolate(x, scale_factor=2, mode="nearest"),
           "up_nearest_exact": lambda x: F.interpolate(x, size=(8, 5), mode="nearest-exact"),
           "up_bilinear": lambda x: F.interpolate(x, size=(9, 7), mode="bilinear", align_corners=False),
           "up_bilinear_corners": lambda x: F.interpolate(x, size=(9, 7), mode="bilinear", align_corners=True),
           "up_bilinear_scale": lambda x: F.interpolate(x, scale_factor=1.7, mode="bilinear", align_corners=False),
           "up_bilinear_down": lambda x: F.interpolate(x, size=(3, 2), mode="bilinear", align_corners=False)}
    for name, fn in ups.items():
        run(name, fn, [ux], layout=nhwc)
    # Transposed convolution (torch's weight (Cin, Cout / groups, kh, kw))
    tcases = {"tconv_s2_op1": dict(stride=2, padding=1, output_padding=1, groups=1, dilation=1, cin=4, cout=3, k=3,
                                   hw=(4, 3)),
              "tconv_grouped_dilated": dict(stride=1, padding=2, output_padding=0, groups=2, dilation=2, cin=4,
                                            cout=6, k=3, hw=(5, 4)),
              "tconv_k2s2": dict(stride=2, padding=0, output_padding=0, groups=1, dilation=1, cin=3, cout=2, k=2,
                                 hw=(3, 3))}
    for name, c in tcases.items():
        x = torch.randn(2, c["cin"], *c["hw"], generator=g)
        w = torch.randn(c["cin"], c["cout"] // c["groups"], c["k"], c["k"], generator=g)
        b = torch.randn(c["cout"], generator=g)
        run(name, lambda x, w, b, c=c: F.conv_transpose2d(x, w, b, stride=c["stride"], padding=c["padding"],
                                                           output_padding=c["output_padding"], groups=c["groups"],
                                                           dilation=c["dilation"]), [x, w, b], layout=nhwc)
        meta.update({name + "_" + k: v for k, v in c.items() if k != "hw"})
    # Per-pixel cross-entropy: logits NHWC (2, 3, 4, 5), labels (2, 3, 4) with ignored pixels, class weights.
    logits = torch.randn(2, 3, 4, 5, generator=g) * 2
    labels = torch.randint(0, 5, (2, 3, 4), generator=g)
    labels[0, 1, 2] = 255
    labels[1, 0, 0] = 255
    weight = torch.rand(5, generator=g) + 0.5
    seg = lambda **kw: (lambda z: F.cross_entropy(z.permute(0, 3, 1, 2), labels, ignore_index=255, **kw))
    for name, fn in {"seg_ce": seg(), "seg_ce_weighted": seg(weight=weight),
                     "seg_ce_weighted_smooth": seg(weight=weight, label_smoothing=0.1)}.items():
        run(name, fn, [logits])
    tensors["seg_labels"] = labels.to(torch.float64)
    tensors["seg_weight"] = weight
    write(out_dir, "cnn_ops", tensors, meta)


class DoubleConv(torch.nn.Module):
    def __init__(self, i, o, groups=0):
        super().__init__()
        norm = (lambda c: torch.nn.GroupNorm(groups, c)) if groups else torch.nn.BatchNorm2d
        self.double_conv = torch.nn.Sequential(
            torch.nn.Conv2d(i, o, 3, padding=1, bias=False), norm(o), torch.nn.ReLU(inplace=True),
            torch.nn.Conv2d(o, o, 3, padding=1, bias=False), norm(o), torch.nn.ReLU(inplace=True))

    def forward(self, x):
        return self.double_conv(x)


class Down(torch.nn.Module):
    def __init__(self, i, o, groups=0):
        super().__init__()
        self.maxpool_conv = torch.nn.Sequential(torch.nn.MaxPool2d(2), DoubleConv(i, o, groups))

    def forward(self, x):
        return self.maxpool_conv(x)


class Up(torch.nn.Module):
    def __init__(self, i, o, groups=0):
        super().__init__()
        self.up = torch.nn.ConvTranspose2d(i, i // 2, kernel_size=2, stride=2)
        self.conv = DoubleConv(i, o, groups)

    def forward(self, x, skip):
        return self.conv(torch.cat([skip, self.up(x)], dim=1))


class OutConv(torch.nn.Module):
    def __init__(self, i, o):
        super().__init__()
        self.conv = torch.nn.Conv2d(i, o, kernel_size=1)

    def forward(self, x):
        return self.conv(x)


class UNet(torch.nn.Module):
    """ringtrain's UNet (layers/models/unet.h) with the same parameter names: the layout of the widely used PyTorch
    port (inc, down1.maxpool_conv.1.double_conv.0, up1.up, up1.conv.double_conv.0, outc.conv)."""
    def __init__(self, in_channels=3, num_classes=2, width=16, depth=3, groups=0):
        super().__init__()
        self.depth = depth
        self.inc = DoubleConv(in_channels, width, groups)
        for level in range(1, depth + 1):
            setattr(self, "down%d" % level, Down(width << (level - 1), width << level, groups))
        for i in range(1, depth + 1):
            level = depth - i + 1
            setattr(self, "up%d" % i, Up(width << level, width << (level - 1), groups))
        self.outc = OutConv(width, num_classes)

    def forward(self, x):
        skips = [self.inc(x)]
        for level in range(1, self.depth + 1):
            skips.append(getattr(self, "down%d" % level)(skips[-1]))
        y = skips[-1]
        for i in range(1, self.depth + 1):
            y = getattr(self, "up%d" % i)(y, skips[-1 - i])
        return self.outc(y)


def no_randomness(model):
    """Dropout and stochastic depth off, so a training step is a function of the weights alone."""
    import torchvision
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
        elif isinstance(m, torchvision.ops.StochasticDepth):
            m.p = 0.0
    return model


def models_golden(out_dir):
    """Today's CNNs in f64 with weights from deterministic_state's formula (the C++ test evaluates it too):
    torchvision's MobileNetV2, EfficientNet-B0 and ConvNeXt-Tiny and the UNet above (batch norm and GroupNorm),
    dropout and stochastic depth off. Training-mode logits and loss, gradients of a few parameters, a batch norm's
    running mean after the step; eval-mode logits."""
    import torchvision
    # 64x64 for the classifiers that end at stride 32: train-mode batch norm over 2 images x 1x1 would amplify
    # float rounding into visible differences (2x2 positions per channel keep it conditioned).
    cases = [("mobilenet_v2", lambda: torchvision.models.mobilenet_v2(num_classes=7), 64, 7, False),
             ("efficientnet_b0", lambda: torchvision.models.efficientnet_b0(num_classes=7), 64, 7, False),
             ("convnext_tiny", lambda: torchvision.models.convnext_tiny(num_classes=7), 32, 7, False),
             ("unet", lambda: UNet(3, 4, width=8, depth=3), 16, 4, True),
             ("unet_gn", lambda: UNet(3, 4, width=8, depth=3, groups=4), 16, 4, True)]
    watched = {"mobilenet_v2": ["features.0.0.weight", "features.5.conv.1.1.weight", "classifier.1.weight"],
               "efficientnet_b0": ["features.0.0.weight", "features.3.1.block.2.fc1.weight", "classifier.1.bias"],
               "convnext_tiny": ["features.0.0.weight", "features.5.4.layer_scale", "features.5.4.block.2.weight",
                                 "classifier.2.weight"],
               "unet": ["inc.double_conv.0.weight", "up2.up.weight", "up3.conv.double_conv.4.bias", "outc.conv.bias"],
               "unet_gn": ["inc.double_conv.0.weight", "down3.maxpool_conv.1.double_conv.1.weight", "up1.up.bias"]}
    running = {"mobilenet_v2": "features.0.1", "efficientnet_b0": "features.2.0.block.1.1", "unet": "inc.double_conv.1"}
    tensors = {}
    for arch, make, hw, classes, segmentation in cases:
        model = no_randomness(make()).double()
        deterministic_state(model)
        n = 2
        i = torch.arange(n * hw * hw * 3, dtype=torch.float64)
        x = torch.sin(0.05 * i).reshape(n, hw, hw, 3).permute(0, 3, 1, 2).contiguous()
        model.train()
        logits = model(x)
        if segmentation:
            labels = (torch.arange(n * hw * hw) * 7 % classes).reshape(n, hw, hw)
            labels[0, 3, 5] = 255
            loss = F.cross_entropy(logits, labels, ignore_index=255)
            logits = logits.permute(0, 2, 3, 1)
        else:
            loss = F.cross_entropy(logits, torch.tensor([1, classes - 1]), label_smoothing=0.1)
        loss.backward()
        params = dict(model.named_parameters())
        tensors.update({arch + "_logits": logits, arch + "_loss": loss})
        for name in watched[arch]:
            tensors[arch + "_grad_" + name] = to_ringtrain_layout(name, params[name].grad)
        if arch in running:
            tensors[arch + "_running_mean"] = dict(model.named_modules())[running[arch]].running_mean.clone()
        model.eval()
        with torch.no_grad():
            e = model(x)
            tensors[arch + "_eval_logits"] = e.permute(0, 2, 3, 1) if segmentation else e
    write(out_dir, "models", tensors)


GOLDENS = {"matmul": matmul_golden, "cross_entropy": cross_entropy_golden, "composed": composed_golden,
           "optimizer": optimizer_golden, "conv": conv_golden, "norm_pool": norm_pool_golden,
           "resnet": resnet_golden, "cnn_ops": cnn_ops_golden, "models": models_golden}


def main():
    """make_goldens.py [OUT_DIR] [NAME ...]: every golden, or only the named ones (cnn_ops: PyTorch 2.15's, run
    with its interpreter, e.g. /opt/torch2/bin/python; models: Debian's torchvision)."""
    args = sys.argv[1:]
    out_dir = args[0] if args else os.path.join(os.path.dirname(__file__), "..", "tests", "golden")
    names = args[1:] or list(GOLDENS)
    unknown = [n for n in names if n not in GOLDENS]
    if unknown:
        raise SystemExit("make_goldens.py: no golden named %s (known: %s)" % (", ".join(unknown), ", ".join(GOLDENS)))
    os.makedirs(out_dir, exist_ok=True)
    for name in names:
        GOLDENS[name](out_dir)


if __name__ == "__main__":
    main()
