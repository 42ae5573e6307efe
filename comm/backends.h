// comm/backends.h (internal): one factory per backend, each defined in its own source file; CMake picks
// comm/nccl.cpp or comm/nccl_none.cpp by whether the CUDA path is built.
#pragma once

#include <memory>

#include "comm/communicator.h"
#include "comm/p2p.h"

namespace ringtrain::comm {

// Owned by make_communicator, which wraps them in a CommunicatorPtr whose deleter asks release_local().
std::unique_ptr<Communicator> make_ring_communicator(MPI_Comm parent, const CommOptions& options);
std::unique_ptr<Communicator> make_hierarchical_communicator(MPI_Comm parent, const CommOptions& options);
std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm parent, const CommOptions& options);
std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm parent, const CommOptions& options);
// comm/p2p.h's channel for GPU tensors: NCCL send/recv on a communicator and stream of its own.
std::unique_ptr<Channel> make_nccl_channel(MPI_Comm parent, const std::string& name, std::chrono::milliseconds timeout);

}  // namespace ringtrain::comm
