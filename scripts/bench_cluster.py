#!/usr/bin/python3
"""Multi-node benchmarks on the emulated cluster (scripts/cluster.sh): all-reduce bandwidth over shaped links,
weak scaling against the unsynchronised ceiling, PyTorch's gloo beside ringtrain in the same run, and the
scaling model's step prediction checked against the multi-node runs. Needs root (network namespaces).

  scripts/bench_cluster.py [--out bench-cluster] [--rates 1gbit,5gbit,10gbit] [--step-rate 1gbit]
                           [--repeats 3] [--max-bytes 64M] [--parts allreduce,weak,model]

allreduce  for every rate: 2 nodes x 1 rank and 2 nodes x 2 ranks; allreduce_bench (ring, hierarchical on 2x2,
           MPI_Allreduce) and gloo (scripts/peers/torch_gloo_peer.py), 1 MiB ... --max-bytes, the median of
           --repeats sweeps per size. busbw = algbw * 2(n-1)/n; on 2x1 it is what each link carries, so it
           cannot exceed the shaped rate.
weak       at --step-rate: bench_step ResNet-110 (32x32, batch 32 per rank, 1 thread, 1 MiB buckets) on 1
           rank (--batch), on 2x1 (ring) and 2x2 (hierarchical), each against the same ranks unsynchronised
           (--backend none: the machine's own slowdown); PyTorch DDP (gloo) the same way. Medians of
           --repeats runs, interleaved.
model      at --step-rate: train_resnet runs (same model and flags, JSONL logs) on 1 rank, 2x1 and 2x2, and
           scripts/scaling_model.py selfcheck with alpha/beta fitted from that rate's allreduce_bench files.
Writes OUT/summary.md (the tables) and every raw output under OUT/.
"""
import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLUSTER = os.path.join(ROOT, "scripts", "cluster.sh")
BUILD = os.path.join(ROOT, os.environ.get("BUILD_DIR", "build"))
SYSPY = "/usr/bin/python3"
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")


def sh(cmd, timeout, log=None, check=True):
    """Runs cmd (a list); returns its stdout+stderr. A run past `timeout` or failing (with check) raises."""
    t0 = time.time()
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout, env=ENV)
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"timed out after {timeout} s: {shlex.join(cmd)}\n{(e.output or '')[-2000:]}") from None
    if log:
        with open(log, "a") as f:
            f.write(f"$ {shlex.join(cmd)}   # {time.time() - t0:.1f} s, exit {p.returncode}\n{p.stdout}\n")
    if check and p.returncode != 0:
        raise RuntimeError(f"exit {p.returncode}: {shlex.join(cmd)}\n{p.stdout[-3000:]}")
    return p.stdout


def up(rate):
    sh([CLUSTER, "down"], 120)
    sh([CLUSTER, "up", "2", "--slots", "2", "--rate", rate], 120)


def run(mpi_args, prog, timeout=600, log=None):
    return sh([CLUSTER, "run", *mpi_args, "--", *prog], timeout, log)


def layout_args(layout):
    return ["-np", "2", "--map-by", "node"] if layout == "2x1" else ["-np", "4"]


def rate_gbytes(rate):
    m = re.fullmatch(r"([0-9.]+)([kmgt]?)bit", rate)
    return float(m[1]) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[m[2]] / 8 / 1e9


def median_rows(files):
    """{(backend, bytes): median busbw and time over the sweeps} from allreduce_bench-format JSON files."""
    acc = {}
    for path in files:
        for r in json.load(open(path))["results"]:
            acc.setdefault((r["backend"], r["bytes"]), []).append(r)
    out = {}
    for key, rows in acc.items():
        t = statistics.median(r["time_us"] for r in rows)
        bus = statistics.median(r["busbw_gbps"] for r in rows)
        out[key] = {"time_us": t, "busbw": bus, "wrong": max((r.get("wrong") or 0) for r in rows)}
    return out


def merged_json(files, path):
    """One allreduce_bench-format file of the medians (what scaling_model.py fit reads)."""
    first = json.load(open(files[0]))
    rows = [{"backend": b, "bytes": n, "count": n // 4, "type": "f32", "time_us": v["time_us"],
             "busbw_gbps": v["busbw"], "wrong": v["wrong"]} for (b, n), v in sorted(median_rows(files).items())]
    json.dump({"ranks": first["ranks"], "results": rows}, open(path, "w"), indent=2)


