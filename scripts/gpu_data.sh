#!/usr/bin/env bash
# scripts/gpu_data.sh: run before a GPU check, on a machine with Debian's dataset-fashion-mnist. Writes a
# Fashion-MNIST subset small enough to travel with the working tree to the GPU machine: the first
# TRAIN images of the training split and the whole test split, as the same gzipped idx files (make_shards
# fashion-mnist reads them). scripts/gpu_check.sh trains ResNet-20 on it on the GPU and on that machine's
# CPU and compares the two test accuracies (docs/GPU.md).
#   bash scripts/gpu_data.sh [--out DIR] [--train N]     (defaults: .gpu_data, 20000)
set -euo pipefail
cd "$(dirname "$0")/.."
out=.gpu_data train=20000
while (($#)); do
  case $1 in
    --out) [[ $# -ge 2 ]] || { echo "gpu_data: --out needs a folder" >&2; exit 2; }; out=$2; shift 2 ;;
    --train) [[ $# -ge 2 && $2 =~ ^[1-9][0-9]*$ && $2 -le 60000 ]] || { echo "gpu_data: --train needs a count from 1 to 60000" >&2; exit 2; }
      train=$2; shift 2 ;;
    -h|--help) sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_data: unknown argument '$1' (expected --out DIR or --train N)" >&2; exit 2 ;;
  esac
done
src=/usr/share/datasets/fashion-mnist
[[ -d $src ]] || { echo "gpu_data: $src missing: apt-get install dataset-fashion-mnist" >&2; exit 1; }
rm -rf "$out/fashion-mnist" && mkdir -p "$out/fashion-mnist"
python3 - "$src" "$out/fashion-mnist" "$train" <<'PY'
import gzip, struct, sys
src, dst, train = sys.argv[1], sys.argv[2], int(sys.argv[3])
def subset(name, count):
    with gzip.open(f"{src}/{name}", "rb") as f:
        data = f.read()
    magic, n = struct.unpack(">II", data[:8])
    dims = (magic & 0xFF) - 1  # idx: the last byte of the magic is the number of dimensions
    header = 8 + 4 * dims
    rest = struct.unpack(">" + "I" * dims, data[8:header])
    per_item = 1
    for d in rest:
        per_item *= d
    count = min(count, n)
    with gzip.open(f"{dst}/{name}", "wb", compresslevel=9) as f:
        f.write(struct.pack(">II", magic, count) + data[8:header] + data[header:header + count * per_item])
    return count
print("train", subset("train-images-idx3-ubyte.gz", train), subset("train-labels-idx1-ubyte.gz", train))
print("test", subset("t10k-images-idx3-ubyte.gz", 10000), subset("t10k-labels-idx1-ubyte.gz", 10000))
PY
echo "gpu_data: $(du -sh "$out" | cut -f1) in $out/fashion-mnist"
