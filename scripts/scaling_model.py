#!/usr/bin/python3
"""Predicts ringtrain's step time and scaling efficiency from 8 to 1024 GPUs with an alpha-beta model.

Inputs
  * allreduce_bench --json FILE: {"ranks": n, "results": [{"backend", "bytes", "time_us", "wrong", ...}]},
    time_us being one all-reduce of `bytes` bytes over n ranks. Entries of the chosen backend (--backend,
    default "ring", or the file's only backend when it has no "ring") with bytes > 0, time_us > 0 and
    wrong null/0 are used.
  * train_resnet --log-jsonl FILE: a "plan" record (world_size, arch, batch_size, accum_steps, params,
    buckets[{bytes}] in launch order) and, at the end of the run, a "summary" record (median_step_s,
    breakdown_s{data_wait, forward, backward, exposed_comm, optimizer} as mean seconds per optimizer step,
    buckets[{bytes, ready_s, allreduce_s}] with ready_s measured from the start of the last micro-batch's
    backward to the bucket's launch). A file may hold several runs appended; the last complete
    plan...summary group is used (--run-index picks another).

Ring model (one flat ring of n ranks, B bytes):
    t_ring(B, n) = 2(n-1) * alpha + 2(n-1)/n * B / bw          (bw = the ring's bus bandwidth)
`fit` finds alpha and 1/bw by minimising sum(((t_ring - t_meas) / t_meas)^2): relative errors, so
latency-bound small sizes count as much as bandwidth-bound large ones; the problem is linear in
(alpha, 1/bw), solved as weighted linear least squares.

Hierarchical ring for G = N nodes x P GPUs per node (G <= P: a flat NVLink ring over G):
    reduce-scatter in the node:  (P-1) a_nv + (P-1)/P * B / bw_nv
    all-reduce across nodes of each GPU's B/P slice, all P rails in parallel (one NIC per GPU):
                                 2(N-1) a_ib + 2(N-1)/N * (B/P) / bw_ib
    all-gather in the node:      (P-1) a_nv + (P-1)/P * B / bw_nv
    t_hier(B, G) = t_ring(B, P; a_nv, bw_nv) + t_ring(B/P, N; a_ib, bw_ib)
Defaults: bw_nv = 370 GB/s NVLink busbw, a_nv = 5 us, bw_ib = 48 GB/s per NDR NIC, a_ib = 10 us, P = 8.

Step model: bucket i (launch order) is ready at r_i seconds after the last micro-batch's backward starts
(from the summary's ready_s, or, if missing, spread over that backward in proportion to cumulative
bytes). All-reduces run one at a time in launch order:
    start_i = max(r_i, end_{i-1}),  end_i = start_i + t(bytes_i)
    overlap:    step = data_wait + forward + backward + max(0, end_last - W) + optimizer
    no overlap: step = data_wait + forward + backward + sum_i t(bytes_i) + optimizer
where W = backward / accum_steps is the last micro-batch's backward (W = backward without accumulation).
Efficiency (weak scaling, per-GPU batch fixed) = (data_wait + forward + backward + optimizer) / step.
--compute-scale X or --compute-step-s S rescale forward, backward, optimizer and the ready times (S makes
forward + backward + optimizer = S, e.g. 0.032 s for ResNet-50 bf16 at batch 256 on an H200 from
MLPerf's ~7,950 img/s per GPU); --optimizer-s fixes the optimizer's share and rescales only forward and
backward; --bytes-scale rescales bucket bytes (0.5: f32 run, bf16 gradients).

Without a run (predict --arch NAME or --sizes FILE, --step-s S): a setting someone else measured. The network's
gradient tensors in backward order and their ready times (the share of the backward's FLOPs done) come from
docs/scaling/arch.json; the cluster from GPUs per node, the node's ring bus bandwidth and latency, its NICs, their
line rate and the share of it reached, the latency between nodes and the all-reduce algorithm (ring, nccl-ring,
hierarchical, tree, halving-doubling, or nccl-X.Y: what that NCCL chooses); the framework from its bucket size,
gradient bytes, per-tensor and per-bucket costs on the critical path and a wait before each collective; and the
contention: the share of a GPU's compute its collective's kernels take while they move data. Each term is
described where it is computed (collective_seconds, simulate_gpu_step) and in docs/SCALING.md;
scripts/scaling_published_check.py holds them to docs/scaling/published.csv.

Subcommands
  fit BENCH.json [--backend ring] [--json OUT]
  predict --run RUN.jsonl [link flags] [--gpus 8,16,...] [--compute-step-s S] [--markdown] [--json OUT]
  predict --arch NAME | --sizes FILE --step-s S [cluster and framework flags] [--gpus ...] [--json OUT]
  selfcheck --bench-dir DIR --runs-dir DIR | --bench N=FILE ... --run N=FILE ... [--backend ring]
            [--markdown] [--json OUT]
selfcheck compares, per world size n with both allreduce_np{n}.json and train_np{n}.jsonl, the measured
step (rank 0's mean step: its breakdown_s summed, the same statistic as the compute it is predicted from;
median_step_s is reported beside it) with the overlap prediction from a flat ring fitted to that n's bench
and the compute of that run's slowest rank (summary.breakdown_by_rank_s; a synchronous step goes at its
pace, and rank 0's exposed_comm includes waiting for it), with rank 0's bucket ready times stretched to
that rank's backward. A second column uses the 1-rank run's compute (train_np1.jsonl) instead, so the gap
between the two shows how much compute slows down from CPU contention.
"""
import argparse
import json
import math
import os
import re
import sys
from dataclasses import dataclass, replace

import numpy as np

PROG = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "scaling_model.py"


class InputError(Exception):
    """A problem with an input file or option; main() prints it and exits non-zero."""


# ---------------------------------------------------------------- inputs

def _read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror})") from None
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: malformed JSON ({e})") from None