def part_allreduce(a, md):
    md.append("## All-reduce over shaped links (busbw GB/s, median of %d sweeps)\n" % a.repeats)
    for rate in a.rates:
        up(rate)
        link = rate_gbytes(rate)
        for layout in ("2x1", "2x2"):
            ours = "ring,mpi" if layout == "2x1" else "hierarchical,ring,mpi"
            files = []
            for rep in range(a.repeats):
                base = os.path.join(a.out, f"ar_{rate}_{layout}_r{rep}")
                run(layout_args(layout), [os.path.join(BUILD, "allreduce_bench"), "--backend", ours, "-b", "1M", "-e",
                                          a.max_bytes, "-f", "4", "-n", "5", "-w", "1", "--check",
                                          "--json", base + ".json"], log=base + ".log")
                run(layout_args(layout) + ["-x", "GLOO_SOCKET_IFNAME=eth0"],
                    [SYSPY, os.path.join(ROOT, "scripts", "peers", "torch_gloo_peer.py"), "allreduce", "1048576",
                     str(parse_bytes(a.max_bytes)), "4", "5", "--json", base + "_gloo.json"], log=base + ".log")
                files += [base + ".json", base + "_gloo.json"]
            ours_files = [f for f in files if not f.endswith("_gloo.json")]
            merged_json(ours_files, os.path.join(a.out, f"allreduce_{rate}_{layout}.json"))
            rows = median_rows(files)
            backends = [b for b in ours.split(",")] + ["gloo"]
            sizes = sorted({n for (_, n) in rows})
            start = len(md)
            md.append(f"### {rate} ({link:.3f} GB/s per direction), {layout}\n")
            md.append("| size | " + " | ".join(backends) + " | ratios |")
            md.append("|---:|" + "---:|" * len(backends) + "---|")
            for n in sizes:
                cells = [f"{rows[(b, n)]['busbw']:.3f}" for b in backends]
                head = rows[(backends[0], n)]["busbw"]
                ratios = ", ".join(f"{backends[0]}/{b} {head / rows[(b, n)]['busbw']:.2f}" for b in backends[1:])
                if layout == "2x1":
                    ratios += f"; ring at {100 * head / link:.1f}% of the link"
                md.append(f"| {n >> 20} MiB | " + " | ".join(cells) + f" | {ratios} |")
            wrong = sum(v["wrong"] for v in rows.values())
            md.append(f"\nwrong elements: {wrong}\n")
            print("\n".join(md[start:]), flush=True)
    sh([CLUSTER, "down"], 120)


def step_args(a):
    return ["-a", "resnet110", "-b", str(a.batch), "--threads", "1"]


def field(text, name):
    m = re.search(name + r"=([0-9.]+)", text)
    if not m:
        raise RuntimeError(f"no {name}= in: {text[-1500:]}")
    return float(m[1])


def part_weak(a, md):
    up(a.step_rate)
    log = os.path.join(a.out, f"weak_b{a.batch}.log")
    bench = [os.path.join(BUILD, "bench_step"), *step_args(a), "--steps", "10", "--warmup", "2", "--bucket-mb", "1"]
    gloo = [SYSPY, os.path.join(ROOT, "scripts", "peers", "torch_gloo_peer.py"), "step", "110", str(a.batch), "1", "10"]
    t = {}
    for rep in range(a.repeats):
        t.setdefault("one", []).append(field(sh([CLUSTER, "exec", "node0", *bench], 600, log), "median_step_s"))
        t.setdefault("gloo_one", []).append(field(run(["-np", "1", "-x", "GLOO_SOCKET_IFNAME=eth0"], gloo, log=log), "median_step_s"))
        for layout, backend in (("2x1", "ring"), ("2x2", "hierarchical")):
            out = run(layout_args(layout), bench + ["--backend", backend], log=log)
            t.setdefault(layout, []).append(field(out, "median_step_s"))
            t.setdefault(layout + "_wait", []).append(field(out, "comm_wait_s"))
            t.setdefault(layout + "_none", []).append(
                field(run(layout_args(layout), bench + ["--backend", "none"], log=log), "median_step_s"))
            t.setdefault("gloo_" + layout, []).append(
                field(run(layout_args(layout) + ["-x", "GLOO_SOCKET_IFNAME=eth0"], gloo, log=log), "median_step_s"))
        print(f"weak repeat {rep + 1}: " + ", ".join(f"{k} {v[-1]:.4f}" for k, v in t.items()), flush=True)
    m = {k: statistics.median(v) for k, v in t.items()}
    md.append(f"## Weak scaling at {a.step_rate} (ResNet-110, 32x32, batch {a.batch}/rank, 1 thread, 1 MiB buckets; "
              f"medians of {a.repeats})\n")
    md.append("| layout | ringtrain step | unsynchronised | efficiency | ceiling | efficiency / ceiling | exposed comm | "
              "torch DDP (gloo) step | torch efficiency | torch / ceiling | ringtrain / torch step |")
    md.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    md.append(f"| 1 rank | {m['one']:.4f} s | | | | | | {m['gloo_one']:.4f} s | | | {m['one'] / m['gloo_one']:.2f} |")
    for layout in ("2x1", "2x2"):
        eff, ceil = m["one"] / m[layout], m["one"] / m[layout + "_none"]
        teff = m["gloo_one"] / m["gloo_" + layout]
        md.append(f"| {layout} | {m[layout]:.4f} s | {m[layout + '_none']:.4f} s | {eff:.3f} | {ceil:.3f} | "
                  f"**{eff / ceil:.3f}** | {1000 * m[layout + '_wait']:.1f} ms | {m['gloo_' + layout]:.4f} s | {teff:.3f} | "
                  f"{teff / ceil:.3f} | {m[layout] / m['gloo_' + layout]:.2f} |")
    md.append("")
    json.dump(t, open(os.path.join(a.out, f"weak_b{a.batch}.json"), "w"), indent=2)
    print("\n".join(md[-6:]), flush=True)


