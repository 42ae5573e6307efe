#!/usr/bin/env bash
# scripts/gpu_bundle.sh --list: the selection holds the libraries the build and mpirun need with their
# run-time libraries, leaves out the toolchain, glibc, Perl and Python, and stays small enough to travel
# with the repository (the device tool moves at most 64 MiB). Skipped (77) without apt's package lists.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
if ! apt-cache show --no-all-versions libopenmpi-dev > /dev/null 2>&1; then
  echo "apt knows no libopenmpi-dev here (no package lists): skipped"
  exit 77
fi
list=$(bash "$repo/scripts/gpu_bundle.sh" --list)
echo "$list" | tail -1
names=$(awk 'NF == 4 {print $3}' <<< "$list")
for want in libopenmpi3 libopenmpi-dev openmpi-bin libpmix2 libhwloc15 libhdf5-103-1 libhdf5-dev libsz2 libdnnl2 \
  libdnnl-dev ocl-icd-opencl-dev opencl-c-headers libopenblas0-pthread libopenblas-pthread-dev libgfortran5 \
  libgtest-dev libcli11-dev nlohmann-json3-dev libpng-dev libjpeg62-turbo-dev zlib1g-dev; do
  grep -qx "$want" <<< "$names" || { echo "the bundle lacks $want" >&2; exit 1; }
done
for unwanted in gcc-12 g++-12 gfortran-12 cpp-12 libc6 libc6-dev libstdc++6 libgcc-s1 binutils perl perl-base \
  python3 libpython3.11 openssh-client libhwloc-plugins libssl-dev libcurl4-openssl-dev libjs-jquery; do
  if grep -qx "$unwanted" <<< "$names"; then echo "the bundle should leave out $unwanted" >&2; exit 1; fi
done
mib=$(tail -1 <<< "$list" | sed -n 's/.*packages, \([0-9]*\) MiB$/\1/p')
[[ -n $mib && $mib -le 56 ]] || { echo "the bundle is ${mib:-?} MiB: with the repository it must stay under the device tool's 64 MiB" >&2; exit 1; }
echo "gpu_bundle --list: $(wc -l <<< "$names") packages, $mib MiB"