def load_bench(path, backend=None):
    """Returns {"file", "ranks", "backend", "bytes": array, "time_s": array} from allreduce_bench --json."""
    doc = _read_json(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
        raise InputError(f"{path}: no \"results\" list (not an allreduce_bench --json file?)")
    ranks = doc.get("ranks")
    if not isinstance(ranks, int) or ranks < 2:
        raise InputError(f"{path}: \"ranks\" must be an integer >= 2, got {ranks!r}")
    results = [r for r in doc["results"] if isinstance(r, dict)]
    present = sorted({str(r.get("backend", "(unnamed)")) for r in results})
    if backend is None:  # the default: "ring", else the file's only backend
        if "ring" in present or len(present) != 1:
            backend = "ring"
        else:
            backend = present[0]
    rows = [r for r in results if str(r.get("backend", "(unnamed)")) == backend]
    if not rows:
        raise InputError(f"{path}: no results for backend '{backend}' (present: {', '.join(present) or 'none'})")
    usable = []
    for r in rows:
        b, t, wrong = r.get("bytes"), r.get("time_us"), r.get("wrong")
        if isinstance(b, (int, float)) and isinstance(t, (int, float)) and b > 0 and t > 0 \
                and math.isfinite(t) and wrong in (None, 0):
            usable.append((float(b), float(t) * 1e-6))
    if len({b for b, _ in usable}) < 3:
        raise InputError(f"{path}: only {len({b for b, _ in usable})} usable sizes for backend '{backend}' "
                         "(need >= 3 with bytes > 0, time_us > 0 and no wrong results)")
    return {"file": path, "ranks": ranks, "backend": backend,
            "bytes": np.array([b for b, _ in usable]), "time_s": np.array([t for _, t in usable])}


@dataclass
class Compute:
    """Mean seconds per optimizer step, from a run's summary breakdown_s."""
    data_wait: float
    forward: float
    backward: float
    optimizer: float
    accum: int = 1

    @property
    def single(self):  # the step without any communication
        return self.data_wait + self.forward + self.backward + self.optimizer

    @property
    def window(self):  # the backward that all-reduces can overlap: the last micro-batch's
        return self.backward / self.accum


@dataclass
class Bucket:
    nbytes: float
    ready: float = None  # seconds after the last micro-batch's backward starts; None: unknown


def load_run(path, run_index=-1):
    """Parses train_resnet --log-jsonl; returns the chosen complete plan...summary group as a dict."""
    groups = []
    try:
        with open(path) as f:
            lines = f.readlines()
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror})") from None
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"{path}:{lineno}: malformed JSON ({e})") from None
        if not isinstance(rec, dict):
            raise InputError(f"{path}:{lineno}: expected a JSON object per line")
        if rec.get("type") == "plan":
            groups.append({"plan": rec, "summary": None})
        elif rec.get("type") == "summary" and groups:
            groups[-1]["summary"] = rec
    if not groups:
        raise InputError(f"{path}: no \"plan\" record (not a train_resnet --log-jsonl file?)")
    complete = [g for g in groups if g["summary"] is not None]
    if not complete:
        raise InputError(f"{path}: no \"summary\" record after the plan (run unfinished?)")
    try:
        g = complete[run_index]
    except IndexError:
        raise InputError(f"{path}: --run-index {run_index} but only {len(complete)} complete runs") from None
    plan, summary = g["plan"], g["summary"]
    bd = summary.get("breakdown_s")
    missing = [k for k in ("forward", "backward", "optimizer") if not isinstance((bd or {}).get(k), (int, float))]
    if missing or not isinstance(summary.get("median_step_s"), (int, float)):
        raise InputError(f"{path}: summary lacks median_step_s or breakdown_s.{'/'.join(missing) or '...'}")
    accum = max(1, int(plan.get("accum_steps", 1)))
    compute = Compute(float(bd.get("data_wait", 0.0)), float(bd["forward"]), float(bd["backward"]),
                      float(bd["optimizer"]), accum)
    # The slowest rank's compute (summary.breakdown_by_rank_s): a synchronous step waits for it, and rank 0's
    # exposed_comm then includes that wait, which is not communication.
    slowest = compute
    for r in summary.get("breakdown_by_rank_s") or []:
        try:
            c = Compute(float(r.get("data_wait", 0.0)), float(r["forward"]), float(r["backward"]),
                        float(r["optimizer"]), accum)
        except (KeyError, TypeError, ValueError, AttributeError):
            raise InputError(f"{path}: summary.breakdown_by_rank_s has an entry without forward/backward/optimizer")
        if c.single - c.optimizer > slowest.single - slowest.optimizer:
            slowest = c
    src = summary.get("buckets") or plan.get("buckets") or []
    buckets = [Bucket(float(b["bytes"]), b.get("ready_s")) for b in src if isinstance(b, dict) and "bytes" in b]
    world_size = int(plan.get("world_size", summary.get("world_size", 1)))
    # A 1-rank run launches no all-reduces: its ready_s are zeros, not measurements.
    if world_size < 2 or any(b.ready is None for b in buckets) or all(b.ready == 0 for b in buckets):
        buckets = [Bucket(b.nbytes) for b in buckets]
    return {"file": path, "plan": plan, "summary": summary, "compute": compute, "slowest": slowest,
            "buckets": buckets, "world_size": world_size,
            "median_step_s": float(summary["median_step_s"]),
            # rank 0's phases tile its step: their sum is its mean step, comparable with mean compute
            "mean_step_s": compute.single + float(bd.get("exposed_comm", 0.0)),
            "exposed_comm_s": float(bd.get("exposed_comm", 0.0))}


# ---------------------------------------------------------------- communication models

def ring_time(nbytes, n, alpha, bw):
    """Seconds for one flat-ring all-reduce of nbytes over n ranks (alpha in s, bw in bytes/s)."""
    if n <= 1:
        return 0.0 * np.asarray(nbytes, dtype=float)
    return 2 * (n - 1) * alpha + 2 * (n - 1) / n * np.asarray(nbytes, dtype=float) / bw


