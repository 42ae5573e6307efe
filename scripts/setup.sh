#!/usr/bin/env bash
# scripts/setup.sh: installs the Debian packages ringtrain needs (compilers and the CUDA toolkit are
# expected on the machine), then configures and builds Release into build/. Idempotent: packages
# already present are not reinstalled and an existing build/ is reused.
#
# Environment: RINGTRAIN_CUDA=AUTO|ON|OFF (default AUTO), RINGTRAIN_WERROR=ON|OFF (default OFF; CI: ON),
#              BUILD_DIR (default build), JOBS (default: number of cores).
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/debian_packages.sh
packages=("${ringtrain_tool_packages[@]}" "${ringtrain_library_packages[@]}")
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""
  [[ $(id -u) -ne 0 ]] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "setup: all Debian packages present"
fi

# nvcc is often installed but not on PATH.
if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi

# Commit messages keep their subjects at 72 characters (.githooks/commit-msg; CI: scripts/check_commits.sh).
if git rev-parse --is-inside-work-tree > /dev/null 2>&1 && [[ -z $(git config core.hooksPath || true) ]]; then
  git config core.hooksPath .githooks
fi

build_dir=${BUILD_DIR:-build}
# Only settings given in the environment are passed, so rerunning setup keeps an existing build's choices.
options=(-DCMAKE_BUILD_TYPE=Release)
[[ -n "${RINGTRAIN_CUDA:-}" ]] && options+=(-DRINGTRAIN_CUDA="$RINGTRAIN_CUDA")
[[ -n "${RINGTRAIN_WERROR:-}" ]] && options+=(-DRINGTRAIN_WERROR="$RINGTRAIN_WERROR")
cmake -S . -B "$build_dir" "${options[@]}"
cmake --build "$build_dir" -j "${JOBS:-$(nproc)}"
echo "setup: built into $build_dir/"
