// comm/ring.cpp: the ring backend, our own all-reduce over MPI point-to-point.
//
// All-reduce = reduce-scatter + all-gather around the ring rank -> rank+1. The buffer is cut into one
// segment per rank (sizes differ by at most one element, so any count works: 0, 1, fewer than ranks).
// Reduce-scatter takes n-1 steps: at step s a rank sends segment (rank - s) and receives segment
// (rank - s - 1), adding it into its own copy; it then owns the full sum of segment rank + 1. All-gather
// passes the finished segments on for n-1 more steps.
//
// Pipelining: segments are cut into chunks (CommOptions.chunk_bytes; net_chunk_bytes on a ring whose
// neighbours are on other nodes, below Open MPI's TCP eager limit: a larger message waits for a rendezvous
// handshake whose reply queues behind the data on a busy link, which cost a quarter of a 1 Gbit/s link's
// bandwidth, docs/SCALING.md). Every send and receive is
// non-blocking; the moment a received chunk is reduced it is sent on for the next step, so sending,
// receiving and reducing overlap across chunks and steps. Receives land in `pipeline_depth` staging
// buffers (reduce-scatter) or straight in place (all-gather). Messages of step s carry tag s on the
// communicator's private duplicate, so they cannot match anything else. The two phases of an all-reduce
// are one pipeline (ring_reduce): a chunk is passed on as all-gather traffic the moment it is final.
//
// Hierarchical (Backend::Hierarchical, the automatic choice when ranks share nodes across several nodes):
// the same ring, run on three communicators. With P ranks on each of N nodes, the all-reduce is
//   1. a reduce-scatter inside the node (shared memory): local rank l ends with the node's sum of slice l;
//   2. an all-reduce of slice l among the N ranks of local rank l, one per node (the "rail" of l): every
//      local rank drives its own 1/P of the inter-node traffic, so the node's link carries 2(N-1)/N * B
//      each way instead of the flat ring's 2(n-1)/n * B (B is the buffer, n = N*P);
//   3. an all-gather inside the node.
// Every rank ends with the same bits (each slice is final once, on its rail, then only copied). The sum's
// order differs from the flat ring's, so the two agree to rounding, not bit for bit. Nodes holding
// different numbers of ranks, one node, or one rank per node: the flat ring over every rank.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "comm/backends.h"
#include "comm/host_collectives.h"
#include "comm/host_comm.h"
#include "comm/mpi_check.h"
#include "comm/polite_wait.h"
#include "core/check.h"

namespace ringtrain::comm {
namespace {

// Waits for a request without hogging a core (polite_wait.h): `max_pause` is 100 us inside a node; 1 ms
// between nodes, where a slow link would otherwise wake this thread every 100 us for the whole of
// backward, each wake-up preempting the compute thread on its core. MPI makes progress, including the
// single-copy (CMA) transfers, inside MPI_Test.
// For receives, `expected_bytes` >= 0 checks the message's size: a shorter message means the ranks are
// not running the same operation (different sizes or a different sequence), an error instead of
// silently wrong data.
// `owner` being cancelled (release_local: the communicator is destroyed while an error unwinds) ends the
// wait with an error instead of waiting for a peer that may never come.
void wait_polite(const HostCommunicator& owner, MPI_Request* request, std::chrono::microseconds max_pause,
                 int64_t expected_bytes = -1) {
  MPI_Status status;
  wait_politely(request, &status, max_pause, [&] {
    if (owner.cancelled())
      RT_THROW("ring: cancelled (the communicator was destroyed while this rank waited for a peer)");
  });
  if (expected_bytes < 0) return;
  int got = 0;
  MPI_CHECK(MPI_Get_count(&status, MPI_BYTE, &got));
  if (got != expected_bytes)
    RT_THROW("ring: received ", got, " bytes from rank ", status.MPI_SOURCE, " where ", expected_bytes,
             " were expected: the ranks are not running the same collective (sizes or order differ)");
}

// One ring: a communicator and this rank's place in it.
struct Ring {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0, size = 1;
  int64_t chunk_bytes = 0;                   // bytes per message
  int depth = 1;                             // receives in flight
  std::chrono::microseconds max_pause{100};  // the longest sleep between polls of a pending message
  int right() const { return (rank + 1) % size; }
  int left() const { return (rank + size - 1) % size; }
  int wrap(int k) const { return ((k % size) + size) % size; }
};

std::vector<int64_t> balanced_segments(int64_t count, int parts) {
  std::vector<int64_t> offs(parts + 1);
  for (int r = 0; r <= parts; ++r) offs[r] = count * r / parts;
  return offs;
}

class RingCommunicator final : public HostCommunicator {
 public:
  RingCommunicator(MPI_Comm parent, const CommOptions& options, bool hierarchical)
      : HostCommunicator(parent, options), world_{comm_, rank_, size_, options.chunk_bytes, options.pipeline_depth} {
    split_nodes(hierarchical);
  }
  ~RingCommunicator() override { stop_for_destruction(); }
  Backend backend() const override { return requested_hierarchical_ ? Backend::Hierarchical : Backend::Ring; }
  std::string describe() const override {
    if (hierarchical_)
      return detail::str_cat("hierarchical: ", rail_.size, " nodes x ", node_.size, " ranks (rings inside each node, ",
                             node_.size, " rails across nodes)");
    if (!requested_hierarchical_) return detail::str_cat("ring over ", size_, " rank(s)");
    return detail::str_cat("hierarchical asked, flat ring over ", size_, " rank(s): ", flat_reason_);
  }