def fit_ring(bench):
    """Weighted least squares for alpha (s) and bw (bytes/s) over one bench file's sizes."""
    n, b, t = bench["ranks"], bench["bytes"], bench["time_s"]
    x_alpha, x_inv_bw = np.full_like(b, 2.0 * (n - 1)), 2.0 * (n - 1) / n * b
    a = np.column_stack([x_alpha / t, x_inv_bw / t])  # rows divided by t: the relative error is linear
    (alpha, inv_bw), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    if alpha < 0:  # latency not resolvable (e.g. only large sizes): refit the bandwidth term alone
        alpha, col = 0.0, x_inv_bw / t
        inv_bw = col.sum() / (col * col).sum()
    if inv_bw <= 0:
        raise InputError(f"{bench['file']}: the fit gives no positive bandwidth (all sizes latency-bound?)")
    rel = np.abs(ring_time(b, n, alpha, 1.0 / inv_bw) - t) / t
    return {"file": bench["file"], "ranks": n, "backend": bench["backend"], "sizes": int(len(set(b.tolist()))),
            "alpha_s": float(alpha), "bw_Bps": float(1.0 / inv_bw), "median_rel_err": float(np.median(rel))}


@dataclass
class Links:
    nvlink_bw: float = 370e9   # bytes/s, ring bus bandwidth inside a node
    nvlink_alpha: float = 5e-6
    ib_bw: float = 48e9        # bytes/s per GPU's own NIC rail
    ib_alpha: float = 10e-6
    gpus_per_node: int = 8


def nodes_for(gpus, links):
    if gpus <= links.gpus_per_node:
        return 1
    if gpus % links.gpus_per_node:
        raise InputError(f"{gpus} GPUs is not a whole number of {links.gpus_per_node}-GPU nodes")
    return gpus // links.gpus_per_node


def hierarchical_time(nbytes, gpus, links):
    """Seconds for one hierarchical all-reduce of nbytes over gpus GPUs (see the module docstring)."""
    p, nodes = links.gpus_per_node, nodes_for(gpus, links)
    if nodes == 1:
        return ring_time(nbytes, gpus, links.nvlink_alpha, links.nvlink_bw)
    # Reduce-scatter + all-gather inside the node cost exactly a flat ring over p ranks.
    intra = ring_time(nbytes, p, links.nvlink_alpha, links.nvlink_bw)
    inter = ring_time(np.asarray(nbytes, dtype=float) / p, nodes, links.ib_alpha, links.ib_bw)
    return intra + inter


# ---------------------------------------------------------------- step model

def ready_times(buckets, window):
    """Each bucket's ready time; proportional to cumulative bytes over the window where unmeasured."""
    if all(b.ready is not None for b in buckets):
        return [float(b.ready) for b in buckets]
    total = sum(b.nbytes for b in buckets) or 1.0
    return list(window * np.cumsum([b.nbytes for b in buckets]) / total)


def scale_compute(compute, buckets, factor, data_wait=None):
    """Compute and ready times scaled by factor (data_wait kept unless given)."""
    c = replace(compute, forward=compute.forward * factor, backward=compute.backward * factor,
                optimizer=compute.optimizer * factor,
                data_wait=compute.data_wait if data_wait is None else data_wait)
    return c, [Bucket(b.nbytes, None if b.ready is None else b.ready * factor) for b in buckets]


def simulate_step(compute, buckets, comm_time):
    """Predicted step with and without overlap; comm_time(nbytes) gives one all-reduce's seconds."""
    end = total = 0.0
    for b, r in zip(buckets, ready_times(buckets, compute.window)):
        t = float(comm_time(b.nbytes))
        end = max(r, end) + t
        total += t
    exposed = max(0.0, end - compute.window) if buckets else 0.0
    single = compute.single
    return {"single_s": single, "step_overlap_s": single + exposed, "step_no_overlap_s": single + total,
            "exposed_comm_s": exposed, "comm_total_s": total,
            "eff_overlap": single / (single + exposed), "eff_no_overlap": single / (single + total)}


# ---------------------------------------------------------------- clusters others published (no run file)
#
# predict --arch (or --sizes) describes a setting with no ringtrain run behind it: a network's gradient tensors
# (docs/scaling/arch.json, scripts/scaling_arch.py), a published single-GPU step, a cluster and a framework. The
# same physics is in ringtrain_plan (runtime/layout/link_model.cpp); tests/scripts/test_scaling_model.py holds
# both to the same figures. Every term is in docs/SCALING.md ("What the model includes"), each with where its
# value comes from; a term set to 0 gives the prediction without it.

ALGORITHMS = ("ring", "nccl-ring", "hierarchical", "tree", "halving-doubling")
ARCH_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "scaling", "arch.json")


@dataclass
class Cluster:
    gpus_per_node: int = 8
    intra_gbps: float = 370.0   # bus bandwidth of a ring inside a node (GB/s): what nccl-tests calls busbw
    intra_alpha_us: float = 5.0  # latency of one step of that ring
    nics_per_node: int = 8
    nic_gbit: float = 400.0      # line rate of one NIC (Gbit/s)
    line_rate: float = 0.9       # the share of the line rate the transport reaches (RDMA ~0.9, TCP less)
    inter_alpha_us: float = 10.0  # latency of one hop between nodes
    # "ring": step-synchronous ring over every rank, each step as slow as its slowest hop (ringtrain's own ring);
    # "nccl-ring": NCCL's pipelined ring, rings over all of a node's NICs, the hops' latencies added once a lap;
    # "hierarchical": ring inside the node, then each GPU's slice across the nodes through the node's NICs;
    # "tree": NCCL's double binary tree across nodes, a chain inside; "halving-doubling": recursive halving and
    # doubling over every rank, each GPU's traffic between nodes through its node's NICs at once;
    # "nccl-X.Y": what NCCL X.Y chooses (rings only before 2.4; from 2.4 the faster of ring and tree).
    algorithm: str = "hierarchical"
    contention: float = 0.0      # share of a GPU's compute lost while a collective's kernels move data on it

    @property
    def net_Bps(self):  # bytes per second in each direction through one node's NICs, all of them
        return self.nics_per_node * self.nic_gbit * 1e9 / 8 * self.line_rate

    def nodes(self, gpus):
        return nodes_for(gpus, self)


