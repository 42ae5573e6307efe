#!/usr/bin/env bash
# scripts/bench_loader.sh: loader throughput against the rate a training step consumes images, in one
# run. Converts Fashion-MNIST (Debian's dataset-fashion-mnist) and a synthetic 224x224x3 split into
# shards under $WORK (default /tmp/ringtrain-bench), runs build/bench_loader on both with augmentation
# for 1 and 2 threads, and the PyTorch peer (../shared/peers/torch_resnet_step.py) for the consumer rate:
# ResNet-20 at batch 128 on 28x28x1 (Fashion-MNIST). Prints the ratio loader / consumer.
set -euo pipefail
cd "$(dirname "$0")/.."
work=${WORK:-/tmp/ringtrain-bench}
peer=${PEER:-../shared/peers/torch_resnet_step.py}
mkdir -p "$work"
[[ -f "$work/fm/manifest.json" ]] || ./build/make_shards fashion-mnist /usr/share/datasets/fashion-mnist "$work/fm" --shards 4 >/dev/null 2>&1
[[ -f "$work/syn/manifest.json" ]] || ./build/make_shards synthetic "$work/syn" --shape 224x224x3 --count 2000 --classes 10 --shards 2 >/dev/null 2>&1

echo "== loader: Fashion-MNIST, pad-crop 2 + flip, batch 128"
fm=$(./build/bench_loader --data "$work/fm" --threads 1,2 --pad-crop 2 --hflip --batches 200)
echo "$fm"
echo "== loader: synthetic 224x224x3, random-resized crop 224 + flip, batch 64"
./build/bench_loader --data "$work/syn" --threads 1,2 --resized-crop 224 --hflip --batches 10 -b 64
echo "== consumer: PyTorch ResNet-20, batch 128, 28x28x1, 1 thread"
torch_line=$(/usr/bin/python3 "$peer" 20 128 1 5 28 1)
echo "$torch_line"
loader_rate=$(echo "$fm" | sed -n 's/^threads=1 img_per_s=\([0-9]*\).*/\1/p')
consumer_rate=$(echo "$torch_line" | sed -n 's/.*img_per_s=\([0-9.]*\).*/\1/p')
python3 -c "print(f'loader (1 thread) / consumer = {${loader_rate} / ${consumer_rate}:.1f}x (goal >= 3x)')"
