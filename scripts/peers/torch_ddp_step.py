"""Peer for weak scaling (scripts/bench_weak_scaling.sh): PyTorch DDP (gloo, CPU) training-step time of
CIFAR-style ResNet-N, the same network, optimizer and data shapes as scripts/peers/torch_resnet_step.py, on
WORLD processes with BATCH images and THREADS threads each.
  /usr/bin/python3 scripts/peers/torch_ddp_step.py WORLD DEPTH BATCH THREADS [STEPS]
Prints one line: median_step_s (the slowest rank's median) and img_per_s over all ranks."""
import os, socket, sys, time
import torch, torch.distributed as dist, torch.multiprocessing as mp, torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import ResNet  # noqa: E402


def worker(rank, world, port, depth, batch, threads, steps, out):
    torch.set_num_threads(threads); torch.manual_seed(0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    m = torch.nn.parallel.DistributedDataParallel(ResNet(depth))
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    x = torch.randn(batch, 3, 32, 32); y = torch.randint(0, 10, (batch,))

    def step():
        opt.zero_grad(set_to_none=True); F.cross_entropy(m(x), y).backward(); opt.step()

    for _ in range(2): step()
    t = []
    for _ in range(steps):
        t0 = time.perf_counter(); step(); t.append(time.perf_counter() - t0)
    t.sort()
    med = torch.tensor([t[len(t) // 2]])
    dist.all_reduce(med, op=dist.ReduceOp.MAX)
    if rank == 0: out.put(med.item())
    dist.destroy_process_group()


if __name__ == "__main__":
    world, depth, batch, threads = (int(a) for a in sys.argv[1:5])
    steps = int(sys.argv[5]) if len(sys.argv) > 5 else 10
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
    ctx = mp.get_context("spawn"); out = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, world, port, depth, batch, threads, steps, out)) for r in range(world)]
    for p in procs: p.start()
    med = out.get(timeout=1800)
    for p in procs: p.join()
    print(f"torch-ddp {torch.__version__} resnet{depth} b{batch} ranks={world} threads={threads} "
          f"median_step_s={med:.4f} img_per_s={batch * world / med:.1f}")
