// comm/mpi_backend.cpp: the reference backend, MPI's own collectives. bf16 and f16 have no MPI type, so
// they travel as 2-byte elements with a user-defined sum (accumulated in f32 per pair, as the ring does).
#include <algorithm>
#include <mutex>

#include "comm/backends.h"
#include "comm/host_comm.h"
#include "comm/mpi_check.h"
#include "core/check.h"

namespace ringtrain::comm {
namespace {

template <typename S>
void sum16(void* in, void* inout, int* len, MPI_Datatype*) {
  reduce_sum_into(inout, in, *len, std::is_same_v<S, BFloat16> ? DType::BF16 : DType::F16);
}

struct MpiTypes {
  MPI_Datatype two_bytes = MPI_DATATYPE_NULL;
  MPI_Op sum_bf16 = MPI_OP_NULL, sum_f16 = MPI_OP_NULL;
};

const MpiTypes& mpi_types() {
  static std::once_flag once;
  static MpiTypes t;
  std::call_once(once, [] {
    MPI_CHECK(MPI_Type_contiguous(2, MPI_BYTE, &t.two_bytes));
    MPI_CHECK(MPI_Type_commit(&t.two_bytes));
    MPI_CHECK(MPI_Op_create(&sum16<BFloat16>, 1, &t.sum_bf16));
    MPI_CHECK(MPI_Op_create(&sum16<Half>, 1, &t.sum_f16));
  });
  return t;
}

// The MPI element type and sum for a reducible dtype.
std::pair<MPI_Datatype, MPI_Op> mpi_sum(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return {MPI_FLOAT, MPI_SUM};
    case DType::F64:
      return {MPI_DOUBLE, MPI_SUM};
    case DType::I32:
      return {MPI_INT32_T, MPI_SUM};
    case DType::I64:
      return {MPI_INT64_T, MPI_SUM};
    case DType::BF16:
      return {mpi_types().two_bytes, mpi_types().sum_bf16};
    case DType::F16:
      return {mpi_types().two_bytes, mpi_types().sum_f16};
    default:
      RT_THROW("mpi backend: dtype ", dtype, " cannot be reduced");
  }
}

constexpr int64_t kMaxCount = int64_t{1} << 30;  // MPI counts are int

class MpiCommunicator final : public HostCommunicator {
 public:
  MpiCommunicator(MPI_Comm parent, const CommOptions& options) : HostCommunicator(parent, options) {}
  ~MpiCommunicator() override { stop_for_destruction(); }
  Backend backend() const override { return Backend::Mpi; }

 protected:
  void host_all_reduce(void* data, int64_t count, DType dtype, ReduceOp op) override {
    const auto [type, sum] = mpi_sum(dtype);
    const int64_t es = dtype_size(dtype);
    for (int64_t done = 0; done < count;) {
      const int n = static_cast<int>(std::min(count - done, kMaxCount));
      MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, static_cast<char*>(data) + done * es, n, type, sum, comm_));
      done += n;
    }
    if (op == ReduceOp::Average) scale_inplace(data, count, dtype, size_);
  }
  void host_broadcast(void* data, int64_t bytes, int root) override {
    for (int64_t done = 0; done < bytes;) {
      const int n = static_cast<int>(std::min(bytes - done, kMaxCount));
      MPI_CHECK(MPI_Bcast(static_cast<char*>(data) + done, n, MPI_BYTE, root, comm_));
      done += n;
    }
  }
  void host_all_gather(const void* in, void* out, int64_t bytes_per_rank) override {
    RT_CHECK(bytes_per_rank <= kMaxCount, "mpi backend: all_gather of ", bytes_per_rank,
             " bytes per rank exceeds MPI's int count");
    MPI_CHECK(MPI_Allgather(in, static_cast<int>(bytes_per_rank), MPI_BYTE, out, static_cast<int>(bytes_per_rank),
                            MPI_BYTE, comm_));
  }
  void host_reduce_scatter(const void* in, void* out, int64_t count_per_rank, DType dtype, ReduceOp op) override {
    RT_CHECK(count_per_rank <= kMaxCount, "mpi backend: reduce_scatter of ", count_per_rank,
             " elements per rank exceeds MPI's int count");
    const auto [type, sum] = mpi_sum(dtype);
    MPI_CHECK(MPI_Reduce_scatter_block(in, out, static_cast<int>(count_per_rank), type, sum, comm_));
    if (op == ReduceOp::Average) scale_inplace(out, count_per_rank, dtype, size_);
  }
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm parent, const CommOptions& options) {
  return std::make_unique<MpiCommunicator>(parent, options);
}

}  // namespace ringtrain::comm
