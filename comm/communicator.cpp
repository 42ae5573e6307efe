// comm/communicator.cpp: the parts of Communicator every backend shares, and the factory.
#include "comm/communicator.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "comm/backends.h"
#include "comm/mpi_check.h"
#include "comm/world.h"
#include "core/check.h"

namespace ringtrain::comm {

Backend parse_backend(const std::string& name) {
  if (name == "ring") return Backend::Ring;
  if (name == "hierarchical") return Backend::Hierarchical;
  if (name == "mpi") return Backend::Mpi;
  if (name == "nccl") return Backend::Nccl;
  RT_THROW("unknown communication backend '", name, "' (expected ring, hierarchical, mpi or nccl)");
}

const char* backend_name(Backend b) {
  switch (b) {
    case Backend::Ring:
      return "ring";
    case Backend::Mpi:
      return "mpi";
    case Backend::Nccl:
      return "nccl";
    case Backend::Hierarchical:
      return "hierarchical";
  }
  return "?";
}

Backend auto_backend(const World& world, Device device) {
  if (device.is_cuda()) return Backend::Nccl;
  return world.num_nodes() > 1 && world.local_size() > 1 && world.nodes_uniform() ? Backend::Hierarchical
                                                                                  : Backend::Ring;
}

std::string Communicator::describe() const {
  return detail::str_cat(backend_name(backend()), " over ", size_, " rank(s)");
}

std::pair<int64_t, int64_t> Communicator::shard(int64_t count) const { return even_shard(count, rank_, size_); }

namespace {

// Several operations waited for as one.
class AllWork final : public Work {
 public:
  explicit AllWork(std::vector<WorkPtr> parts) : parts_(std::move(parts)) {}
  void wait() override {
    for (auto& w : parts_) w->wait();
  }
  bool test() override {
    return std::all_of(parts_.begin(), parts_.end(), [](const WorkPtr& w) { return w->test(); });
  }

 private:
  std::vector<WorkPtr> parts_;
};

}  // namespace

WorkPtr Communicator::reduce_scatter_shard_async(const Tensor& t, ReduceOp op) { return all_reduce_async(t, op); }

WorkPtr Communicator::all_gather_shard_async(const Tensor& t) {
  check_collective_tensor("all_gather_shard", t, rank_);
  const Tensor flat = t.flatten();
  std::vector<WorkPtr> parts;
  for (int r = 0; r < size_; ++r) {
    const auto [first, last] = even_shard(flat.numel(), r, size_);
    if (last > first) parts.push_back(broadcast_async(flat.slice(first, last), r));
  }
  return std::make_shared<AllWork>(std::move(parts));
}

Communicator::Communicator(MPI_Comm parent) {
  int initialized = 0;
  MPI_CHECK(MPI_Initialized(&initialized));
  RT_CHECK(initialized, "a communicator needs MPI: call comm::World::init first");
  MPI_CHECK(MPI_Comm_dup(parent, &comm_));
  MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  MPI_CHECK(MPI_Comm_size(comm_, &size_));
}

void Communicator::free_comm() noexcept {
  int finalized = 0;
  MPI_Finalized(&finalized);
  sub_comms_.push_back(comm_);
  for (MPI_Comm& c : sub_comms_)
    if (c != MPI_COMM_NULL && !finalized) MPI_Comm_free(&c);
  sub_comms_.clear();
  comm_ = MPI_COMM_NULL;
}

CommunicatorPtr make_communicator(Backend backend, MPI_Comm parent, const CommOptions& options) {
  RT_CHECK(options.chunk_bytes >= 64 && options.chunk_bytes <= (int64_t{1} << 30),
           "chunk size (CommOptions.chunk_bytes, --chunk-bytes) must be between 64 bytes and 1 GiB, got ",
           options.chunk_bytes);
  RT_CHECK(options.pipeline_depth >= 1, "CommOptions.pipeline_depth must be at least 1, got ", options.pipeline_depth);
  RT_CHECK(
      options.net_chunk_bytes >= 64 && options.net_chunk_bytes <= (int64_t{1} << 30),
      "network chunk size (CommOptions.net_chunk_bytes, --net-chunk-bytes) must be between 64 bytes and 1 GiB, got ",
      options.net_chunk_bytes);
  RT_CHECK(options.net_pipeline_depth >= 1, "CommOptions.net_pipeline_depth must be at least 1, got ",
           options.net_pipeline_depth);
  RT_CHECK(options.node_size >= 0, "CommOptions.node_size must be 0 (the real nodes) or ranks per node, got ",
           options.node_size);
  std::unique_ptr<Communicator> made;
  switch (backend) {
    case Backend::Ring:
      made = make_ring_communicator(parent, options);
      break;
    case Backend::Mpi:
      made = make_mpi_communicator(parent, options);
      break;
    case Backend::Nccl:
      made = make_nccl_communicator(parent, options);
      break;
    case Backend::Hierarchical:
      made = make_hierarchical_communicator(parent, options);
      break;
  }
  RT_CHECK(made, "make_communicator: bad backend");
  // Destruction never blocks: an object whose thread is stuck in MPI is leaked instead (release_local).
  return CommunicatorPtr(made.release(), [](Communicator* c) {
    if (c->release_local()) delete c;
  });
}

}  // namespace ringtrain::comm
