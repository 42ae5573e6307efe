#!/usr/bin/env python3
"""tests/apps/flag_sweep.py BUILD_DIR SOURCE_DIR: every number flag of every program, fed its boundaries.

Reads each program's --help, where every number flag shows its type and range ("INT in [0, 1024]",
"FLOAT in (0, 1e+06]", "INT,... in [0, 1048576]" for lists, SIZE for byte counts: runtime/config/cli.h).
Each is given -1, 0, its bounds and one past them, 2^31, 2^32+5, 2^63, 2^64, NaN, inf, an empty value,
text, a fraction, hex and more. A value the flag cannot hold exactly must be refused at once: a non-zero
exit that is not a crash (134, 139) or a timeout, a message naming the flag, and no "terminate called".
Values that fit must be taken: they are given with --help (CLI11 validates before it acts on --help, so
the program exits 0 exactly when the value passed; training never starts); tests/core/test_parse.cpp
reads such values back exactly.

The environment too: every RINGTRAIN_* switch, number and choice of docs/ENVIRONMENT.md is given bad
spellings (every one against the first program, one against each other) and must be refused at the
start, with --help, naming the variable; good values are taken; a misspelt name is warned about.

It also checks that every program's main ends in the project's error handler (a function-try-block
whose catch (...) returns runtime::main_error, or, for the core-only example, catches everything), and
that no number flag is left with CLI11's own conversion (a bare INT, UINT or FLOAT type in --help).
"""
import os
import re
import subprocess
import sys

build, source = sys.argv[1], sys.argv[2]
work = os.path.join(os.getcwd(), "flag_sweep_work")
os.makedirs(work, exist_ok=True)
src = os.path.join(work, "src")
os.makedirs(src, exist_ok=True)

# program, the arguments that make a command line complete apart from the flag under test
PROGRAMS = [
    ("train_resnet", ["--synthetic"]),
    ("ringtrain_plan", ["--synthetic"]),
    ("custom_model", []),
    ("small_unet", []),
    ("bench_step", []),
    ("bench_loader", ["--data", work]),
    ("allreduce_bench", []),
    ("ringtrain_env", []),
    ("ringtrain_run", ["--np", "1"], ["--", "true"]),
    ("make_shards synthetic", [os.path.join(work, "out")]),
    ("make_shards synthetic-segmentation", [os.path.join(work, "out")]),
    ("make_shards segmentation", [src, os.path.join(work, "out")]),
    ("make_shards imagefolder", [src, os.path.join(work, "out"), "--size", "8"]),
    ("make_shards fashion-mnist", [src, os.path.join(work, "out")]),
]

FLAG_LINE = re.compile(
    r"^\s+(?:-\w,)?(--[a-z0-9-]+) (auto\|)?(INT|FLOAT)(,\.\.\.)? in ([\[(])([^,\]]+), ([^\]]+)\]")
SIZE_LINE = re.compile(r"^\s+(?:-\w,)?(--[a-z0-9-]+) SIZE\b")
BARE_LINE = re.compile(r"^\s+(?:-\w,)?(--[a-z0-9-]+) (?:INT|UINT|FLOAT|NUMBER)(?:[=\s:]|$)(?!in )")

failures = []


def fail(text):
    failures.append(text)
    print("FAIL: " + text)


def fits(kind, value, lo, hi, open_low):
    """Whether `value` is a number this flag takes exactly (the program would then run, not refuse)."""
    if kind == "INT":
        if not re.fullmatch(r"-?[0-9]+", value):
            return False
        v = int(value)
        return int(lo) <= v <= int(hi)
    if not re.fullmatch(r"[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?", value) or value.startswith("+"):
        return False
    v = float(value)
    if v != v or v in (float("inf"), float("-inf")):
        return False
    return (v > float(lo) if open_low else v >= float(lo)) and v <= float(hi)


