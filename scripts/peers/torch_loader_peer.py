#!/usr/bin/env python3
"""The torchvision peer for scripts/bench_loader.sh: ImageFolder + DataLoader over a folder of JPEGs
(PIL decode, RandomResizedCrop(224), RandomHorizontalFlip, ToTensor, Normalize), as a PyTorch user
feeds ResNet-50. Prints images/s, median of --repeats passes over --batches batches, per worker count.

  torch_loader_peer.py FOLDER [--workers 1,2] [--batch-size 64] [--batches 23] [--repeats 3] [--size 224]
"""
import argparse
import statistics
import time

import torch
import torchvision
from torchvision import transforms


def main():
    p = argparse.ArgumentParser()
    p.add_argument("folder")
    p.add_argument("--workers", default="1,2")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--batches", type=int, default=23)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--size", type=int, default=224)
    args = p.parse_args()
    torch.set_num_threads(1)
    tf = transforms.Compose([
        transforms.RandomResizedCrop(args.size),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
    ])
    ds = torchvision.datasets.ImageFolder(args.folder, transform=tf)
    print(f"torchvision {torchvision.__version__}, torch {torch.__version__}: {len(ds)} images, batch {args.batch_size}, "
          f"{args.batches} batches per pass")
    for workers in [int(w) for w in args.workers.split(",")]:
        rates = []
        for r in range(args.repeats):
            g = torch.Generator()
            g.manual_seed(r)
            loader = torch.utils.data.DataLoader(ds, batch_size=args.batch_size, shuffle=True, num_workers=workers,
                                                 generator=g, persistent_workers=False, prefetch_factor=4)
            it = iter(loader)
            next(it)  # workers started and warm: the first batch is not timed
            start = time.perf_counter()
            images = 0
            for _ in range(args.batches):
                x, _ = next(it)
                images += x.shape[0]
            rates.append(images / (time.perf_counter() - start))
            del it, loader
        print(f"workers={workers} img_per_s={statistics.median(rates):.0f} (min {min(rates):.0f}, max {max(rates):.0f} "
              f"over {args.repeats} passes)")


if __name__ == "__main__":
    main()
