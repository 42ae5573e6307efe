#!/usr/bin/env bash
# scripts/gpu_bundle.sh: run on a Debian machine with package access (this one, CI's) before a GPU check.
# Downloads -- installs nothing -- the Debian packages of the libraries ringtrain builds against (Open MPI,
# HDF5, OpenBLAS, oneDNN, GoogleTest, CLI11, nlohmann-json, fmt, zlib, libjpeg, libpng: the list in
# scripts/debian_packages.sh) and the run-time libraries they need, into one folder that travels with the
# working tree. scripts/gpu_check.sh unpacks it into a private prefix on a GPU machine that lacks them.
#
#   bash scripts/gpu_bundle.sh [--out DIR] [--list]
#     --out DIR   where the .deb files and MANIFEST go (default .gpu_bundle; emptied first)
#     --list      print the selected packages with their sizes and stop (downloads nothing)
#
# What is left out: what any machine that can build C++ already has (Essential, required and important
# packages, the compilers and their run-time libraries, glibc), Perl and Python, optional plugins
# (hwloc's X11/XML plugins), documentation and JavaScript, and development packages the build does not
# read (the -dev packages Open MPI's and HDF5's own -dev packages pull in). Left-out alternatives satisfy
# a dependency: `openssh-client | rsh-client` needs neither. The bundle fits the device tool's 64 MiB
# working-tree limit with room for the repository.
set -euo pipefail
cd "$(dirname "$0")/.."

