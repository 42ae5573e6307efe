// comm/backends.h (internal): one factory per backend, each defined in its own source file; CMake picks
// comm/nccl.cpp or comm/nccl_none.cpp by whether the CUDA path is built.
#pragma once

#include "comm/communicator.h"

namespace ringtrain::comm {

CommunicatorPtr make_ring_communicator(MPI_Comm parent, const CommOptions& options);
CommunicatorPtr make_mpi_communicator(MPI_Comm parent, const CommOptions& options);
CommunicatorPtr make_nccl_communicator(MPI_Comm parent, const CommOptions& options);

}  // namespace ringtrain::comm
