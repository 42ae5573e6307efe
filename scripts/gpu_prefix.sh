#!/usr/bin/env bash
# scripts/gpu_prefix.sh: unpacks the GPU bundle's packages (scripts/gpu_bundle.sh) into a private prefix and
# fits them to this machine. scripts/gpu_check.sh runs it after checking every package against the
# bundle's MANIFEST; it never writes outside PREFIX.
#
#   bash scripts/gpu_prefix.sh PREFIX auto|prefer-system|always DEB...
#
# 1. Every .deb is unpacked into PREFIX (dpkg-deb -x, or ar and tar). The links Debian's package scripts
#    would make (Open MPI's alternatives) are made, and Debian's h5cc is pointed at the prefix.
# 2. Unless `always`: a library's headers and its binary come from one place (cmake/RingtrainCheckSameOrigin.cmake
#    refuses a mix for libjpeg). For the libraries the build finds by header and link name through
#    CMAKE_PREFIX_PATH (libjpeg, libpng, zlib): where the machine has the development package's headers
#    and link (libjpeg.so, leading to its run-time library), the machine's own is used and every file of
#    the bundle's development package leaves the prefix (headers, jconfig.h, the .so link, the .a, the
#    pkg-config file). Otherwise the bundle's headers are used with the bundle's own run-time library,
#    which then stays even where the machine knows its soname (step 3).
#    Why not keep the bundle's headers and let the machine's run-time library win: the header then
#    describes another build than the one that runs (and with libjpeg on Ubuntu 24.04, the bundle's
#    jpeglib.h met the machine's jconfig.h: compiled as 80, linked to the bundle's libjpeg.so.62, and
#    every JPEG call stopped with "Wrong JPEG library version: library is 62, caller expects 80", on
#    2026-12-04). Why the machine's over the bundle's where it has both: a jpeglib.h left in the prefix
#    is found through any bundle package's include folder (PREFIX/usr/include) ahead of the machine's
#    own, and the machine's libraries are what its other programs load.
# 3. Unless `always`: the bundle's copy of every other shared library the machine's dynamic linker
#    already knows by soname is dropped (the machine's own, newer, wins). Then links that point nowhere
#    are pointed at the machine's copy, and absolute links are moved into the prefix.
#
# RINGTRAIN_MACHINE_ROOT (for tests; default /): where step 2 looks for the machine's headers and links.
set -euo pipefail
usage() { echo "usage: bash scripts/gpu_prefix.sh PREFIX auto|prefer-system|always DEB..." >&2; exit 2; }
(($# >= 2)) || usage
prefix=$1 use_bundle=$2
shift 2
[[ $use_bundle =~ ^(auto|prefer-system|always)$ ]] || usage
machine=${RINGTRAIN_MACHINE_ROOT:-}
machine=${machine%/}
P=$prefix/usr L=$prefix/usr/lib/x86_64-linux-gnu
# The development packages of step 2 (Debian 12's names, where scripts/gpu_bundle.sh runs).
paired_dev=" libjpeg62-turbo-dev libpng-dev zlib1g-dev "

mkdir -p "$prefix"
prefix=$(cd "$prefix" && pwd)
lists=$(mktemp -d)
trap 'rm -rf "$lists"' EXIT
for deb in "$@"; do
  [[ $deb = /* ]] || deb=$PWD/$deb
  pkg=$(basename "$deb")
  pkg=${pkg%%_*}
  if command -v dpkg-deb >/dev/null; then
    dpkg-deb -x "$deb" "$prefix"
    [[ $paired_dev != *" $pkg "* ]] || dpkg-deb --fsys-tarfile "$deb" | tar -t > "$lists/$pkg"
  else  # a .deb is an ar archive holding data.tar.*
    (cd "$lists" && rm -rf deb && mkdir deb && cd deb && ar x "$deb" && tar -xf data.tar.* -C "$prefix" &&
      if [[ $paired_dev = *" $pkg "* ]]; then tar -tf data.tar.* > "$lists/$pkg"; fi)
  fi
done
# The package scripts that would make these links do not run: Debian's alternatives.
for tool in mpicc mpirun mpiexec; do
  if [[ -e $P/bin/$tool.openmpi ]]; then ln -sf "$tool.openmpi" "$P/bin/$tool"; fi
done
# Debian's h5cc names its install prefix in its text ("modify them accordingly").
# Its static-link library list (-lcrypto -lcurl -lsz ...) names development files the bundle leaves
# out; a shared link needs none of them (libhdf5.so records its own).
if [[ -f $P/bin/h5cc ]]; then
  sed -i -e "s|^prefix=\"/usr\"|prefix=\"$P\"|" -e 's|^H5BLD_LIBS=.*|H5BLD_LIBS="-lz -ldl -lm"|' "$P/bin/h5cc"
fi

# ---- 2. header and binary from one place
keep=()  # name patterns of run-time libraries that stay whatever the machine has (lib*.so.*)
for list in "$lists"/*; do
  [[ -f $list && $use_bundle != always ]] || continue
  pkg=$(basename "$list")
  mapfile -t entries < <(sed -e 's|^\./||' -e '/\/$/d' -e '/^$/d' "$list")
  headers=() links=()
  for e in "${entries[@]}"; do
    case $e in
      usr/include/*) headers+=("$e") ;;
      usr/lib/*/lib*.so | usr/lib/lib*.so) links+=("$e") ;;
    esac
  done
  lacks=""
  for e in "${headers[@]}" "${links[@]}"; do
    [[ -e $machine/$e ]] || { lacks=/$e; break; }  # -e: a link must lead to its run-time library
  done
  if [[ -z $lacks ]]; then
    removed=0
    for e in "${entries[@]}"; do
      if [[ -e $prefix/$e || -L $prefix/$e ]] && [[ ! -d $prefix/$e || -L $prefix/$e ]]; then
        rm -f "$prefix/$e"
        removed=$((removed + 1))
      fi
    done
    echo "bundle: $pkg: the machine's own headers and library (the package's $removed files left out of the prefix)"
  else
    for e in "${links[@]}"; do keep+=("$(basename "$e").*"); done
    echo "bundle: $pkg: the bundle's headers with the bundle's own library (the machine lacks $lacks)"
  fi
done

# ---- 3. the machine's own run-time libraries win where it has them
declare -A system_lib=()  # soname -> path, as the machine's dynamic linker knows them
while read -r soname path; do
  [[ -n ${system_lib[$soname]:-} ]] || system_lib[$soname]=$path
done < <(ldconfig -p | awk '/x86-64/ && /=>/ {print $1, $NF}')
if [[ $use_bundle != always ]]; then
  kept=0 dropped=0
  for dir in "$L" "$prefix/lib/x86_64-linux-gnu"; do
    for f in "$dir"/lib*.so.*; do
      [[ -e $f || -L $f ]] || continue
      name=$(basename "$f") own=0
      for pattern in ${keep[@]+"${keep[@]}"}; do
        # shellcheck disable=SC2053  # a glob pattern
        if [[ $name == $pattern ]]; then own=1; fi
      done
      if ((own == 0)) && [[ -n ${system_lib[$name]:-} ]]; then rm -f "$f"; dropped=$((dropped + 1)); else kept=$((kept + 1)); fi
    done
  done
  echo "bundle: kept $kept shared libraries, uses the machine's own for $dropped"
fi
# Absolute links (zlib1g-dev's libz.so -> /lib/x86_64-linux-gnu/libz.so.1.2.13) move into the prefix where
# it has their target, even where the machine has a file of that name; development links that then point
# nowhere, to a dropped library, go to the machine's copy.
while read -r link; do
  target=$(readlink "$link")
  if [[ $target = /* && ( -e $prefix$target || -L $prefix$target ) ]]; then
    ln -sfn "$prefix$target" "$link"
  fi
  [[ -e $link ]] && continue
  base=$(basename "$link") replacement=${system_lib[$(basename "$target")]:-}
  for soname in "${!system_lib[@]}"; do
    [[ -z $replacement && $soname == "$base".* && ${soname#"$base".} =~ ^[0-9]+$ ]] && replacement=${system_lib[$soname]}
  done
  if [[ -n $replacement ]]; then ln -sfn "$replacement" "$link"; else echo "bundle: $link points nowhere ($target)"; fi
done < <(find "$prefix" -type l -path '*/lib/*')
