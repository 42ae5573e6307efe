"""The networks ringtrain trains, written in PyTorch for the peers of scripts/peers/ (ringtrain's layers use
torchvision's names and layouts, so the same architecture is timed on both sides):
  cifar_resnet(depth, cin, classes)   ResNet-20/32/44/56/110: 3x3 stem of 16, three stages of 16/32/64
  imagenet_resnet(depth, classes)     ResNet-18/34/50/101/152: 7x7 stem, max pool, four stages (basic or
                                      bottleneck blocks), as torchvision builds them (torchvision not needed)
  resnet(arch, cin, classes)          either, by ringtrain's -a name ("resnet20", "resnet50", ...)
Works with Debian's PyTorch 1.13 and with PyTorch 2.x."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Basic(nn.Module):
    def __init__(s, i, o, st):
        super().__init__()
        s.c1 = nn.Conv2d(i, o, 3, st, 1, bias=False); s.b1 = nn.BatchNorm2d(o)
        s.c2 = nn.Conv2d(o, o, 3, 1, 1, bias=False); s.b2 = nn.BatchNorm2d(o)
        s.sc = None if (st == 1 and i == o) else nn.Sequential(nn.Conv2d(i, o, 1, st, bias=False), nn.BatchNorm2d(o))

    def forward(s, x):
        y = F.relu(s.b1(s.c1(x))); y = s.b2(s.c2(y))
        return F.relu(y + (x if s.sc is None else s.sc(x)))


class Bottleneck(nn.Module):
    def __init__(s, i, mid, st):
        super().__init__(); o = mid * 4
        s.c1 = nn.Conv2d(i, mid, 1, bias=False); s.b1 = nn.BatchNorm2d(mid)
        s.c2 = nn.Conv2d(mid, mid, 3, st, 1, bias=False); s.b2 = nn.BatchNorm2d(mid)
        s.c3 = nn.Conv2d(mid, o, 1, bias=False); s.b3 = nn.BatchNorm2d(o)
        s.sc = None if (st == 1 and i == o) else nn.Sequential(nn.Conv2d(i, o, 1, st, bias=False), nn.BatchNorm2d(o))

    def forward(s, x):
        y = F.relu(s.b1(s.c1(x))); y = F.relu(s.b2(s.c2(y))); y = s.b3(s.c3(y))
        return F.relu(y + (x if s.sc is None else s.sc(x)))


class Net(nn.Module):
    def __init__(s, stem, layers, width, classes):
        super().__init__()
        s.stem, s.layers, s.fc = stem, nn.Sequential(*layers), nn.Linear(width, classes)

    def forward(s, x):
        x = s.layers(s.stem(x)); return s.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


CIFAR_DEPTHS = (20, 32, 44, 56, 110)
IMAGENET_STAGES = {18: (Basic, (2, 2, 2, 2)), 34: (Basic, (3, 4, 6, 3)), 50: (Bottleneck, (3, 4, 6, 3)),
                   101: (Bottleneck, (3, 4, 23, 3)), 152: (Bottleneck, (3, 8, 36, 3))}


def cifar_resnet(depth, cin=3, classes=10):
    n = (depth - 2) // 6
    stem = nn.Sequential(nn.Conv2d(cin, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
    layers, i = [], 16
    for o, st in [(16, 1), (32, 2), (64, 2)]:
        for k in range(n): layers.append(Basic(i, o, st if k == 0 else 1)); i = o
    return Net(stem, layers, 64, classes)


def imagenet_resnet(depth, cin=3, classes=1000):
    block, counts = IMAGENET_STAGES[depth]
    stem = nn.Sequential(nn.Conv2d(cin, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1))
    layers, i = [], 64
    for mid, n, st in zip((64, 128, 256, 512), counts, (1, 2, 2, 2)):
        for k in range(n):
            layers.append(block(i, mid, st if k == 0 else 1)); i = mid * (4 if block is Bottleneck else 1)
    return Net(stem, layers, i, classes)


def resnet(arch, cin=3, classes=None):
    depth = int(arch.replace("resnet", ""))
    if depth in CIFAR_DEPTHS: return cifar_resnet(depth, cin, classes or 10)
    if depth in IMAGENET_STAGES: return imagenet_resnet(depth, cin, classes or 1000)
    raise SystemExit(f"unknown architecture '{arch}': resnet20|32|44|56|110 or resnet18|34|50|101|152")


# The CIFAR ResNet by depth, as the older peers called it.
def ResNet(depth, cin=3, ncls=10):  # noqa: N802
    return cifar_resnet(depth, cin, ncls)