  // After ring_reduce with shift 0 rank r owns segment r + 1; hierarchically, its rail's segment
  // rail_rank + 1 of the node's slice local_rank.
  std::pair<int64_t, int64_t> shard(int64_t count) const override {
    if (size_ == 1) return {0, count};
    if (!hierarchical_) {
      const auto offs = balanced_segments(count, size_);
      const int k = world_.wrap(rank_ + 1);
      return {offs[k], offs[k + 1]};
    }
    const auto slices = balanced_segments(count, node_.size);
    const int64_t first = slices[node_.rank], length = slices[node_.rank + 1] - first;
    const auto offs = balanced_segments(length, rail_.size);
    const int k = rail_.wrap(rail_.rank + 1);
    return {first + offs[k], first + offs[k + 1]};
  }

 protected:
  void host_all_reduce(void* data, int64_t count, DType dtype, ReduceOp op) override {
    if (size_ == 1 || count == 0) return;
    reduce(static_cast<char*>(data), count, dtype, op, true);
    // 3. Inside the node: every local rank's finished slice to every local rank.
    if (hierarchical_)
      all_gather_phase(node_, static_cast<char*>(data), balanced_segments(count, node_.size), dtype_size(dtype),
                       node_.size - 1);
  }

  // The first half of host_all_reduce, stopped where every rank owns its final segment.
  void host_reduce_scatter_shard(void* data, int64_t count, DType dtype, ReduceOp op) override {
    if (size_ == 1 || count == 0) return;
    reduce(static_cast<char*>(data), count, dtype, op, false);
  }

  // The second half: the all-gathers host_all_reduce runs after its reductions.
  void host_all_gather_shard(void* data, int64_t count, DType dtype) override {
    if (size_ == 1 || count == 0) return;
    char* d = static_cast<char*>(data);
    const int64_t es = dtype_size(dtype);
    if (!hierarchical_) return all_gather_phase(world_, d, balanced_segments(count, size_), es, 0);
    const std::vector<int64_t> slices = balanced_segments(count, node_.size);
    const int64_t first = slices[node_.rank], length = slices[node_.rank + 1] - first;
    if (length > 0) all_gather_phase(rail_, d + first * es, balanced_segments(length, rail_.size), es, 0);
    all_gather_phase(node_, d, slices, es, node_.size - 1);
  }

  void host_broadcast(void* data, int64_t bytes, int root) override {
    for (int64_t done = 0; done < bytes;) {
      const int n = static_cast<int>(std::min<int64_t>(bytes - done, int64_t{1} << 30));
      MPI_CHECK(MPI_Bcast(static_cast<char*>(data) + done, n, MPI_BYTE, root, comm_));
      done += n;
    }
  }

