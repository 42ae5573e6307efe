# scripts/debian_packages.sh: the Debian packages ringtrain needs, sourced by scripts/setup.sh (installs
# them) and scripts/gpu_bundle.sh (downloads the libraries' closure for a GPU machine without them).
# shellcheck shell=bash

# Libraries and headers the build links against or includes.
ringtrain_library_packages=(
  libopenmpi-dev openmpi-bin
  libhdf5-dev
  libopenblas-dev
  libdnnl-dev ocl-icd-opencl-dev  # oneDNN's CMake config requires OpenCL (headers and libOpenCL.so)
  libgtest-dev libgmock-dev
  libcli11-dev nlohmann-json3-dev libfmt-dev
  zlib1g-dev libjpeg62-turbo-dev libpng-dev
)
# Build tools, Python for golden dumps, peers and interop, and the demo's data.
ringtrain_tool_packages=(
  cmake make g++ pkg-config
  python3 python3-torch python3-torchvision python3-h5py python3-matplotlib
  dataset-fashion-mnist
  iproute2 hostname util-linux  # the emulated cluster (scripts/cluster.sh): ip, tc, bridge, unshare
  slurmctld slurmd slurm-client munge  # real Slurm on the emulated nodes (cluster.sh up N --slurm)
  clang-format                  # scripts/check_format.sh (CI): the sources as .clang-format lays them out
)
