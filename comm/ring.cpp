// comm/ring.cpp: the ring backend, our own all-reduce over MPI point-to-point.
//
// All-reduce = reduce-scatter + all-gather around the ring rank -> rank+1. The buffer is cut into one
// segment per rank (sizes differ by at most one element, so any count works: 0, 1, fewer than ranks).
// Reduce-scatter takes n-1 steps: at step s a rank sends segment (rank - s) and receives segment
// (rank - s - 1), adding it into its own copy; it then owns the full sum of segment rank + 1. All-gather
// passes the finished segments on for n-1 more steps.
//
// Pipelining: segments are cut into chunks (CommOptions.chunk_bytes). Every send and receive is
// non-blocking; the moment a received chunk is reduced it is sent on for the next step, so sending,
// receiving and reducing overlap across chunks and steps. Receives land in `pipeline_depth` staging
// buffers (reduce-scatter) or straight in place (all-gather). Messages of step s carry tag s on the
// communicator's private duplicate, so they cannot match anything else. The two phases of an all-reduce
// are one pipeline (ring_reduce): a chunk is passed on as all-gather traffic the moment it is final.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "comm/backends.h"
#include "comm/host_comm.h"
#include "core/check.h"

namespace ringtrain::comm {
namespace {

// Waits for a request without hogging a core: MPI_Wait busy-polls, which on a fully subscribed node
// (every core running a rank's compute threads) steals the core backward is computing on while the peer
// is not ready yet. Poll briefly, then yield between polls (other runnable threads go first), then
// sleep with a growing pause (at most 100 us, well below the time a large chunk takes). MPI makes
// progress, including the single-copy (CMA) transfers, inside MPI_Test.
// For receives, `expected_bytes` >= 0 checks the message's size: a shorter message means the ranks are
// not running the same operation (different sizes or a different sequence), an error instead of
// silently wrong data.
// `owner` being cancelled (release_local: the communicator is destroyed while an error unwinds) ends the
// wait with an error instead of waiting for a peer that may never come.
void wait_polite(const HostCommunicator& owner, MPI_Request* request, int64_t expected_bytes = -1) {
  int done = 0;
  MPI_Status status;
  auto finished = [&] {
    if (expected_bytes < 0) return;
    int got = 0;
    MPI_CHECK(MPI_Get_count(&status, MPI_BYTE, &got));
    if (got != expected_bytes)
      RT_THROW("ring: received ", got, " bytes from rank ", status.MPI_SOURCE, " where ", expected_bytes,
               " were expected: the ranks are not running the same collective (sizes or order differ)");
  };
  for (int i = 0; i < 64; ++i) {
    MPI_CHECK(MPI_Test(request, &done, &status));
    if (done) return finished();
  }
  for (int i = 0; i < 256; ++i) {
    std::this_thread::yield();
    MPI_CHECK(MPI_Test(request, &done, &status));
    if (done) return finished();
  }
  auto pause = std::chrono::microseconds(10);
  for (;;) {
    if (owner.cancelled()) RT_THROW("ring: cancelled (the communicator was destroyed while this rank waited for a peer)");
    std::this_thread::sleep_for(pause);
    MPI_CHECK(MPI_Test(request, &done, &status));
    if (done) return finished();
    pause = std::min(pause * 2, std::chrono::microseconds(100));
  }
}

class RingCommunicator final : public HostCommunicator {
 public:
  RingCommunicator(MPI_Comm parent, const CommOptions& options) : HostCommunicator(parent, options) {}
  ~RingCommunicator() override { stop_for_destruction(); }
  Backend backend() const override { return Backend::Ring; }

 protected:
  void host_all_reduce(void* data, int64_t count, DType dtype, ReduceOp op) override {
    if (size_ == 1 || count == 0) return;
    ring_reduce(static_cast<char*>(data), balanced_segments(count), dtype, op, 0, true);
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
    all_gather_phase(o, offs, 1, size_ - 1);
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
    ring_reduce(work_.data(), offs, dtype, op, size_ - 1, false);
    std::memcpy(out, work_.data() + rank_ * count_per_rank * es, static_cast<size_t>(count_per_rank * es));
  }

 private:
  struct Piece {
    int step;
    int64_t offset, length;  // elements (bytes when the element size is 1)
  };

  std::vector<int64_t> balanced_segments(int64_t count) const {
    std::vector<int64_t> offs(size_ + 1);
    for (int r = 0; r <= size_; ++r) offs[r] = count * r / size_;
    return offs;
  }
  int wrap(int k) const { return ((k % size_) + size_) % size_; }
  int64_t chunk_elems(int64_t es) const { return std::max<int64_t>(1, options_.chunk_bytes / es); }

  // The chunks of segment k, tagged with `step`, appended in order.
  void append_chunks(std::vector<Piece>& out, const std::vector<int64_t>& offs, int k, int step, int64_t ce) const {
    for (int64_t o = offs[k]; o < offs[k + 1]; o += ce) out.push_back({step, o, std::min(ce, offs[k + 1] - o)});
  }

  void isend(const char* base, const Piece& p, int64_t es, int tag) {
    sends_.emplace_back();
    MPI_CHECK(MPI_Isend(base + p.offset * es, static_cast<int>(p.length * es), MPI_BYTE, right(), tag, comm_,
                        &sends_.back()));
  }
  int right() const { return (rank_ + 1) % size_; }
  int left() const { return (rank_ + size_ - 1) % size_; }

