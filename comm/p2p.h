// comm/p2p.h: point-to-point tensor messages for pipeline stages. A Channel carries tensors one way along
// a chain of ranks (a pipeline's activations forward, or their gradients backward): send() to a peer and
// recv() from one, both asynchronous; between two ranks a channel delivers in the order sent. CPU tensors go
// by MPI_Isend/MPI_Irecv, posted and driven by the channel's progress thread (a receive waiting for its
// message never holds up a later send, so two channels used in opposite directions cannot deadlock each
// other, and a transfer advances while the caller computes); GPU tensors by NCCL send/recv on the
// channel's own communicator and stream (CUDA builds, a GPU per rank), one per direction for the same
// reason, or, where ranks share a GPU, by MPI through host memory.
//
//   auto fwd = comm::make_channel(pipe_comm, device, "activations");
//   WorkPtr s = fwd->send(y, next_stage);        // y untouched and alive until s is done
//   fwd->recv(x_buffer, previous_stage)->wait(); // into an allocated tensor of the message's shape and dtype
//
// Messages have fixed shapes both sides know (a pipeline's boundary shapes): a receive whose size differs
// from what arrives is an error naming both. close() is the collective end; the destructor never waits.
#pragma once

#include <mpi.h>

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "core/tensor.h"

namespace ringtrain::comm {

class Channel {
 public:
  virtual ~Channel() = default;
  // Ranks of the parent communicator. `t` is read (send) or written (recv) until the Work is done.
  virtual WorkPtr send(const Tensor& t, int peer) = 0;
  virtual WorkPtr recv(const Tensor& t, int peer) = 0;
  virtual void close() = 0;
  virtual const std::string& name() const = 0;
};

// Collective over `parent`. `device`: where the tensors live (CPU: MPI; CUDA: NCCL, CUDA builds only).
std::unique_ptr<Channel> make_channel(MPI_Comm parent, Device device, const std::string& name,
                                      std::chrono::milliseconds timeout = std::chrono::minutes(30));

// Blocking: a set of named tensors of any shapes and dtypes from this rank to `dest` of `comm` (a header with
// their names, dtypes and shapes, then their bytes in one message per GiB, through host copies), and the
// matching receive, which makes CPU tensors of what arrives. For what no channel knows the shape of in
// advance: a pipeline stage's parameters and optimizer state gathered into one checkpoint.
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
void send_named(MPI_Comm comm, const NamedTensors& tensors, int dest);
NamedTensors recv_named(MPI_Comm comm, int source);

}  // namespace ringtrain::comm