def nccl_choice(version):
    """The all-reduce algorithm NCCL `version` ("2.3", "2.18") picks: "nccl-ring" before 2.4 (trees came in 2.4),
    else None (the faster of ring and tree per message, as NCCL's tuner does)."""
    m = re.fullmatch(r"(\d+)\.(\d+)(?:\.\d+)?", version)
    if not m:
        raise InputError(f"algorithm 'nccl-{version}': expected nccl-MAJOR.MINOR, e.g. nccl-2.4")
    return "nccl-ring" if (int(m.group(1)), int(m.group(2))) < (2, 4) else None


def collective_seconds(nbytes, gpus, cluster, algorithm=None):
    """(seconds of one all-reduce of nbytes over gpus GPUs, seconds of it the GPU's kernels are busy moving data)."""
    algorithm = algorithm or cluster.algorithm
    if gpus <= 1 or nbytes <= 0:
        return 0.0, 0.0
    if algorithm.startswith("nccl-") and algorithm != "nccl-ring":
        chosen = nccl_choice(algorithm[len("nccl-"):])
        if chosen:
            return collective_seconds(nbytes, gpus, cluster, chosen)
        options = [collective_seconds(nbytes, gpus, cluster, a) for a in ("nccl-ring", "tree")]
        return min(options)
    if algorithm not in ALGORITHMS:
        raise InputError(f"unknown all-reduce algorithm '{algorithm}' (one of {', '.join(ALGORITHMS)}, nccl-X.Y)")
    p, n, b = cluster.gpus_per_node, cluster.nodes(gpus), float(nbytes)
    ai, ae = cluster.intra_alpha_us * 1e-6, cluster.inter_alpha_us * 1e-6
    bi, bn = cluster.intra_gbps * 1e9, cluster.net_Bps
    if n == 1:  # one node: every algorithm is the node's ring (halving-doubling: log2 steps)
        steps = math.ceil(math.log2(gpus)) if algorithm == "halving-doubling" else gpus - 1
        t = 2 * steps * ai + ring_time(b, gpus, 0.0, bi)
        return t, t
    slow = min(bi, bn)
    if algorithm == "ring":
        t = ring_time(b, gpus, max(ai, ae), slow)
    elif algorithm == "nccl-ring":  # a step's latency: the hops' mean, n of them between nodes a lap
        t = ring_time(b, gpus, (n * ae + (gpus - n) * ai) / gpus, slow)
    elif algorithm == "hierarchical":
        t = ring_time(b, p, ai, bi) + 2 * (n - 1) * (ae + b / n / bn)
    elif algorithm == "tree":
        t = 2 * (math.ceil(math.log2(n)) * ae + (p - 1) * ai) + 2 * b / slow
    else:  # halving-doubling over all ranks: the far steps cross nodes, all p GPUs through the node's NICs
        t = 2 * (math.ceil(math.log2(gpus)) * max(ai, ae) + b * (1 - 1 / n) * p / bn + b / n * (1 - 1 / p) / bi)
    # The GPU's kernels move the collective's data at the pace of its slowest link: busy all along when that is the
    # node's own links, a share of the time when the network is slower (they wait for it the rest).
    return t, t * min(1.0, bn / bi)


def planner_cases():
    """All-reduce seconds over a grid of links, sizes and layouts, as ringtrain_plan's link model must give them
    (runtime/layout/link_model.h: a LinkModel of alpha/bw inside and between hosts, backends ring and
    hierarchical); tests/runtime/link_model_cases.json holds them for the C++ test, and the Python test checks this
    function still gives that file."""
    cases = []
    links = [(5e-6, 4e9, 30e-6, 1.25e8), (2e-6, 370e9, 8e-6, 45e9), (1e-5, 1e9, 1e-4, 1e8), (1e-6, 5e9, 2e-6, 2e10)]
    for alpha_intra, bw_intra, alpha_inter, bw_inter in links:
        for backend in ("ring", "hierarchical"):
            for n, per_host in ((2, 2), (8, 8), (4, 2), (8, 4), (16, 8), (64, 8), (6, 3), (8, 1)):
                for nbytes in (4096, 1 << 20, 25 << 20, 400 << 20):
                    cluster = Cluster(per_host, bw_intra / 1e9, alpha_intra * 1e6, 1, bw_inter * 8 / 1e9, 1.0,
                                      alpha_inter * 1e6, "ring" if per_host == 1 else backend)
                    seconds, _ = collective_seconds(nbytes, n, cluster)
                    cases.append({"alpha_intra_s": alpha_intra, "bw_intra_bytes_per_s": bw_intra,
                                  "alpha_inter_s": alpha_inter, "bw_inter_bytes_per_s": bw_inter,
                                  "backend": backend, "bytes": nbytes, "ranks": n, "per_host": per_host,
                                  "seconds": seconds})
    return cases


@dataclass
class Framework:
    bucket_mb: float = 25.0       # buckets filled in backward order up to this many MiB (DDP's bucket_cap_mb)
    grad_bytes: int = 4           # bytes of one gradient element on the wire
    tensor_cost_us: float = 0.0   # per gradient tensor per step on the critical path (hooks, copies into buckets)
    bucket_cost_us: float = 0.0   # per bucket per step on the critical path (marking it ready, launching its
                                  # collective); on one GPU too, where the framework runs without peers
    start_delay_us: float = 0.0   # before each collective may start (Horovod: half its cycle, on average)
    baseline: str = "single"      # efficiency against: "single" (no data parallelism), "framework-1gpu"


