#!/usr/bin/env bash
# imagefolder_own_sizes.sh BUILD_DIR WORK_DIR: an image folder of JPEGs and PNGs of different sizes kept
# as they are (make_shards imagefolder --size 0 --encode jpeg, format version 3), trained on with
# random-resized crops, on one rank and on two; --size 0 without --encode jpeg is refused.
set -euo pipefail
build=$1; work=$2
rm -rf "$work"; mkdir -p "$work"
/usr/bin/python3 - "$work/src" <<'PY'
import os, sys
import numpy as np
from PIL import Image
rng = np.random.default_rng(3)
for i in range(24):
    h, w = int(rng.integers(40, 120)), int(rng.integers(40, 120))
    d = os.path.join(sys.argv[1], f"class{i % 3}")
    os.makedirs(d, exist_ok=True)
    a = (rng.random((h, w, 3)) * 60 + 60 * (i % 3)).astype(np.uint8)
    if i == 5:
        Image.fromarray(a[:, :, 0]).save(os.path.join(d, f"{i}.png"))  # grayscale PNG: re-encoded as RGB JPEG
    else:
        Image.fromarray(a).save(os.path.join(d, f"{i}.jpg"), quality=90)
PY
out=$("$build/make_shards" imagefolder "$work/src" "$work/ds" --size 0 --encode jpeg --shards 2)
echo "$out"
grep -q "train: 24 records in 2 shards, varied x 3 encoded, 3 classes" <<< "$out"
grep -q '"format_version": 3' "$work/ds/manifest.json"
if "$build/make_shards" imagefolder "$work/src" "$work/raw" --size 0 2> "$work/raw.err"; then
  echo "make_shards --size 0 without --encode jpeg should fail"; exit 1
fi
grep -q "image size 0 (each image's own size) needs encoded storage (--encode jpeg)" "$work/raw.err"
"$build/train_resnet" --data "$work/ds" -a resnet18 --image-size 32 -b 4 --steps 3 --threads 1 --log-jsonl "$work/one.jsonl" > /dev/null
timeout 300 mpirun -np 2 --allow-run-as-root --oversubscribe "$build/train_resnet" --data "$work/ds" -a resnet18 \
  --image-size 32 -b 2 --steps 3 --threads 1 --log-jsonl "$work/two.jsonl" > /dev/null
/usr/bin/python3 - "$work" <<'PY'
import json, math, sys
for name in ("one", "two"):
    s = [json.loads(l) for l in open(f"{sys.argv[1]}/{name}.jsonl")][-1]
    assert s["steps"] == 3 and math.isfinite(s["train_loss"]), s
print("imagefolder of own sizes ok")
PY