  void host_all_gather(const void* in, void* out, int64_t bytes_per_rank) override {
    char* o = static_cast<char*>(out);
    if (bytes_per_rank > 0) std::memcpy(o + rank_ * bytes_per_rank, in, static_cast<size_t>(bytes_per_rank));
    if (size_ == 1 || bytes_per_rank == 0) return;
    std::vector<int64_t> offs(size_ + 1);
    for (int r = 0; r <= size_; ++r) offs[r] = r * bytes_per_rank;
    // shift n-1: rank r starts out owning block r.
    all_gather_phase(world_, o, offs, 1, size_ - 1);
  }

  void host_reduce_scatter(const void* in, void* out, int64_t count_per_rank, DType dtype, ReduceOp op) override {
    const int64_t es = dtype_size(dtype);
    if (count_per_rank == 0) return;
    if (size_ == 1) {
      std::memcpy(out, in, static_cast<size_t>(count_per_rank * es));
      return;
    }
    work_.resize(static_cast<size_t>(count_per_rank * es * size_));
    std::memcpy(work_.data(), in, work_.size());
    std::vector<int64_t> offs(size_ + 1);
    for (int r = 0; r <= size_; ++r) offs[r] = r * count_per_rank;
    // shift n-1: rank r ends owning block r.
    ring_reduce(world_, work_.data(), offs, dtype, op, size_, size_ - 1, false);
    std::memcpy(out, work_.data() + rank_ * count_per_rank * es, static_cast<size_t>(count_per_rank * es));
  }

 private:
  struct Piece {
    int step;
    int64_t offset, length;  // elements (bytes when the element size is 1)
  };

  // The reductions of an all-reduce: the flat ring's (its all-gather fused in with `gather`), or
  // hierarchically 1. inside the node (local rank l ends with the node's sum of slice l: shift P-1 makes
  // it slice l) and 2. across nodes on this local rank's rail (slice l's full reduction, averaged once,
  // by every rank; with `gather` the rail's all-gather too). Step 3, the all-gather inside the node, is
  // the caller's.
  void reduce(char* d, int64_t count, DType dtype, ReduceOp op, bool gather) {
    if (!hierarchical_) return ring_reduce(world_, d, balanced_segments(count, size_), dtype, op, size_, 0, gather);
    const int64_t es = dtype_size(dtype);
    const std::vector<int64_t> slices = balanced_segments(count, node_.size);
    ring_reduce(node_, d, slices, dtype, ReduceOp::Sum, 1, node_.size - 1, false);
    const int64_t first = slices[node_.rank], length = slices[node_.rank + 1] - first;
    if (length > 0)
      ring_reduce(rail_, d + first * es, balanced_segments(length, rail_.size), dtype, op, size_, 0, gather);
  }

