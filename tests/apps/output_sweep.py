#!/usr/bin/env python3
"""tests/apps/output_sweep.py BUILD_DIR: every writer of every program against every file of the same run.

Each program that writes a file (train_resnet, ringtrain_plan, ringtrain_run and the job it runs, make_shards)
is run with one of its outputs pointed at another file of the same run: an input (a shard or the manifest
of --data, --resume's checkpoint, --link-calibration, the hostfile) or another output (--log-jsonl,
--trace, --save-link, --checkpoint-dir, the job's own outputs). Each is spelled three ways: the same
path, another spelling of it (through "sub/.."), and a symbolic link to it (for an output not there yet,
a link to the file it will be). Each such run must fail before it writes anything, naming both flags,
and leave every file of the run as it was. A run whose files are all apart must still work.
"""
import hashlib
import os
import shutil
import subprocess
import sys

build = os.path.abspath(sys.argv[1])
work = os.path.join(os.getcwd(), "output_sweep_work")
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
os.chdir(work)
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
failures = []


def fail(text):
    failures.append(text)
    print("FAIL: " + text)


def run(cmd, timeout=120):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return None, "timed out"
    return p.returncode, p.stdout + p.stderr


def exe(name):
    return os.path.join(build, name)


def snapshot():
    """Every file under the work folder (but the sweep's own links), with its content's hash."""
    seen = {}
    for folder, _, files in os.walk(work):
        for name in files:
            path = os.path.join(folder, name)
            if os.path.islink(path) or name.startswith("alias"):
                continue
            with open(path, "rb") as f:
                seen[os.path.relpath(path, work)] = hashlib.md5(f.read()).hexdigest()
    return seen


rc, out = run([exe("make_shards"), "synthetic", "data", "--shape", "12x12x3", "--count", "64", "--classes", "3",
               "--shards", "2"])
if rc != 0:
    print(out)
    sys.exit("output sweep: could not make the data set")
base = ["-a", "resnet20", "-b", "8", "--threads", "1", "--lr", "0.05", "--log-every", "100"]
rc, out = run([exe("train_resnet"), "--data", "data"] + base + ["--steps", "1", "--checkpoint-dir", "first"])
if rc != 0:
    print(out)
    sys.exit("output sweep: the first run failed")
with open("cal.json", "w") as f:
    f.write('{"link": {}}\n')
with open("hosts", "w") as f:
    f.write("localhost slots=2\n")
os.makedirs("sub", exist_ok=True)

# The files of a run, by flag: (flag, path, kind, what else the flag needs on the command line). Kinds:
# "in" (a file it reads), "in-folder" (a folder it reads: outputs are aimed at files inside it), "out" (a
# file it writes), "out-folder".
DATA = ("--data", "data", "in-folder", [])
RESUME = ("--resume", "first/ckpt-step00000001.h5", "in", [])
CAL = ("--link-calibration", "cal.json", "in", ["--layout", "auto"])
LOG = ("--log-jsonl", "run.jsonl", "out", [])
TRACE = ("--trace", "run.trace", "out", [])
CKPT = ("--checkpoint-dir", "ck", "out-folder", [])
SAVE = ("--save-link", "link.json", "out", [])
PROGRAMS = {
    "train_resnet": [DATA, RESUME, CAL, LOG, TRACE, CKPT],
    "ringtrain_plan": [DATA, CAL, LOG, TRACE, SAVE],
}


def targets(entry):
    """The paths inside a file of the run an output may be aimed at."""
    flag, path, kind, _ = entry
    if kind == "in-folder":
        return [os.path.join(path, "manifest.json"), os.path.join(path, "train-00000-of-00002.h5"),
                os.path.join(path, "new.json")]
    return [path]


def spellings(path, n):
    """The same file three ways: as given, through sub/.., and through a link (made here)."""
    link = f"alias{n}"
    if os.path.lexists(link):
        os.remove(link)
    os.symlink(os.path.abspath(path), link)
    return [path, os.path.join("sub", "..", path), link]


checked = 0
counter = 0


def expect_refused(cmd, flags, what, before):
    global checked
    rc, out = run(cmd)
    checked += 1
    if rc is None or rc == 0:
        fail(f"{what}: {'timed out' if rc is None else 'accepted'}")
    elif any(flag not in out for flag in flags):
        fail(f"{what}: exit {rc} without naming {' and '.join(flags)}: {out.strip()[-300:]}")
    elif "terminate called" in out or rc in (134, 139):
        fail(f"{what}: crashed: {out.strip()[-300:]}")
    after = snapshot()
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    if changed:
        fail(f"{what}: files changed or written by a refused run: {changed}")
        for k in changed:  # the next case starts from the files as they were
            if k not in before and os.path.exists(k):
                os.remove(k)


for program, files in PROGRAMS.items():
    for writer in files:
        if not writer[2].startswith("out"):
            continue
        for other in files:
            if other is writer or (writer[2] == "out-folder" and other[2] == "in"):
                continue
            for target in targets(other) if writer[2] == "out" else [other[1]]:
                counter += 1
                for spelled in spellings(target, counter):
                    cmd = [exe(program), "--data", "data"] + base + ["--steps", "1"]
                    if other[0] != "--data":
                        cmd += [other[0], other[1]] + other[3]
                    cmd += [writer[0], spelled] + writer[3]
                    if other[0] == "--resume" and writer[0] == "--checkpoint-dir":
                        continue
                    expect_refused(cmd, [writer[0], other[0]], f"{program} {writer[0]} {spelled} ({other[0]})",
                                   snapshot())

# ringtrain_run: its restart log against every file of the job it runs, and the job's outputs against the
# job's inputs (checked by ringtrain_run before the first launch).
job = [exe("train_resnet")] + base + ["--steps", "1"]
JOB_FILES = [DATA, RESUME, CAL, TRACE, CKPT, ("--hostfile", "hosts", "in", [])]
for other in JOB_FILES:
    for target in targets(other):
        counter += 1
        for spelled in spellings(target, counter):
            own = other[0] == "--hostfile"
            cmd = [exe("ringtrain_run"), "--np", "1", "--max-restarts", "0", "--log-jsonl", spelled]
            if own:
                cmd += ["--hostfile", other[1]]
            jobcmd = job + ["--data", "data"] + ([] if own or other[0] == "--data" else [other[0], other[1]] + other[3])
            name = other[0] if own else "the training command's " + other[0]
            if other[0] == "--checkpoint-dir":
                continue  # a log named like the folder: --checkpoint-dir's own check, at the job's start
            expect_refused(["timeout", "60"] + cmd + ["--"] + jobcmd, ["--log-jsonl", name],
                           f"ringtrain_run --log-jsonl {spelled} ({name})", snapshot())

# make_shards: the output folder inside the source folder.
counter += 1
for spelled in ["data/out", "sub/../data/out"]:
    expect_refused([exe("make_shards"), "imagefolder", "data", spelled, "--size", "8"], ["OUT", "SRC"],
                   f"make_shards imagefolder data {spelled}", snapshot())

# Files all apart: the run works, and a second run appends to the same log.
for attempt in range(2):
    rc, out = run([exe("train_resnet"), "--data", "data"] + base +
                  ["--steps", "1", "--log-jsonl", "ok.jsonl", "--trace", "ok.trace", "--checkpoint-dir", f"ok{attempt}"])
    if rc != 0:
        fail(f"a run whose outputs are all apart failed: {out.strip()[-300:]}")

print(f"output sweep: {checked} outputs aimed at another file of their run, all refused")
if failures:
    print(f"output sweep: FAIL ({len(failures)} problems)")
    sys.exit(1)
print("output sweep: PASS")
