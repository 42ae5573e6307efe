#!/usr/bin/env bash
# peer_model.sh BUILD_DIR SOURCE_DIR: the PyTorch peer (scripts/peers/torch_resnet_step.py) times the network
# ringtrain's bench_step times: for CIFAR and ImageNet ResNets, with 1 and 3 input channels, both print the
# same parameter count. The peer runs on Debian's PyTorch in its plain and its fastest layout (channels_last,
# bf16 autocast), so the modes bench_vs_pytorch.sh uses keep working.
set -euo pipefail
build=$1 src=$2
status=0
for spec in "resnet20 32 3" "resnet20 28 1" "resnet56 32 3" "resnet18 64 3" "resnet50 64 3"; do
  read -r arch hw ch <<< "$spec"
  ours=$(timeout 300 "$build/bench_step" -a "$arch" -b 2 --hw "$hw" --in-ch "$ch" --steps 1 --warmup 0 --threads 1 |
         sed -n 's/.* params=\([0-9]*\).*/\1/p')
  for mode in "--format nchw" "--format cl --precision bf16"; do
    # shellcheck disable=SC2086
    theirs=$(timeout 300 /usr/bin/python3 "$src/scripts/peers/torch_resnet_step.py" -a "$arch" -b 2 --hw "$hw" \
             --channels "$ch" --steps 1 --threads 1 $mode | sed -n 's/.* params=\([0-9]*\).*/\1/p')
    if [[ -z $ours || $ours != "$theirs" ]]; then
      echo "peer_model: $arch ${hw}x${hw}x${ch} ($mode): ringtrain has '$ours' parameters, the peer '$theirs'"
      status=1
    fi
  done
done
(( status )) && exit 1
echo "peer_model: the peer's networks are ringtrain's (5 architectures, 2 modes)"