  // Learns the nodes (collective over every rank): a ring with neighbours on other nodes sends messages of
  // CommOptions.net_chunk_bytes. Hierarchical: keeps the node and rail communicators, and stays flat
  // (hierarchical_ false) when nodes hold different numbers of ranks or when either level has one rank.
  void split_nodes(bool hierarchical) {
    requested_hierarchical_ = hierarchical;
    MPI_Comm node = MPI_COMM_NULL, rail = MPI_COMM_NULL;
    if (options_.node_size > 0)
      MPI_CHECK(MPI_Comm_split(comm_, rank_ / options_.node_size, rank_, &node));
    else
      MPI_CHECK(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
    sub_comms_.push_back(node);  // freed with the communicator, or below
    int local_rank = 0, local_size = 1;
    MPI_CHECK(MPI_Comm_rank(node, &local_rank));
    MPI_CHECK(MPI_Comm_size(node, &local_size));
    const int64_t mine = local_size;
    const bool uniform = same_on_every_rank(comm_, std::span<const int64_t>(&mine, 1));
    const bool several_nodes = !uniform || local_size < size_;  // nodes of different sizes are several
    if (several_nodes) set_network(world_);
    if (!hierarchical) {
      MPI_CHECK(MPI_Comm_free(&node));
      sub_comms_.clear();
      return;
    }
    MPI_CHECK(MPI_Comm_split(comm_, local_rank, rank_, &rail));
    sub_comms_.push_back(rail);
    node_ = {node, local_rank, local_size, options_.chunk_bytes, options_.pipeline_depth};
    rail_ = {rail, 0, 1, options_.chunk_bytes, options_.pipeline_depth};
    MPI_CHECK(MPI_Comm_rank(rail, &rail_.rank));
    MPI_CHECK(MPI_Comm_size(rail, &rail_.size));
    set_network(rail_);
    for (MPI_Comm c : {node, rail}) MPI_CHECK(MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN));
    hierarchical_ = uniform && node_.size > 1 && rail_.size > 1;
    if (!uniform)
      flat_reason_ = "the nodes hold different numbers of ranks";
    else if (rail_.size == 1)
      flat_reason_ = "one node";
    else if (node_.size == 1)
      flat_reason_ = "one rank per node";
  }
  void set_network(Ring& g) const {
    g.chunk_bytes = std::min(options_.chunk_bytes, options_.net_chunk_bytes);
    g.depth = std::max(options_.pipeline_depth, options_.net_pipeline_depth);
    g.max_pause = std::chrono::microseconds(1000);
  }

  static int64_t chunk_elems(const Ring& g, int64_t es) { return std::max<int64_t>(1, g.chunk_bytes / es); }

  // The chunks of segment k, tagged with `step`, appended in order.
  void append_chunks(std::vector<Piece>& out, const std::vector<int64_t>& offs, int k, int step, int64_t ce) const {
    for (int64_t o = offs[k]; o < offs[k + 1]; o += ce) out.push_back({step, o, std::min(ce, offs[k + 1] - o)});
  }

  void isend(const Ring& g, const char* base, const Piece& p, int64_t es, int tag) {
    sends_.emplace_back();
    MPI_CHECK(MPI_Isend(base + p.offset * es, static_cast<int>(p.length * es), MPI_BYTE, g.right(), tag, g.comm,
                        &sends_.back()));
  }

  void wait_sends(const Ring& g) {
    for (MPI_Request& r : sends_) wait_polite(*this, &r, g.max_pause);
    sends_.clear();
  }

