// comm/nccl_none.cpp: the NCCL backend of a build without the CUDA path.
#include "comm/backends.h"
#include "core/check.h"

namespace ringtrain::comm {

std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm, const CommOptions&) {
  RT_THROW(
      "the nccl backend needs a CUDA build (this ringtrain was configured with RINGTRAIN_CUDA=OFF "
      "or without nvcc/NCCL); use --backend ring or mpi");
}

std::unique_ptr<Channel> make_nccl_channel(MPI_Comm, const std::string& name, std::chrono::milliseconds) {
  RT_THROW("the ", name, " channel carries GPU tensors by NCCL, which needs a CUDA build (this ringtrain was ",
           "configured with RINGTRAIN_CUDA=OFF or without nvcc/NCCL)");
}

}  // namespace ringtrain::comm