out=.gpu_bundle
list_only=0
while (($#)); do
  case $1 in
    --out) [[ $# -ge 2 ]] || { echo "gpu_bundle: --out needs a folder" >&2; exit 2; }; out=$2; shift 2 ;;
    --list) list_only=1; shift ;;
    -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_bundle: unknown argument '$1' (expected --out DIR or --list)" >&2; exit 2 ;;
  esac
done
for tool in apt-cache apt-get dpkg-deb python3; do
  command -v "$tool" >/dev/null || { echo "gpu_bundle: needs $tool (run it on a Debian machine)" >&2; exit 2; }
done

source scripts/debian_packages.sh

# The package selection: a breadth-first walk over Depends/Pre-Depends from the roots that does not enter
# left-out packages. Prints "package version size" lines.
select_packages() {
  python3 - "$@" <<'PY'
import re, subprocess, sys

roots = sys.argv[1:]
# -dev packages that are not roots but hold what the build reads (libopenblas.so and cblas.h).
keep_dev = {"libopenblas-pthread-dev"}
left_out = re.compile("|".join([
    r"(gcc|g\+\+|cpp|gfortran)(-\d+)?(-base)?", r"lib(gcc|stdc\+\+|gfortran)-\d+-dev", r"libgcc-s1", r"libstdc\+\+6",
    r"lib(asan|tsan|lsan|ubsan|hwasan|itm|cc1|isl|mpc|mpfr|gmp|gprofng|ctf|ctf-nobfd|sframe|binutils|jansson)\d*",
    r"binutils(-.*)?", r"libc6(-dev)?", r"libc-dev-bin", r"linux-libc-dev", r"libcrypt(-dev|\d+)", r"libnsl(-dev|\d+)",
    r"libtirpc(-dev|-common|\d+)", r"rpcsvc-proto", r"perl(-base|-modules-[\d.]+)?", r"libperl[\d.]+", r"python3.*",
    r"libpython3.*", r"autoconf", r"automake", r"autotools-dev", r"m4", r"libtool", r"libsigsegv\d*",
    r"openssh-.*", r"rsh-.*", r"libjs-.*", r".*-doc", r"libhwloc-plugins", r"sensible-utils", r"ucf",
    r"debconf.*", r"dpkg.*", r"install-info", r"lsb-base", r"sysvinit-utils", r"libdpkg-perl",
]))
info = {}

def show(pkgs):
    text = subprocess.run(["apt-cache", "show", "--no-all-versions", *pkgs], capture_output=True, text=True).stdout
    for stanza in text.split("\n\n"):
        fields = dict(re.findall(r"^([A-Za-z-]+): ?(.*)$", stanza, re.M))
        if "Package" in fields:
            info[fields["Package"]] = fields

def assumed(p):  # on any machine that builds C++, or not wanted: satisfies a dependency on it
    f = info.get(p, {})
    return f.get("Essential") == "yes" or f.get("Priority") in ("required", "important") or bool(left_out.fullmatch(p))

def unread(p):  # a development package the build does not read: not taken, but not a substitute either
    return p.endswith("-dev") and p not in roots and p not in keep_dev

show(roots)
missing = [r for r in roots if r not in info]
if missing:
    sys.exit("gpu_bundle: apt knows no package " + ", ".join(missing) + " (run apt-get update?)")
chosen, frontier = set(), list(roots)
while frontier:
    chosen.update(frontier)
    text = subprocess.run(["apt-cache", "depends", "--important", *frontier], capture_output=True, text=True).stdout
    # A dependency is a group of alternatives ("a | b | <virtual>"); each alternative is a list of
    # packages: itself (unless virtual), then the packages that provide it (the indented lines after it).
    groups, group, alternative = [], [], None
    for line in text.splitlines():
        if not line.startswith(" "):
            continue
        m = re.match(r"^ (\|| )(Depends|PreDepends): (.*)$", line)
        if m:
            name = m.group(3)
            alternative = [] if name.startswith("<") else [name]
            group.append(alternative)
            if m.group(1) == " ":  # the last alternative of this dependency
                groups.append(group)
                group = []
        elif line.startswith("    ") and alternative is not None:  # a package providing the one above
            alternative.append(line.strip())
    candidates = {p for g in groups for alt in g for p in alt}
    show(sorted(candidates - set(info)))
    new = []
    for g in groups:
        alternatives = [p for alt in g for p in alt if p in info]
        if any(p in chosen or p in new or assumed(p) for p in alternatives):
            continue  # satisfied
        wanted = [p for p in alternatives if not unread(p)]
        if wanted:
            new.append(wanted[0])
    frontier = [p for p in new if p not in chosen]
for p in sorted(chosen):
    print(p, info[p].get("Version", "?"), info[p].get("Size", "0"))
PY
}

selection=$(select_packages "${ringtrain_library_packages[@]}")
total=$(awk '{s += $3} END {print s}' <<< "$selection")
count=$(wc -l <<< "$selection")
if ((list_only)); then
  sort -k3 -n -r <<< "$selection" | awk '{printf "%10.1f KiB  %s %s\n", $3 / 1024, $1, $2}'
  echo "gpu_bundle: $count packages, $((total / 1024 / 1024)) MiB"
  exit 0
fi

rm -rf "$out"
mkdir -p "$out"
echo "gpu_bundle: downloading $count packages ($((total / 1024 / 1024)) MiB) into $out/"
# shellcheck disable=SC2046
if ! (cd "$out" && apt-get download -q $(awk '{print $1 "=" $2}' <<< "$selection") > download.log 2>&1); then
  cat "$out/download.log" >&2
  echo "gpu_bundle: apt-get download failed (no network, or stale package lists: run apt-get update)" >&2
  exit 1
fi
rm -f "$out/download.log"
{
  echo "# ringtrain GPU bundle: Debian packages for scripts/gpu_check.sh, made by scripts/gpu_bundle.sh"
  echo "# made $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME") ($(dpkg --print-architecture))"
  echo "# roots: ${ringtrain_library_packages[*]}"
  echo "# package version sha256"
  for deb in "$out"/*.deb; do
    echo "$(dpkg-deb -f "$deb" Package) $(dpkg-deb -f "$deb" Version) $(sha256sum "$deb" | cut -d' ' -f1)"
  done
} > "$out/MANIFEST"
echo "gpu_bundle: $(ls "$out"/*.deb | wc -l) packages, $(du -sm "$out" | cut -f1) MiB in $out/ (MANIFEST lists them)"