  // Reduce-scatter over ring g: afterwards rank r owns the full reduction (divided by `divisor` for Average) of segment
  // (r + 1 + shift) mod n. With `gather`, the all-gather runs in the same pipeline: the moment a chunk of
  // the owned segment is final it goes out as all-gather traffic, while it is still hot in cache and
  // while the rest of the reduce-scatter is in flight; the all-gather receives are posted up front,
  // straight into place. (A segment's final values can only arrive after this rank's own contribution
  // to it has been received downstream, so nothing lands on data that is still being read.)
  void ring_reduce(const Ring& g, char* data, const std::vector<int64_t>& offs, DType dtype, ReduceOp op, int divisor,
                   int shift, bool gather) {
    const int64_t es = dtype_size(dtype), ce = chunk_elems(g, es);
    const int n = g.size, ag_tag0 = n;
    std::vector<Piece> first, recvs, gathers;
    append_chunks(first, offs, g.wrap(g.rank + shift), 0, ce);
    for (int s = 0; s + 1 < n; ++s) append_chunks(recvs, offs, g.wrap(g.rank + shift - s - 1), s, ce);
    if (gather)
      for (int s = 0; s + 1 < n; ++s) append_chunks(gathers, offs, g.wrap(g.rank + shift - s), s, ce);

    std::vector<MPI_Request> gather_req(gathers.size(), MPI_REQUEST_NULL);
    for (size_t i = 0; i < gathers.size(); ++i)
      MPI_CHECK(MPI_Irecv(data + gathers[i].offset * es, static_cast<int>(gathers[i].length * es), MPI_BYTE, g.left(),
                          ag_tag0 + gathers[i].step, g.comm, &gather_req[i]));
    sends_.clear();
    for (const Piece& p : first) isend(g, data, p, es, 0);

    const int depth = g.depth;
    staging_.resize(static_cast<size_t>(depth * ce * es));
    std::vector<MPI_Request> recv_req(depth, MPI_REQUEST_NULL);
    auto post = [&](size_t i) {
      const int slot = static_cast<int>(i % depth);
      MPI_CHECK(MPI_Irecv(staging_.data() + slot * ce * es, static_cast<int>(recvs[i].length * es), MPI_BYTE, g.left(),
                          recvs[i].step, g.comm, &recv_req[slot]));
    };
    for (size_t i = 0; i < recvs.size() && i < static_cast<size_t>(depth); ++i) post(i);
    for (size_t i = 0; i < recvs.size(); ++i) {
      const int slot = static_cast<int>(i % depth);
      const Piece& p = recvs[i];
      wait_polite(*this, &recv_req[slot], g.max_pause, p.length * es);
      reduce_sum_into(data + p.offset * es, staging_.data() + slot * ce * es, p.length, dtype);
      if (i + depth < recvs.size()) post(i + depth);
      if (p.step + 2 < n) {
        isend(g, data, p, es, p.step + 1);  // reduce-scatter: on to the next step
        continue;
      }
      // Final: this rank owns the sum of this chunk. Scale it once, here, so every rank gets these bits.
      if (op == ReduceOp::Average) scale_inplace(data + p.offset * es, p.length, dtype, divisor);
      if (gather) isend(g, data, p, es, ag_tag0);
    }
    for (size_t i = 0; i < gathers.size(); ++i) {
      const Piece& p = gathers[i];
      wait_polite(*this, &gather_req[i], g.max_pause, p.length * es);
      if (p.step + 2 < n) isend(g, data, p, es, ag_tag0 + p.step + 1);
    }
    wait_sends(g);
  }

  // Rank r starts owning segment (r + 1 + shift) mod n; after it every rank holds every segment.
  void all_gather_phase(const Ring& g, char* data, const std::vector<int64_t>& offs, int64_t es, int shift) {
    const int64_t ce = chunk_elems(g, es);
    const int n = g.size, tag0 = n;
    std::vector<Piece> first;
    append_chunks(first, offs, g.wrap(g.rank + 1 + shift), 0, ce);
    std::vector<Piece> recvs;
    for (int s = 0; s + 1 < n; ++s) append_chunks(recvs, offs, g.wrap(g.rank + shift - s), s, ce);

    std::vector<MPI_Request> recv_req(recvs.size(), MPI_REQUEST_NULL);
    for (size_t i = 0; i < recvs.size(); ++i)
      MPI_CHECK(MPI_Irecv(data + recvs[i].offset * es, static_cast<int>(recvs[i].length * es), MPI_BYTE, g.left(),
                          tag0 + recvs[i].step, g.comm, &recv_req[i]));
    sends_.clear();
    for (const Piece& p : first) isend(g, data, p, es, tag0);
    for (size_t i = 0; i < recvs.size(); ++i) {
      const Piece& p = recvs[i];
      wait_polite(*this, &recv_req[i], g.max_pause, p.length * es);
      if (p.step + 2 < n) isend(g, data, p, es, tag0 + p.step + 1);
    }
    wait_sends(g);
  }

  Ring world_, node_, rail_;
  bool requested_hierarchical_ = false, hierarchical_ = false;
  std::string flat_reason_;
  std::vector<MPI_Request> sends_;
  std::vector<char> staging_, work_;
};

}  // namespace

std::unique_ptr<Communicator> make_ring_communicator(MPI_Comm parent, const CommOptions& options) {
  return std::make_unique<RingCommunicator>(parent, options, false);
}

std::unique_ptr<Communicator> make_hierarchical_communicator(MPI_Comm parent, const CommOptions& options) {
  return std::make_unique<RingCommunicator>(parent, options, true);
}

}  // namespace ringtrain::comm
