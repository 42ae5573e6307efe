#!/usr/bin/env bash
# scripts/bench_loader.sh: loader throughput against the rate a training step consumes images, in one
# run (BUILD_DIR: default build). Converts Fashion-MNIST (Debian's dataset-fashion-mnist) and a synthetic 224x224x3 split into
# shards under $WORK (default /tmp/ringtrain-bench), runs build/bench_loader on both with augmentation
# for 1 and 2 threads (the 224x224x3 split read with pread and, to compare, through HDF5's lock), and the PyTorch peer (../shared/peers/torch_resnet_step.py) for the consumer rate:
# ResNet-20 at batch 128 on 28x28x1 (Fashion-MNIST). Prints the ratio loader / consumer.
set -euo pipefail
cd "$(dirname "$0")/.."
work=${WORK:-/tmp/ringtrain-bench}
build=${BUILD_DIR:-build}
peer=${PEER:-../shared/peers/torch_resnet_step.py}
mkdir -p "$work"
[[ -f "$work/fm/manifest.json" ]] || "$build"/make_shards fashion-mnist /usr/share/datasets/fashion-mnist "$work/fm" --shards 4 >/dev/null 2>&1
[[ -f "$work/syn/manifest.json" ]] || "$build"/make_shards synthetic "$work/syn" --shape 224x224x3 --count 2000 --classes 10 --shards 2 >/dev/null 2>&1

# JPEG shards: 2000 photo-like JPEGs of 300-500 x 260-440 (smooth random fields with edges and noise,
# quality 90) in 10 class folders, resized to 224 and kept encoded by make_shards imagefolder.
if [[ ! -f "$work/jpg/manifest.json" ]]; then
  /usr/bin/python3 - "$work/jpg-src" << 'PY'
import os, sys, numpy as np
from PIL import Image
rng = np.random.default_rng(7)
for i in range(2000):
    h, w = int(rng.integers(260, 441)), int(rng.integers(300, 501))
    small = rng.random((h // 16 + 2, w // 16 + 2, 3)) * 255
    img = Image.fromarray(small.astype(np.uint8)).resize((w, h), Image.BICUBIC)
    a = np.asarray(img, dtype=np.float32) + rng.normal(0, 6, (h, w, 3))
    a[:, int(rng.integers(0, w)):] *= 0.6  # an edge
    d = os.path.join(sys.argv[1], f"class{i % 10}")
    os.makedirs(d, exist_ok=True)
    Image.fromarray(np.clip(a, 0, 255).astype(np.uint8)).save(os.path.join(d, f"{i:05d}.jpg"), quality=90)
PY
  "$build"/make_shards imagefolder "$work/jpg-src" "$work/jpg" --size 224 --encode jpeg --shards 2 > /dev/null 2>&1
fi

echo "== loader: Fashion-MNIST, pad-crop 2 + flip, batch 128"
fm=$("$build"/bench_loader --data "$work/fm" --threads 1,2 --pad-crop 2 --hflip --batches 200)
echo "$fm"
for reads in "" --hdf5-reads; do  # pread (no lock), then through HDF5 (its lock), for the thread scaling
  echo "== loader: synthetic 224x224x3, random-resized crop 224 + flip, batch 64 ${reads}"
  "$build"/bench_loader --data "$work/syn" --threads 1,2 --resized-crop 224 --hflip --batches 31 --repeats 5 -b 64 $reads
  echo "== loader: synthetic 224x224x3, no augmentation, batch 64 ${reads}"
  "$build"/bench_loader --data "$work/syn" --threads 1,2 --batches 31 --repeats 5 -b 64 $reads
done
for reads in "" --hdf5-reads; do
  echo "== loader: JPEG 224x224x3 (kept encoded), random-resized crop 224 + flip, batch 64 ${reads}"
  "$build"/bench_loader --data "$work/jpg" --threads 1,2 --resized-crop 224 --hflip --batches 31 --repeats 5 -b 64 $reads
done
echo "== consumer: PyTorch ResNet-20, batch 128, 28x28x1, 1 thread"
torch_line=$(/usr/bin/python3 "$peer" 20 128 1 5 28 1)
echo "$torch_line"
loader_rate=$(echo "$fm" | sed -n 's/^threads=1 img_per_s=\([0-9]*\).*/\1/p')
consumer_rate=$(echo "$torch_line" | sed -n 's/.*img_per_s=\([0-9.]*\).*/\1/p')
python3 -c "print(f'loader (1 thread) / consumer = {${loader_rate} / ${consumer_rate}:.1f}x (goal >= 3x)')"