def load_arch(name, path=None):
    """Gradient tensors [(bytes per element 1, ready_flops, ready_bytes)] of `name` from arch.json, or of a file
    of sizes (one tensor's element count a line, backward order; ready times then from bytes)."""
    if path is not None:
        try:
            with open(path) as f:
                lines = [l.split("#")[0].strip() for l in f]
        except OSError as e:
            raise InputError(f"{path}: cannot read ({e.strerror})") from None
        sizes = []
        for i, l in enumerate(lines, 1):
            if not l:
                continue
            if not l.isdigit() or int(l) <= 0:
                raise InputError(f"{path}:{i}: expected a tensor's element count (a positive integer), got '{l}'")
            sizes.append(int(l))
        if not sizes:
            raise InputError(f"{path}: no tensor sizes")
        total, done, out = sum(sizes), 0, []
        for s in sizes:
            done += s
            out.append({"numel": s, "ready_flops": None, "ready_bytes": done / total})
        return out
    doc = _read_json(ARCH_FILE)
    archs = doc.get("archs", {})
    if name not in archs:
        raise InputError(f"unknown --arch '{name}' (known: {', '.join(sorted(archs))}; or --sizes FILE)")
    return archs[name]["tensors"]


def fill_buckets(tensors, framework, ready="flops"):
    """Buckets in launch order: tensors in backward order, a bucket closed when the next tensor would take it over
    bucket_mb MiB; each bucket ready when its last tensor is, as a share of the backward."""
    cap = framework.bucket_mb * 2 ** 20
    key = "ready_flops" if ready == "flops" else "ready_bytes"
    out, cur, last = [], 0.0, 0.0
    for t in tensors:
        b = t["numel"] * framework.grad_bytes
        if cur and cur + b > cap:
            out.append(Bucket(cur, last))
            cur = 0.0
        cur += b
        last = t[key] if t.get(key) is not None else t["ready_bytes"]
    if cur:
        out.append(Bucket(cur, last))
    return out


def simulate_gpu_step(step_s, backward_share, buckets, gpus, cluster, framework, n_tensors):
    """One step of `gpus` data-parallel GPUs: the single-GPU step, the framework's costs, the collectives (one at a
    time in launch order, each from its bucket's ready time), the exposed rest, and the compute the overlapped
    collectives take from the GPU (cluster.contention of their time on the GPU's own links)."""
    window = step_s * backward_share
    busy = []  # each collective's seconds on the GPU's own links, as simulate_step asks for it

    def comm_time(nbytes):
        t, g = collective_seconds(nbytes, gpus, cluster)
        busy.append(g)
        return t + (framework.start_delay_us * 1e-6 if gpus > 1 else 0.0)

    compute = Compute(data_wait=0.0, forward=step_s - window, backward=window, optimizer=0.0)
    chain = simulate_step(compute, [Bucket(b.nbytes, b.ready * window) for b in buckets], comm_time)
    exposed, total = chain["exposed_comm_s"], chain["comm_total_s"]
    contention = cluster.contention * sum(busy) * ((total - exposed) / total) if total > 0 else 0.0
    fixed = (framework.tensor_cost_us * n_tensors + framework.bucket_cost_us * len(buckets)) * 1e-6
    step = step_s + fixed + exposed + contention
    base = step_s + (fixed if framework.baseline == "framework-1gpu" else 0.0)
    return {"step_s": step, "efficiency": base / step, "exposed_s": exposed, "comm_total_s": total,
            "contention_s": contention, "fixed_s": fixed}


# ---------------------------------------------------------------- output

def format_table(headers, rows, markdown):
    cells = [[str(c) for c in r] for r in rows]
    if markdown:
        return "\n".join(["| " + " | ".join(headers) + " |", "|" + "|".join("---:" for _ in headers) + "|"]
                         + ["| " + " | ".join(r) + " |" for r in cells])
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in [headers] + cells)


def note(text, markdown):
    print(("- " if markdown else "# ") + text)


