"""Peer for docs/RESULTS.md: the demo's recipe in PyTorch, one process. ResNet-20 (the CIFAR ResNet of
scripts/peers/models.py with 1 input channel) on Fashion-MNIST from Debian's idx files:
batch 128, SGD lr 0.1 momentum 0.9 weight decay 5e-4, cosine schedule per step over the run, random crop
after 4-pixel zero padding and horizontal flips, normalisation with the training set's mean/std.
  /usr/bin/python3 scripts/peers/torch_fashion_mnist.py [EPOCHS=1] [THREADS=2] [SEED=0]
Prints the test top-1 after every epoch and the images/s."""
import gzip, math, os, sys, time
import numpy as np, torch, torch.nn as nn, torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import ResNet  # noqa: E402  (the same network as every peer)

epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 1
threads = int(sys.argv[2]) if len(sys.argv) > 2 else 2
seed = int(sys.argv[3]) if len(sys.argv) > 3 else 0
torch.set_num_threads(threads); torch.manual_seed(seed); np.random.seed(seed)
root = "/usr/share/datasets/fashion-mnist"


def idx(name):
    path = os.path.join(root, name)
    raw = gzip.open(path + ".gz").read() if os.path.exists(path + ".gz") else open(path, "rb").read()
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim).reshape(dims).copy()


xtr, ytr = idx("train-images-idx3-ubyte"), idx("train-labels-idx1-ubyte")
xte, yte = idx("t10k-images-idx3-ubyte"), idx("t10k-labels-idx1-ubyte")
mean, std = (xtr / 255.0).mean(), (xtr / 255.0).std()
norm = lambda x: (torch.from_numpy(x).float().div(255) - mean) / std
Xtr, Ytr, Xte, Yte = norm(xtr)[:, None], torch.from_numpy(ytr.astype(np.int64)), norm(xte)[:, None], torch.from_numpy(yte.astype(np.int64))
pad_value = (0 - mean) / std  # zero pixels, normalised

model = ResNet(20, cin=1)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
batch, steps_per_epoch = 128, len(Xtr) // 128
total = steps_per_epoch * epochs
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, total) / total)))


def augment(x):
    n = x.shape[0]
    padded = F.pad(x, (4, 4, 4, 4), value=pad_value)
    ox, oy = np.random.randint(0, 9, n), np.random.randint(0, 9, n)
    out = torch.stack([padded[i, :, oy[i]:oy[i] + 28, ox[i]:ox[i] + 28] for i in range(n)])
    flip = torch.from_numpy(np.random.rand(n) < 0.5)
    out[flip] = out[flip].flip(-1)
    return out


start = time.perf_counter()
for epoch in range(epochs):
    model.train()
    perm = torch.randperm(len(Xtr))
    for s in range(steps_per_epoch):
        i = perm[s * batch:(s + 1) * batch]
        loss = F.cross_entropy(model(augment(Xtr[i])), Ytr[i])
        opt.zero_grad(set_to_none=True); loss.backward(); opt.step(); sched.step()
    model.eval(); correct = 0
    with torch.no_grad():
        for j in range(0, len(Xte), 500):
            correct += (model(Xte[j:j + 500]).argmax(1) == Yte[j:j + 500]).sum().item()
    elapsed = time.perf_counter() - start
    print(f"torch {torch.__version__} epoch {epoch + 1}: test top-1 {100 * correct / len(Xte):.2f}% "
          f"({(epoch + 1) * steps_per_epoch * batch / elapsed:.0f} img/s train+eval, {threads} threads)", flush=True)
