#!/usr/bin/env bash
# scripts/bench_loader.sh: the loader's throughput, in one run (BUILD_DIR: default build; WORK: default
# /tmp/ringtrain-bench, where the data is made once and kept):
#  1. Fashion-MNIST (Debian's dataset-fashion-mnist) against the rate a CPU training step consumes it
#     (the PyTorch peer scripts/peers/torch_resnet_step.py, ResNet-20 batch 128 on 28x28x1);
#  2. a synthetic 224x224x3 raw split, read with pread and through HDF5's lock, 1 and 2 threads;
#  3. 3,000 real photographs (scripts/make_photo_folder.py: crops of scikit-image's sample photos, about
#     400x350, JPEG q90) kept as they are (make_shards imagefolder --size 0 --encode jpeg), with
#     random-resized crops to 224: DCT-scaled region decode against full-size decode, and the torchvision
#     peer (scripts/peers/torch_loader_peer.py: ImageFolder + DataLoader, PIL) on the same files;
#  4. 600 larger photographs (--scale 2.5, about 1000x875), where reduced-scale decoding applies;
#  5. the loader during a real CPU training step (train_resnet on the photographs, 2 loader threads on
#     this machine's cores): step time with the workers at the compute threads' priority and below it.
set -euo pipefail
cd "$(dirname "$0")/.."
work=${WORK:-/tmp/ringtrain-bench}
build=${BUILD_DIR:-build}
mkdir -p "$work"
if ! /usr/bin/python3 -c "import skimage, torchvision" 2> /dev/null; then
  echo "bench_loader.sh: needs scikit-image (its sample photographs) and torchvision (the peer): apt-get install python3-skimage python3-torchvision" >&2
  exit 1
fi
echo "== CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"
[[ -f "$work/fm/manifest.json" ]] || "$build"/make_shards fashion-mnist /usr/share/datasets/fashion-mnist "$work/fm" --shards 4 >/dev/null 2>&1
[[ -f "$work/syn/manifest.json" ]] || "$build"/make_shards synthetic "$work/syn" --shape 224x224x3 --count 2000 --classes 10 --shards 2 >/dev/null 2>&1
if [[ ! -f "$work/photos-orig/manifest.json" ]]; then
  /usr/bin/python3 scripts/make_photo_folder.py "$work/photos" --count 3000
  "$build"/make_shards imagefolder "$work/photos" "$work/photos-orig" --size 0 --encode jpeg --shards 2 >/dev/null 2>&1
fi
if [[ ! -f "$work/photos-large-orig/manifest.json" ]]; then
  /usr/bin/python3 scripts/make_photo_folder.py "$work/photos-large" --count 600 --scale 2.5 --seed 8
  "$build"/make_shards imagefolder "$work/photos-large" "$work/photos-large-orig" --size 0 --encode jpeg --shards 2 >/dev/null 2>&1
fi

echo "== loader: Fashion-MNIST, pad-crop 2 + flip, batch 128"
fm=$("$build"/bench_loader --data "$work/fm" --threads 1,2 --pad-crop 2 --hflip --batches 200)
echo "$fm"
for reads in "" --hdf5-reads; do  # pread (no lock), then through HDF5 (its lock), for the thread scaling
  echo "== loader: synthetic 224x224x3 raw, random-resized crop 224 + flip, batch 32 ${reads}"
  "$build"/bench_loader --data "$work/syn" --threads 1,2 --resized-crop 224 --hflip --batches 62 --repeats 7 -b 32 $reads
  echo "== loader: synthetic 224x224x3 raw, no augmentation, batch 32 ${reads}"
  "$build"/bench_loader --data "$work/syn" --threads 1,2 --batches 62 --repeats 7 -b 32 $reads
done
echo "== loader: 3,000 photographs (JPEG, own sizes), random-resized crop 224 + flip, batch 32; decode modes interleaved"
"$build"/bench_loader --data "$work/photos-orig" --threads 1,2 --resized-crop 224 --hflip --batches 46 --repeats 5 -b 32 \
  --decode scaled,region,whole
echo "== peer: torchvision ImageFolder + DataLoader on the same 3,000 JPEGs (RandomResizedCrop 224, flip, ToTensor, Normalize)"
timeout 900 /usr/bin/python3 scripts/peers/torch_loader_peer.py "$work/photos" --workers 1,2 --batch-size 32 --batches 46 --repeats 3
echo "== loader: 600 large photographs (about 1000x875), random-resized crop 224 + flip, batch 32; decode modes interleaved"
"$build"/bench_loader --data "$work/photos-large-orig" --threads 1,2 --resized-crop 224 --hflip --batches 18 --repeats 5 -b 32 \
  --decode scaled,region,whole
echo "== peer: torchvision on the same 600 large JPEGs"
timeout 900 /usr/bin/python3 scripts/peers/torch_loader_peer.py "$work/photos-large" --workers 1,2 --batch-size 32 --batches 18 --repeats 3

echo "== a CPU training step with the loader: ResNet-18, 64x64 crops of the photographs, batch 64, 2 loader threads"
for round in 1 2 3; do
  for nice in 0 10; do
    timeout 900 "$build"/train_resnet --data "$work/photos-orig" --arch resnet18 --steps 15 --image-size 64 --batch-size 64 \
      --loader-threads 2 --loader-nice "$nice" --log-jsonl "$work/step-nice$nice-$round.jsonl" > /dev/null
  done
done
/usr/bin/python3 - "$work" << 'PY'
import json, statistics, sys
for nice in (0, 10):
    steps, waits = [], []
    for r in (1, 2, 3):
        summary = [json.loads(l) for l in open(f"{sys.argv[1]}/step-nice{nice}-{r}.jsonl") if '"breakdown_s"' in l][0]
        b = summary["breakdown_s"]
        steps.append(sum(b.values()))
        waits.append(b["data_wait"])
    print(f"loader nice {nice:2d}: step {statistics.median(steps):.3f} s (rounds {', '.join(f'{s:.3f}' for s in steps)}), "
          f"data wait {statistics.median(waits) * 1000:.1f} ms")
PY

echo "== consumer: PyTorch ResNet-20, batch 128, 28x28x1, 1 thread"
torch_line=$(timeout 600 /usr/bin/python3 scripts/peers/torch_resnet_step.py -a resnet20 -b 128 --threads 1 --steps 5 --hw 28 --channels 1)
echo "$torch_line"
loader_rate=$(echo "$fm" | sed -n 's/^threads=1 img_per_s=\([0-9]*\).*/\1/p')
consumer_rate=$(echo "$torch_line" | sed -n 's/.*img_per_s=\([0-9.]*\).*/\1/p')
python3 -c "print(f'loader (1 thread) / consumer = {${loader_rate} / ${consumer_rate}:.1f}x (goal >= 3x)')"