  void wait_sends() {
    for (MPI_Request& r : sends_) wait_polite(*this, &r);
    sends_.clear();
  }

  // Reduce-scatter: afterwards rank r owns the full reduction (averaged for Average) of segment
  // (r + 1 + shift) mod n. With `gather`, the all-gather runs in the same pipeline: the moment a chunk of
  // the owned segment is final it goes out as all-gather traffic, while it is still hot in cache and
  // while the rest of the reduce-scatter is in flight; the all-gather receives are posted up front,
  // straight into place. (A segment's final values can only arrive after this rank's own contribution
  // to it has been received downstream, so nothing lands on data that is still being read.)
  void ring_reduce(char* data, const std::vector<int64_t>& offs, DType dtype, ReduceOp op, int shift, bool gather) {
    const int64_t es = dtype_size(dtype), ce = chunk_elems(es);
    const int n = size_, ag_tag0 = n;
    std::vector<Piece> first, recvs, gathers;
    append_chunks(first, offs, wrap(rank_ + shift), 0, ce);
    for (int s = 0; s + 1 < n; ++s) append_chunks(recvs, offs, wrap(rank_ + shift - s - 1), s, ce);
    if (gather)
      for (int s = 0; s + 1 < n; ++s) append_chunks(gathers, offs, wrap(rank_ + shift - s), s, ce);

    std::vector<MPI_Request> gather_req(gathers.size(), MPI_REQUEST_NULL);
    for (size_t i = 0; i < gathers.size(); ++i)
      MPI_CHECK(MPI_Irecv(data + gathers[i].offset * es, static_cast<int>(gathers[i].length * es), MPI_BYTE, left(),
                          ag_tag0 + gathers[i].step, comm_, &gather_req[i]));
    sends_.clear();
    for (const Piece& p : first) isend(data, p, es, 0);

    const int depth = options_.pipeline_depth;
    staging_.resize(static_cast<size_t>(depth * ce * es));
    std::vector<MPI_Request> recv_req(depth, MPI_REQUEST_NULL);
    auto post = [&](size_t i) {
      const int slot = static_cast<int>(i % depth);
      MPI_CHECK(MPI_Irecv(staging_.data() + slot * ce * es, static_cast<int>(recvs[i].length * es), MPI_BYTE, left(),
                          recvs[i].step, comm_, &recv_req[slot]));
    };
    for (size_t i = 0; i < recvs.size() && i < static_cast<size_t>(depth); ++i) post(i);
    for (size_t i = 0; i < recvs.size(); ++i) {
      const int slot = static_cast<int>(i % depth);
      const Piece& p = recvs[i];
      wait_polite(*this, &recv_req[slot], p.length * es);
      reduce_sum_into(data + p.offset * es, staging_.data() + slot * ce * es, p.length, dtype);
      if (i + depth < recvs.size()) post(i + depth);
      if (p.step + 2 < n) {
        isend(data, p, es, p.step + 1);  // reduce-scatter: on to the next step
        continue;
      }
      // Final: this rank owns the sum of this chunk. Scale it once, here, so every rank gets these bits.
      if (op == ReduceOp::Average) scale_inplace(data + p.offset * es, p.length, dtype, n);
      if (gather) isend(data, p, es, ag_tag0);
    }
    for (size_t i = 0; i < gathers.size(); ++i) {
      const Piece& p = gathers[i];
      wait_polite(*this, &gather_req[i], p.length * es);
      if (p.step + 2 < n) isend(data, p, es, ag_tag0 + p.step + 1);
    }
    wait_sends();
  }

  // Rank r starts owning segment (r + 1 + shift) mod n; after it every rank holds every segment.
  void all_gather_phase(char* data, const std::vector<int64_t>& offs, int64_t es, int shift) {
    const int64_t ce = chunk_elems(es);
    const int n = size_, tag0 = n;
    std::vector<Piece> first;
    append_chunks(first, offs, wrap(rank_ + 1 + shift), 0, ce);
    std::vector<Piece> recvs;
    for (int s = 0; s + 1 < n; ++s) append_chunks(recvs, offs, wrap(rank_ + shift - s), s, ce);

    std::vector<MPI_Request> recv_req(recvs.size(), MPI_REQUEST_NULL);
    for (size_t i = 0; i < recvs.size(); ++i)
      MPI_CHECK(MPI_Irecv(data + recvs[i].offset * es, static_cast<int>(recvs[i].length * es), MPI_BYTE, left(),
                          tag0 + recvs[i].step, comm_, &recv_req[i]));
    sends_.clear();
    for (const Piece& p : first) isend(data, p, es, tag0);
    for (size_t i = 0; i < recvs.size(); ++i) {
      const Piece& p = recvs[i];
      wait_polite(*this, &recv_req[i], p.length * es);
      if (p.step + 2 < n) isend(data, p, es, tag0 + p.step + 1);
    }
    wait_sends();
  }

  std::vector<MPI_Request> sends_;
  std::vector<char> staging_, work_;
};

}  // namespace

std::unique_ptr<Communicator> make_ring_communicator(MPI_Comm parent, const CommOptions& options) {
  return std::make_unique<RingCommunicator>(parent, options);
}

}  // namespace ringtrain::comm