def candidates(kind, lo, hi):
    values = ["-1", "0", "", "abc", "nan", "inf", "-inf", "1.5", "0x10", "1e3", " 5", "5 ", "+5", "2^8"]
    values += [str(2**31), str(2**32 + 5), str(2**63), str(2**64), str(2**64 + 1), "-" + str(2**63 + 1)]
    if kind == "INT":
        values += [lo, hi, str(int(lo) - 1), str(int(hi) + 1), "010"]
    else:
        values += [lo, hi, "1e309", "-1e309", str(float(hi) * 10)]
    return values


SIZES = ["-1", "0", "", "abc", "nan", "inf", "1e30", "10XB", "0.5", "1.5B", "-5M", "9E", "M", "1e19"]


def run(program, base, tail, flag, value):
    if flag in base:  # the flag under test replaces the base line's own value for it
        at = base.index(flag)
        base = base[:at] + base[at + 2:]
    cmd = [os.path.join(build, program.split()[0])] + program.split()[1:] + base + [flag + "=" + value] + tail
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=30, cwd=work)
    except subprocess.TimeoutExpired:
        return None, "timed out"
    return p.returncode, p.stdout + p.stderr


checked = 0
accepted = 0
for entry in PROGRAMS:
    program, base = entry[0], entry[1]
    tail = entry[2] if len(entry) > 2 else []
    exe = [os.path.join(build, program.split()[0])] + program.split()[1:]
    help_text = subprocess.run(exe + ["--help"], capture_output=True, text=True, timeout=30).stdout
    flags = 0
    for line in help_text.splitlines():
        bare = BARE_LINE.match(line)
        if bare:
            fail(f"{program} {bare.group(1)}: a number flag without a checked range (runtime::add_number)")
        m = FLAG_LINE.match(line)
        size = SIZE_LINE.match(line)
        if not m and not size:
            continue
        flags += 1
        flag = (m or size).group(1)
        if m:
            _, auto, kind, is_list, bracket, lo, hi = m.groups()
            open_low = bracket == "("
            values = candidates(kind, lo, hi)
            if is_list:
                values += [lo + ",", "," + lo, lo + ",," + lo, lo + "," + str(2**32 + int(float(lo)) + 5)]
        else:
            values = SIZES
        if m and auto:
            values.append("auto")
        if not m:
            values = values + ["1", "512M", "300MB", "1g", "2GiB", "1.5K"]
        for value in values:
            good = False
            if m and not is_list:
                good = fits(kind, value, lo, hi, open_low) or (auto and value == "auto")
            elif m:
                good = all(fits(kind, item, lo, hi, open_low) for item in value.split(","))
            else:
                good = re.fullmatch(r"1|512M|300MB|1g|2GiB|1.5K", value) is not None
            if good:
                # A value that fits must be taken: parsing validates before --help is acted on, so
                # "--flag=value --help" exits 0 exactly when the value passed.
                rc, out = run(program, base, ["--help"] + tail, flag, value)
                accepted += 1
                if rc != 0:
                    fail(f"{program} {flag}={value!r}: refused (exit {rc}), but it fits: {out.strip()[-300:]}")
                continue
            rc, out = run(program, base, tail, flag, value)
            checked += 1
            what = f"{program} {flag}={value!r}"
            if rc is None:
                fail(f"{what}: {out}")
            elif rc == 0:
                fail(f"{what}: accepted (exit 0); it does not fit the flag")
            elif rc in (134, 139, -6, -11) or "terminate called" in out:
                fail(f"{what}: crashed (exit {rc}): {out.strip()[-300:]}")
            elif flag not in out:
                fail(f"{what}: exit {rc} without naming the flag: {out.strip()[-300:]}")
    if flags == 0:
        fail(f"{program}: --help shows no number flag (is the format of runtime::number_type_name changed?)")

