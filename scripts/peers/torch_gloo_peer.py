"""Peer for multi-node benchmarks: PyTorch's gloo backend (what PyTorch DDP users run on CPUs), one process per
rank started by mpirun (for instance through scripts/cluster.sh run), so it runs on the same emulated nodes and
links as ringtrain. Rank and world size come from Open MPI's environment; the rendezvous is rank 0's host
(MASTER_ADDR, default node0) at MASTER_PORT (default 29533).
  mpirun ... /usr/bin/python3 scripts/peers/torch_gloo_peer.py allreduce [MIN_BYTES MAX_BYTES FACTOR ITERS] [--json F]
      all-reduce sweep of f32 tensors: prints allreduce_bench's columns (busbw = algbw * 2(n-1)/n) and writes
      its --json format
  mpirun ... /usr/bin/python3 scripts/peers/torch_gloo_peer.py step DEPTH BATCH THREADS STEPS [HW]
      DDP training-step time of ResNet-DEPTH (CIFAR-style 20/32/44/56/110 or torchvision-style 50, both from
      scripts/peers/models.py), BATCH images of HWxHW per rank: prints median_step_s (the slowest
      rank's median)"""
import json, os, sys, time
import torch, torch.distributed as dist, torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import ResNet, imagenet_resnet  # noqa: E402


def init():
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0")); world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    addr = os.environ.get("MASTER_ADDR", "node0"); port = os.environ.get("MASTER_PORT", "29533")
    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank, world_size=world)
    return rank, world


def slowest(seconds):
    t = torch.tensor([seconds], dtype=torch.float64); dist.all_reduce(t, op=dist.ReduceOp.MAX); return t.item()


def allreduce(argv):
    json_path = None
    if "--json" in argv:
        k = argv.index("--json"); json_path = argv[k + 1]; argv = argv[:k] + argv[k + 2:]
    lo, hi, factor, iters = (int(float(a)) for a in (argv + ["1048576", "67108864", "4", "5"][len(argv):]))
    rank, n = init()
    rows = []
    if rank == 0:
        print(f"# torch {torch.__version__} gloo all-reduce: {n} ranks, f32, iters {iters}")
        print(f"# {'backend':<8} {'size(B)':>12} {'count':>12} {'type':>6} {'time(us)':>11} {'algbw(GB/s)':>11} {'busbw(GB/s)':>11}")
    b = lo
    while b <= hi:
        count = max(1, b // 4)
        t = torch.ones(count)
        dist.all_reduce(t); dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters): dist.all_reduce(t)
        us = slowest((time.perf_counter() - t0) / iters) * 1e6
        algbw = count * 4 / (us * 1e3); busbw = algbw * 2 * (n - 1) / n
        rows.append({"backend": "gloo", "bytes": count * 4, "count": count, "type": "f32", "time_us": us,
                     "algbw_gbps": algbw, "busbw_gbps": busbw, "wrong": None})
        if rank == 0:
            print(f"  {'gloo':<8} {count * 4:>12} {count:>12} {'f32':>6} {us:>11.1f} {algbw:>11.3f} {busbw:>11.3f}", flush=True)
        b *= factor
    if rank == 0 and json_path:
        with open(json_path, "w") as f: json.dump({"ranks": n, "results": rows}, f, indent=2)
    finish()


def finish():
    # gloo's teardown has hung here when ranks reach it at different times: every rank meets here, then the
    # process ends without it.
    dist.barrier(); sys.stdout.flush(); os._exit(0)


def step(argv):
    depth, batch, threads, steps = (int(a) for a in argv[:4]); hw = int(argv[4]) if len(argv) > 4 else 32
    torch.set_num_threads(threads); torch.manual_seed(0)
    rank, n = init()
    m = torch.nn.parallel.DistributedDataParallel(imagenet_resnet(50, classes=10) if depth == 50 else ResNet(depth))
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    x = torch.randn(batch, 3, hw, hw); y = torch.randint(0, 10, (batch,))

    def one():
        opt.zero_grad(set_to_none=True); F.cross_entropy(m(x), y).backward(); opt.step()

    for _ in range(2): one()
    t = []
    for _ in range(steps):
        t0 = time.perf_counter(); one(); t.append(time.perf_counter() - t0)
    t.sort()
    med = slowest(t[len(t) // 2])
    if rank == 0:
        print(f"torch-ddp-gloo {torch.__version__} resnet{depth} b{batch} hw{hw} ranks={n} threads={threads} "
              f"median_step_s={med:.4f} img_per_s={batch * n / med:.1f}", flush=True)
    finish()


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in ("allreduce", "step"):
        sys.exit(__doc__)
    (allreduce if sys.argv[1] == "allreduce" else step)(sys.argv[2:])