def part_model(a, md):
    up(a.step_rate)
    log = os.path.join(a.out, f"model_b{a.batch}.log")
    train = [os.path.join(BUILD, "train_resnet"), "--synthetic", *step_args(a), "--image-size", "32", "--steps", "14",
             "--bucket-mb", "1", "--log-every", "1000", "--synthetic-size", "4096"]
    runs = {}
    for name, args in (("1", ["-np", "1"]), ("2x1", layout_args("2x1")), ("2x2", layout_args("2x2"))):
        path = os.path.join(a.out, f"train_b{a.batch}_{name}.jsonl")
        if os.path.exists(path):
            os.remove(path)
        run(args, train + ["--log-jsonl", path], log=log)
        runs[name] = path
    md.append(f"## Scaling model checked on the emulated nodes at {a.step_rate} (ResNet-110, batch {a.batch}/rank, "
              "train_resnet)\n")
    for layout, n, backend in (("2x1", 2, "ring"), ("2x2", 4, "hierarchical")):
        bench = os.path.join(a.out, f"allreduce_{a.step_rate}_{layout}.json")
        if not os.path.exists(bench):
            raise RuntimeError(f"{bench} is missing: run the allreduce part at {a.step_rate} first")
        out = sh([SYSPY, os.path.join(ROOT, "scripts", "scaling_model.py"), "selfcheck", "--backend", backend,
                  "--bench", f"{n}={bench}", "--run", f"1={runs['1']}", "--run", f"{n}={runs[layout]}", "--markdown"],
                 300, log)
        md.append(f"### {layout} ({backend}, fitted on {os.path.basename(bench)})\n\n{out.strip()}\n")
    print("\n".join(md[-4:]), flush=True)


def parse_bytes(text):
    m = re.fullmatch(r"([0-9]+)([KMG]?)", text)
    if not m:
        raise SystemExit(f"--max-bytes '{text}' is not a size such as 64M")
    return int(m[1]) << {"": 0, "K": 10, "M": 20, "G": 30}[m[2]]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="bench-cluster")
    p.add_argument("--rates", default="1gbit,5gbit,10gbit")
    p.add_argument("--step-rate", default="1gbit")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch", type=int, default=32, help="weak and model: images per rank")
    p.add_argument("--max-bytes", default="64M")
    p.add_argument("--parts", default="allreduce,weak,model")
    a = p.parse_args()
    a.rates = a.rates.split(",")
    parse_bytes(a.max_bytes)
    parts = a.parts.split(",")
    for part in parts:
        if part not in ("allreduce", "weak", "model"):
            raise SystemExit(f"--parts: unknown part '{part}' (allreduce, weak, model)")
    for tool in ("allreduce_bench", "bench_step", "train_resnet"):
        if not os.access(os.path.join(BUILD, tool), os.X_OK):
            raise SystemExit(f"{BUILD}/{tool} missing: run scripts/setup.sh")
    os.makedirs(a.out, exist_ok=True)
    lscpu = sh(["lscpu"], 30)
    cpu = re.search(r"Model name:\s*(.*)", lscpu)
    md = [f"# Emulated-cluster benchmarks ({time.strftime('%Y-%m-%d')}, {cpu[1] if cpu else '?'}, "
          f"{os.cpu_count()} cores shared by every node)\n"]
    try:
        for part in parts:
            {"allreduce": part_allreduce, "weak": part_weak, "model": part_model}[part](a, md)
    finally:
        sh([CLUSTER, "down"], 120, check=False)
        with open(os.path.join(a.out, "summary.md"), "w") as f:
            f.write("\n".join(md) + "\n")
    print(f"wrote {a.out}/summary.md")


if __name__ == "__main__":
    main()