# The environment: every RINGTRAIN_* switch, number and choice docs/ENVIRONMENT.md lists is checked by every
# program at its start, --help included (core/env.h check_environment): a bad value exits 2 naming the
# variable, a good one is taken, a name no program reads is warned about.
def env_variables():
    found = []
    for line in open(os.path.join(source, "docs", "ENVIRONMENT.md")):
        m = re.match(r"^\| `(RINGTRAIN_[A-Z0-9_]+)` \| ([^|]+) \|", line)
        if not m:
            continue
        name, kind = m.group(1), m.group(2).strip()
        if kind.startswith("switch"):
            found.append((name, "switch", None))
        elif kind.startswith("number"):
            r = re.search(r"([0-9^]+) to ([0-9^]+)", kind)
            lo, hi = (int(x.split("^")[0]) ** int(x.split("^")[1]) if "^" in x else int(x) for x in r.groups())
            found.append((name, "number", (lo, hi)))
        elif " or " in kind and re.findall(r"`([a-z0-9_]+)`", kind):
            found.append((name, "choice", re.findall(r"`([a-z0-9_]+)`", kind)))
    return found


def env_run(exe, name, value):
    env = dict(os.environ)
    env[name] = value
    try:
        p = subprocess.run(exe + ["--help"], capture_output=True, text=True, timeout=30, cwd=work, env=env)
    except subprocess.TimeoutExpired:
        return None, "timed out"
    return p.returncode, p.stdout + p.stderr


variables = env_variables()
if len(variables) < 10:
    fail(f"docs/ENVIRONMENT.md: only {len(variables)} checked variables found (is its table's format changed?)")
env_checked = 0
for i, entry in enumerate(PROGRAMS):
    exe = [os.path.join(build, entry[0].split()[0])] + entry[0].split()[1:]
    for name, kind, detail in variables:
        if kind == "switch":
            bad, good = ["true", "false", "no", "yes", "on", "00", " 0", "1 ", "2", "-1", "0x1", "1.0"], ["1", "0", ""]
        elif kind == "number":
            lo, hi = detail
            bad = ["abc", "-1", str(hi + 1), "99999999999", " 5", "5 ", "0x10", "1.5", "nan", "+5", "1e3", "5k"]
            good = [str(lo), str(hi), ""]
        else:
            # The first two names of a choice are there on every CPU (auto, and direct or f32).
            bad, good = [detail[0].upper(), " " + detail[0], detail[0] + " ", "x", detail[0] + "," + detail[1]], detail[:2]
        if i > 0:  # every value against the first program; one bad and one good against each other program
            bad, good = bad[:1], good[:1]
        for value in bad:
            rc, out = env_run(exe, name, value)
            env_checked += 1
            what = f"{entry[0]} with {name}={value!r}"
            if rc != 2 or name not in out or "terminate called" in out:
                fail(f"{what}: exit {rc}, expected 2 naming {name}: {out.strip()[-300:]}")
        for value in good:
            rc, out = env_run(exe, name, value)
            if rc != 0 or name + "=" in out:
                fail(f"{entry[0]} with {name}={value!r}: exit {rc} (or a word about it), but the value is good: "
                     f"{out.strip()[-300:]}")
    rc, out = env_run(exe, "RINGTRAIN_THREAD", "4")
    if rc != 0 or "RINGTRAIN_THREAD is set, but no ringtrain program reads it" not in out:
        fail(f"{entry[0]} with RINGTRAIN_THREAD=4 (a misspelling): exit {rc}, not warned: {out.strip()[-300:]}")

# Every program's main ends in the error handler.
for folder in ("apps", "apps/examples"):
    for name in sorted(os.listdir(os.path.join(source, folder))):
        path = os.path.join(source, folder, name)
        if not name.endswith(".cpp"):
            continue
        text = open(path).read()
        if "int main(" not in text:
            continue
        if not re.search(r"int main\(int argc, char\*\* argv\) try \{", text) or "catch (...)" not in text:
            fail(f"{folder}/{name}: main is not a function-try-block ending in catch (...)")
        elif "fashion_mnist_mlp" not in name and "runtime::main_error(" not in text:
            fail(f"{folder}/{name}: main's catch (...) does not return runtime::main_error")

print(f"flag sweep: {checked} refused values checked, {accepted} values that fit taken, "
      f"{len(variables)} environment variables with {env_checked} bad values refused")
if failures:
    print(f"flag sweep: FAIL ({len(failures)} problems)")
    sys.exit(1)
print("flag sweep: PASS")