def write_json(path, doc):
    try:
        with open(path, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
    except OSError as e:
        raise InputError(f"{path}: cannot write ({e.strerror})") from None


# ---------------------------------------------------------------- subcommands

def cmd_fit(args):
    fit = fit_ring(load_bench(args.bench, args.backend))
    print(f"{fit['file']}: {fit['ranks']} ranks, backend {fit['backend']}, {fit['sizes']} sizes")
    print(f"alpha = {fit['alpha_s'] * 1e6:.2f} us   bw = {fit['bw_Bps'] / 1e9:.3f} GB/s   "
          f"median relative error = {100 * fit['median_rel_err']:.1f}%")
    if args.json:
        write_json(args.json, {"file": fit["file"], "ranks": fit["ranks"], "backend": fit["backend"],
                               "sizes": fit["sizes"], "alpha_us": fit["alpha_s"] * 1e6,
                               "bw_gbps": fit["bw_Bps"] / 1e9, "median_rel_err": fit["median_rel_err"]})


def cmd_predict_arch(args):
    tensors = load_arch(args.arch, args.sizes)
    name = args.arch or args.sizes
    cluster = Cluster(args.gpus_per_node, args.nvlink_gbps, args.nvlink_alpha_us, args.nics_per_node, args.nic_gbit,
                      args.line_rate, args.ib_alpha_us, args.algorithm, args.contention)
    framework = Framework(args.bucket_mb, args.grad_bytes, args.tensor_cost_us, args.bucket_cost_us,
                          args.start_delay_us, args.baseline)
    if args.algorithm.startswith("nccl-") and args.algorithm != "nccl-ring":
        nccl_choice(args.algorithm[len("nccl-"):])
    elif args.algorithm not in ALGORITHMS:
        raise InputError(f"--algorithm '{args.algorithm}': one of {', '.join(ALGORITHMS)}, or nccl-X.Y")
    buckets = fill_buckets(tensors, framework, args.ready)
    rows = []
    for g in args.gpus:
        r = simulate_gpu_step(args.step_s, args.backward_share, buckets, g, cluster, framework, len(tensors))
        rows.append({"gpus": g, "nodes": cluster.nodes(g), **r})
    md = args.markdown
    note(f"{name}: {len(tensors)} gradient tensors, {sum(t['numel'] for t in tensors) * args.grad_bytes / 2**20:.1f} "
         f"MiB at {args.grad_bytes} bytes, {len(buckets)} buckets of up to {args.bucket_mb:g} MiB, ready times from "
         f"{args.ready}; single-GPU step {args.step_s:g} s, backward {100 * args.backward_share:.0f}% of it", md)
    note(f"cluster: {cluster.gpus_per_node} GPUs/node, inside {cluster.intra_gbps:g} GB/s busbw and "
         f"{cluster.intra_alpha_us:g} us a step; {cluster.nics_per_node} x {cluster.nic_gbit:g} Gbit/s NICs a node at "
         f"{100 * cluster.line_rate:.0f}% of line rate ({cluster.net_Bps / 1e9:.1f} GB/s), "
         f"{cluster.inter_alpha_us:g} us a hop; {cluster.algorithm}; contention {cluster.contention:g}", md)
    note(f"framework: {framework.tensor_cost_us:g} us a tensor, {framework.bucket_cost_us:g} us a bucket, "
         f"{framework.start_delay_us:g} us before each collective; efficiency against "
         f"{'no data parallelism' if framework.baseline == 'single' else 'the framework on one GPU'}", md)
    headers = ["gpus", "nodes", "step_s", "efficiency", "exposed_ms", "contention_ms", "fixed_ms", "allreduce_total_ms"]
    cells = [[r["gpus"], r["nodes"], f"{r['step_s']:.4f}", f"{100 * r['efficiency']:.1f}%",
              f"{1e3 * r['exposed_s']:.1f}", f"{1e3 * r['contention_s']:.1f}", f"{1e3 * r['fixed_s']:.1f}",
              f"{1e3 * r['comm_total_s']:.1f}"] for r in rows]
    print(format_table(headers, cells, md))
    if args.json:
        write_json(args.json, {"arch": name, "cluster": vars(cluster), "framework": vars(framework),
                               "step_s": args.step_s, "backward_share": args.backward_share, "rows": rows})


def cmd_predict(args):
    if args.run is None:
        return cmd_predict_arch(args)
    run = load_run(args.run, args.run_index)
    if not run["buckets"]:
        raise InputError(f"{args.run}: no buckets in the plan or summary")
    c0 = run["compute"]
    base = c0.forward + c0.backward + c0.optimizer
    factor = args.compute_scale if args.compute_step_s is None else args.compute_step_s / base
    if args.optimizer_s is not None:
        # A GPU's fused optimizer is a far smaller share of the step than a CPU run's: fix it, and rescale
        # forward and backward (and the ready times) so that the three still add up to the step asked for.
        target = base * factor
        if not 0 <= args.optimizer_s < target:
            raise InputError(f"--optimizer-s {args.optimizer_s:g} must be below the compute per step ({target:g} s)")
        factor = (target - args.optimizer_s) / (c0.forward + c0.backward)
        c0 = replace(c0, optimizer=args.optimizer_s / factor)
    compute, buckets = scale_compute(c0, run["buckets"], factor, args.data_wait_s)
    buckets = [replace(b, nbytes=b.nbytes * args.bytes_scale) for b in buckets]
    links = Links(args.nvlink_gbps * 1e9, args.nvlink_alpha_us * 1e-6, args.ib_gbps * 1e9,
                  args.ib_alpha_us * 1e-6, args.gpus_per_node)
    rows = []
    for g in args.gpus:
        r = simulate_step(compute, buckets, lambda nb, g=g: hierarchical_time(nb, g, links))
        rows.append({"gpus": g, "nodes": nodes_for(g, links), **r})
    plan, md = run["plan"], args.markdown
    note(f"run {args.run}: {plan.get('arch', '?')}, {run['world_size']} ranks, "
         f"batch {plan.get('batch_size', '?')}/rank, {len(buckets)} buckets, "
         f"{sum(b.nbytes for b in buckets) / 2**20:.2f} MiB of gradients per step", md)
    note(f"compute per step (x{factor:.4g}): data_wait {compute.data_wait:.4f} + forward {compute.forward:.4f} + "
         f"backward {compute.backward:.4f} + optimizer {compute.optimizer:.4f} = {compute.single:.4f} s", md)
    note(f"links: NVLink {args.nvlink_gbps:g} GB/s busbw, alpha {args.nvlink_alpha_us:g} us, "
         f"{links.gpus_per_node} GPUs/node; InfiniBand {args.ib_gbps:g} GB/s per GPU rail, "
         f"alpha {args.ib_alpha_us:g} us; hierarchical ring", md)
    headers = ["gpus", "nodes", "step_s (overlap)", "eff (overlap)", "step_s (no overlap)", "eff (no overlap)",
               "exposed_comm_s", "allreduce_total_s"]
    cells = [[r["gpus"], r["nodes"], f"{r['step_overlap_s']:.4f}", f"{100 * r['eff_overlap']:.1f}%",
              f"{r['step_no_overlap_s']:.4f}", f"{100 * r['eff_no_overlap']:.1f}%",
              f"{r['exposed_comm_s']:.4f}", f"{r['comm_total_s']:.4f}"] for r in rows]
    print(format_table(headers, cells, md))
    if args.json:
        write_json(args.json, {"run": args.run, "compute_scale": factor, "bytes_scale": args.bytes_scale,
                               "links": vars(links), "compute": vars(compute), "rows": rows})


def _numbered_files(directory, pattern):
    if not directory:
        return {}
    if not os.path.isdir(directory):
        raise InputError(f"{directory}: not a directory")
    found = {}
    for name in os.listdir(directory):
        m = re.fullmatch(pattern, name)
        if m:
            found[int(m.group(1))] = os.path.join(directory, name)
    return found


def selfcheck(benches, runs, run_index=-1, backend=None):
    """Rows comparing measured and predicted step time per world size n >= 2 present in both maps."""
    sizes = sorted(n for n in benches if n >= 2 and n in runs)
    if not sizes:
        raise InputError(f"no world size >= 2 with both a bench ({sorted(benches) or 'none'}) "
                         f"and a run ({sorted(runs) or 'none'})")
    one = load_run(runs[1], run_index) if 1 in runs else None
    rows = []
    for n in sizes:
        fit, run = fit_ring(load_bench(benches[n], backend)), load_run(runs[n], run_index)
        if fit["ranks"] != n or run["world_size"] != n:
            raise InputError(f"{benches[n]} has {fit['ranks']} ranks and {runs[n]} world_size "
                             f"{run['world_size']}, expected {n}")
        if not run["buckets"]:
            raise InputError(f"{runs[n]}: no buckets in the plan or summary")
        comm = lambda nb, n=n, fit=fit: ring_time(nb, n, fit["alpha_s"], fit["bw_Bps"])
        # The step goes at the slowest rank's pace: its compute, its bucket ready times (rank 0's, stretched).
        c0, cs = run["compute"], run["slowest"]
        stretch = cs.window / c0.window if c0.window > 0 else 1.0
        buckets = [Bucket(b.nbytes, None if b.ready is None else b.ready * stretch) for b in run["buckets"]]
        own = simulate_step(cs, buckets, comm)
        measured = run["mean_step_s"]
        row = {"ranks": n, "alpha_us": fit["alpha_s"] * 1e6, "bw_gbps": fit["bw_Bps"] / 1e9,
               "fit_median_rel_err": fit["median_rel_err"], "measured_step_s": measured,
               "measured_median_step_s": run["median_step_s"], "predicted_step_s": own["step_overlap_s"],
               "error_pct": 100 * (own["step_overlap_s"] / measured - 1),
               "rank_skew_s": (cs.single - cs.optimizer) - (c0.single - c0.optimizer),
               "measured_exposed_comm_s": run["exposed_comm_s"], "predicted_exposed_comm_s": own["exposed_comm_s"],
               "predicted_step_1rank_compute_s": None, "error_1rank_compute_pct": None}
        if one is not None:
            c1, cn = one["compute"], run["compute"]
            factor = c1.window / cn.window if cn.window > 0 else 1.0  # ready times follow the backward
            buckets = [Bucket(b.nbytes, None if b.ready is None else b.ready * factor) for b in run["buckets"]]
            p1 = simulate_step(c1, buckets, comm)["step_overlap_s"]
            row["predicted_step_1rank_compute_s"] = p1
            row["error_1rank_compute_pct"] = 100 * (p1 / measured - 1)
        rows.append(row)
    return rows


def cmd_selfcheck(args):
    benches = _numbered_files(args.bench_dir, r"allreduce_np(\d+)\.json")
    runs = _numbered_files(args.runs_dir, r"train_np(\d+)\.jsonl")
    benches.update(dict(args.bench or []))
    runs.update(dict(args.run or []))
    rows = selfcheck(benches, runs, args.run_index, args.backend)
    md = args.markdown
    note("measured: rank 0's mean step (its phases summed); predicted: flat ring fitted to each n's allreduce_bench "
         "with the run's slowest rank's compute and bucket ready times (overlap); skew: how much longer the slowest "
         "rank computed than rank 0 (rank 0 waits that long in exposed comm); '1-rank compute' uses the 1-rank "
         "run's compute instead", md)
    fmt = lambda v, spec, unit="": "-" if v is None else format(v, spec) + unit
    headers = ["ranks", "alpha_us", "bw_GB/s", "fit_err", "measured_s", "predicted_s", "error", "skew_s",
               "pred_1rank_compute_s", "error_1rank", "exposed_meas_s", "exposed_pred_s"]
    cells = [[r["ranks"], f"{r['alpha_us']:.1f}", f"{r['bw_gbps']:.3f}", f"{100 * r['fit_median_rel_err']:.1f}%",
              f"{r['measured_step_s']:.4f}", f"{r['predicted_step_s']:.4f}", f"{r['error_pct']:+.1f}%",
              f"{r['rank_skew_s']:.4f}",
              fmt(r["predicted_step_1rank_compute_s"], ".4f"), fmt(r["error_1rank_compute_pct"], "+.1f", "%"),
              f"{r['measured_exposed_comm_s']:.4f}", f"{r['predicted_exposed_comm_s']:.4f}"] for r in rows]
    print(format_table(headers, cells, md))
    if args.json:
        write_json(args.json, {"benches": {str(k): v for k, v in sorted(benches.items())},
                               "runs": {str(k): v for k, v in sorted(runs.items())}, "rows": rows})


# ---------------------------------------------------------------- command line

def _gpu_list(text):
    try:
        gpus = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of integers, got '{text}'") from None
    if not gpus or min(gpus) < 1:
        raise argparse.ArgumentTypeError(f"expected positive GPU counts, got '{text}'")
    return gpus


def _n_file(text):
    n, sep, path = text.partition("=")
    if not sep or not n.isdigit() or not path:
        raise argparse.ArgumentTypeError(f"expected N=FILE, got '{text}'")
    return int(n), path


def _positive(text):
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got '{text}'") from None
    if not (math.isfinite(v) and v > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return v


def _non_negative(text):
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got '{text}'") from None
    if not (math.isfinite(v) and v >= 0):
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return v


def _unit(text):
    v = _non_negative(text)
    if v > 1:
        raise argparse.ArgumentTypeError(f"must be from 0 to 1, got {text}")
    return v


def _share(text):
    v = _unit(text)
    if v == 0:
        raise argparse.ArgumentTypeError(f"must be above 0 and at most 1, got {text}")
    return v


def build_parser():
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)

    f = sub.add_parser("fit", help="fit alpha and bw from allreduce_bench --json output")
    f.add_argument("bench", help="allreduce_bench --json file")
    f.add_argument("--backend", help="backend to fit (default: ring, or the file's only backend)")
    f.add_argument("--json", help="write the fit here")
    f.set_defaults(func=cmd_fit)

    pr = sub.add_parser("predict", help="predict step time and efficiency at many GPUs")
    what = pr.add_mutually_exclusive_group(required=True)
    what.add_argument("--run", help="train_resnet --log-jsonl file: its buckets, ready times and compute")
    what.add_argument("--arch", help="a network of docs/scaling/arch.json (resnet50, vgg16, inception_v3, ...), "
                                     "with --step-s: no run needed")
    what.add_argument("--sizes", help="a file of gradient tensor sizes (elements, one a line, backward order)")
    pr.add_argument("--run-index", type=int, default=-1, help="which complete run in the file (default: last)")
    pr.add_argument("--gpus", type=_gpu_list, default=[2 ** k for k in range(3, 11)], help="default 8,16,...,1024")
    pr.add_argument("--nvlink-gbps", type=_positive, default=370.0, help="NVLink ring busbw inside a node")
    pr.add_argument("--nvlink-alpha-us", type=float, default=5.0, help="latency per NVLink ring step")
    pr.add_argument("--ib-gbps", type=_positive, default=48.0, help="InfiniBand bandwidth per GPU's NIC")
    pr.add_argument("--ib-alpha-us", type=float, default=10.0, help="latency per inter-node ring step")
    pr.add_argument("--gpus-per-node", type=int, default=8)
    scale = pr.add_mutually_exclusive_group()
    scale.add_argument("--compute-scale", type=_positive, default=1.0, help="multiply the run's compute by X")
    scale.add_argument("--compute-step-s", type=_positive, help="forward+backward+optimizer seconds per step")
    pr.add_argument("--data-wait-s", type=float, help="data wait per step (default: the run's)")
    pr.add_argument("--optimizer-s", type=float,
                    help="optimizer seconds per step, kept out of the rescaling (e.g. a GPU's fused update)")
    pr.add_argument("--bytes-scale", type=_positive, default=1.0, help="multiply bucket bytes (0.5: bf16 grads)")
    a = pr.add_argument_group("with --arch or --sizes (a setting others published; docs/SCALING.md)")
    a.add_argument("--step-s", type=_positive, help="the single-GPU step without data parallelism (seconds)")
    a.add_argument("--backward-share", type=_share, default=2 / 3, help="the backward's share of that step")
    a.add_argument("--ready", choices=("flops", "bytes"), default="flops",
                   help="when gradients are ready: by the layers' FLOPs (default) or by bytes")
    a.add_argument("--grad-bytes", type=int, choices=(1, 2, 4, 8), default=4, help="bytes of a gradient element")
    a.add_argument("--bucket-mb", type=_positive, default=25.0, help="bucket size in MiB (DDP's bucket_cap_mb)")
    a.add_argument("--nics-per-node", type=int, default=8)
    a.add_argument("--nic-gbit", type=_positive, default=400.0, help="line rate of one NIC, Gbit/s")
    a.add_argument("--line-rate", type=_share, default=0.9, help="the share of the line rate reached")
    a.add_argument("--algorithm", default="hierarchical",
                   help=f"all-reduce: {', '.join(ALGORITHMS)}, or nccl-X.Y (what that NCCL chooses)")
    a.add_argument("--contention", type=_unit, default=0.0,
                   help="share of compute lost while a collective's kernels move data (0: none)")
    a.add_argument("--tensor-cost-us", type=_non_negative, default=0.0, help="framework cost per gradient tensor")
    a.add_argument("--bucket-cost-us", type=_non_negative, default=0.0, help="framework cost per bucket")
    a.add_argument("--start-delay-us", type=_non_negative, default=0.0, help="wait before each collective starts")
    a.add_argument("--baseline", choices=("single", "framework-1gpu"), default="single",
                   help="efficiency against no data parallelism, or the framework on one GPU")
    pr.add_argument("--markdown", action="store_true")
    pr.add_argument("--json", help="write the predictions here")
    pr.set_defaults(func=cmd_predict)

    s = sub.add_parser("selfcheck", help="predicted vs measured step time at the world sizes run here")
    s.add_argument("--bench-dir", help="folder with allreduce_np{n}.json")
    s.add_argument("--runs-dir", help="folder with train_np{n}.jsonl")
    s.add_argument("--bench", type=_n_file, action="append", metavar="N=FILE")
    s.add_argument("--run", type=_n_file, action="append", metavar="N=FILE")
    s.add_argument("--backend", help="bench backend to fit (default: ring, or each file's only backend)")
    s.add_argument("--run-index", type=int, default=-1, help="which complete run in each file (default: last)")
    s.add_argument("--markdown", action="store_true")
    s.add_argument("--json", help="write the rows here")
    s.set_defaults(func=cmd_selfcheck)
    return p


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "predict" and args.gpus_per_node < 1:
        parser.error("--gpus-per-node must be >= 1")
    if args.command == "predict" and args.run is None and args.step_s is None:
        parser.error("--arch and --sizes need --step-s (the published single-GPU step, seconds)")
    if args.command == "predict" and args.nics_per_node < 1:
        parser.error("--nics-per-node must be >= 1")
    if args.command == "selfcheck" and not ((args.bench_dir or args.bench) and (args.runs_dir or args.run)):
        parser.error("selfcheck needs --bench-dir or --bench N=FILE, and --runs-dir or --run N=FILE")
    try:
        args.func(args)
    except InputError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
