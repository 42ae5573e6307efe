// comm/p2p.cpp: the MPI channel (CPU tensors, and GPU tensors through host memory where ranks share a GPU);
// GPU tensors of ranks with a GPU each go to the NCCL channel (nccl.cpp).
#include "comm/p2p.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "comm/backends.h"
#include "comm/mpi_check.h"
#include "comm/polite_wait.h"
#include "core/check.h"

namespace ringtrain::comm {
namespace {

// A message to a rank on this node goes whole (pieces of at most an int's count of bytes); to another
// node in pieces below Open MPI's TCP eager limit, as the ring sends them (comm/ring.cpp): a larger message
// would wait for a rendezvous reply queued behind data on a busy link.
constexpr int64_t kNodePieceBytes = int64_t{1} << 30;
constexpr int64_t kNetPieceBytes = 64000;

// One send or receive: its pieces' requests live on the channel's progress thread; the caller's Work
// watches `state`.
struct Message {
  std::string what;
  Tensor keep;  // alive until the message is done
  char* bytes = nullptr;
  int64_t nbytes = 0, piece = 0;
  int peer = 0;
  MPI_Comm comm = MPI_COMM_NULL;
  bool sending = false;
  std::atomic<int> state{0};  // 0 on its way, 1 done, 2 failed (error says why)
  std::string error;
  Tensor device_target;  // a GPU tensor received through host memory (`keep`): copied in once done
  bool copied = false;
};

// After a message is done: a staged receive lands in its GPU tensor; a failure is raised.
void finish(Message& m) {
  if (m.state.load(std::memory_order_acquire) == 2) RT_THROW(m.error);
  if (m.device_target.defined() && !m.copied) {
    Tensor(m.device_target).copy_(m.keep);
    m.copied = true;
  }
}

// The polite wait of the ring (spin, yield, then sleeps of at most 200 us: comm/polite_wait.h) on a
// message's state, which the channel's progress thread sets.
class MpiChannelWork final : public Work {
 public:
  explicit MpiChannelWork(std::shared_ptr<Message> m) : m_(std::move(m)) {}
  void wait() override {
    wait_politely_until([this] { return test(); }, std::chrono::microseconds(200));
    finish(*m_);
  }
  bool test() override { return m_->state.load(std::memory_order_acquire) != 0; }

 private:
  std::shared_ptr<Message> m_;
};

// Sends and receives are posted and driven by a progress thread of the channel's own (MPI_THREAD_MULTIPLE),
// so a transfer advances while the caller computes: a large message over TCP needs its sender inside MPI to
// move, and a stage computing its next micro-batch is not. Without MPI_THREAD_MULTIPLE the caller's
// thread posts and polls them itself (transfers then advance only while it waits).
class MpiChannel final : public Channel {
 public:
  MpiChannel(MPI_Comm parent, std::string name) : name_(std::move(name)) {
    MPI_CHECK(MPI_Comm_dup(parent, &comm_));
    MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    MPI_CHECK(MPI_Comm_size(comm_, &size_));
    // Which ranks share this node (their pieces can be large).
    MPI_Comm node = MPI_COMM_NULL;
    MPI_CHECK(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
    MPI_Group mine = MPI_GROUP_NULL, all = MPI_GROUP_NULL;
    MPI_CHECK(MPI_Comm_group(node, &mine));
    MPI_CHECK(MPI_Comm_group(comm_, &all));
    int n = 0;
    MPI_CHECK(MPI_Group_size(mine, &n));
    std::vector<int> local(static_cast<size_t>(n)), in_all(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) local[static_cast<size_t>(i)] = i;
    MPI_CHECK(MPI_Group_translate_ranks(mine, n, local.data(), all, in_all.data()));
    same_node_.assign(static_cast<size_t>(size_), false);
    for (int r : in_all) same_node_[static_cast<size_t>(r)] = true;
    MPI_CHECK(MPI_Group_free(&mine));
    MPI_CHECK(MPI_Group_free(&all));
    MPI_CHECK(MPI_Comm_free(&node));
    int level = MPI_THREAD_SINGLE;
    MPI_CHECK(MPI_Query_thread(&level));
    if (level == MPI_THREAD_MULTIPLE) progress_ = std::thread([this] { progress(); });
  }
  // Never communicates: the progress thread is told to stop (messages on their way are left, their tensors
  // kept alive by leaking them: MPI may still touch their memory), the communicator goes with MPI.
  ~MpiChannel() override { stop_thread(true); }

  WorkPtr send(const Tensor& t, int peer) override { return start("send to", t, peer, true); }
  WorkPtr recv(const Tensor& t, int peer) override { return start("receive from", t, peer, false); }
  void close() override {
    stop_thread(false);
    if (comm_ != MPI_COMM_NULL) MPI_CHECK(MPI_Comm_free(&comm_));
  }
  const std::string& name() const override { return name_; }

 private:
  // A posted piece.
  struct Piece {
    std::shared_ptr<Message> m;
    MPI_Request request = MPI_REQUEST_NULL;
    int64_t expected = -1;  // receives: its size
  };
  struct Posted {
    std::vector<Piece> pieces;
    std::map<const Message*, int> left;  // pieces still on their way, per message
    // poll()'s arrays, kept between polls.
    std::vector<MPI_Request> requests;
    std::vector<int> indices;
    std::vector<MPI_Status> statuses;
    std::vector<char> done;
  };

  WorkPtr start(const char* verb, const Tensor& t, int peer, bool sending) {
    auto m = std::make_shared<Message>();
    m->what = detail::str_cat(name_, " channel: ", verb, " rank ", peer, " (", t.describe(), ")");
    RT_CHECK(comm_ != MPI_COMM_NULL, m->what, ": the channel is closed");
    RT_CHECK(peer >= 0 && peer < size_ && peer != rank_, m->what, ": no such peer in a chain of ", size_, " ranks");
    // GPU tensors (ranks sharing a GPU, where NCCL cannot run) go through host memory.
    Tensor wire = t;
    if (t.device().is_cuda()) {
      if (sending) {
        wire = t.to(Device::cpu());  // waits for what produced t
      } else {
        wire = Tensor::empty(t.shape(), t.dtype());
        m->device_target = t;
      }
    }
    m->keep = wire;
    m->bytes = static_cast<char*>(wire.data_ptr());
    m->nbytes = wire.nbytes();
    m->peer = peer;
    m->comm = comm_;
    m->sending = sending;
    m->piece = same_node_[static_cast<size_t>(peer)] ? kNodePieceBytes : kNetPieceBytes;
    if (progress_.joinable()) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        queue_.push_back(m);
      }
      wake_.notify_one();
    } else {
      post(m, inline_);
      return std::make_shared<InlineWork>(this, m);
    }
    return std::make_shared<MpiChannelWork>(m);
  }

  // Posts a message's pieces (pieces of one direction to one peer match in order: MPI's non-overtaking).
  static void post(const std::shared_ptr<Message>& m, Posted& posted) {
    int count = 0;
    for (int64_t at = 0; at < std::max<int64_t>(m->nbytes, 1); at += m->piece) {
      const int n = static_cast<int>(std::min(m->piece, m->nbytes - at));
      Piece p{m, MPI_REQUEST_NULL, m->sending ? -1 : n};
      posted.pieces.push_back(p);
      ++count;
      if (m->nbytes == 0) break;
    }
    posted.left[m.get()] += count;
    // The requests are made after the vector stops growing for this message.
    int64_t at = 0;
    for (size_t i = posted.pieces.size() - static_cast<size_t>(count); i < posted.pieces.size(); ++i) {
      Piece& p = posted.pieces[i];
      const int n = static_cast<int>(std::min(m->piece, m->nbytes - at));
      const int rc = m->sending ? MPI_Isend(m->bytes + at, n, MPI_BYTE, m->peer, 0, m->comm, &p.request)
                                : MPI_Irecv(m->bytes + at, n, MPI_BYTE, m->peer, 0, m->comm, &p.request);
      if (rc != MPI_SUCCESS) fail(*m, detail::str_cat(m->what, ": ", detail::mpi_error_text(rc)));
      at += m->piece;
    }
  }

  static void fail(Message& m, const std::string& error) {
    if (m.state.load() != 0) return;
    m.error = error;
    m.state.store(2, std::memory_order_release);
  }

  // Tests every posted piece once, in one MPI_Testsome: one pass of MPI's progress engine however many
  // pieces are posted (over TCP each pass polls the sockets in the kernel; a pass per piece made the
  // waiting stage's progress thread the rank's busiest caller of poll()). True when any finished.
  static bool poll(Posted& posted) {
    const size_t n = posted.pieces.size();
    if (n == 0) return false;
    posted.requests.resize(n);
    posted.indices.resize(n);
    posted.statuses.resize(n);
    std::vector<char>& done = posted.done;
    done.assign(n, 0);
    for (size_t i = 0; i < n; ++i) {
      posted.requests[i] = posted.pieces[i].request;
      done[i] = posted.pieces[i].request == MPI_REQUEST_NULL;  // a piece whose posting failed
    }
    int count = 0;
    const auto test = [&] {
      return MPI_Testsome(static_cast<int>(n), posted.requests.data(), &count, posted.indices.data(),
                          posted.statuses.data());
    };
    int rc = test();
    // Open MPI looks for finished requests before its progress pass, not after: what that pass finished
    // is seen by a second call now rather than after the next pause.
    if (rc == MPI_SUCCESS && count == 0) rc = test();
    if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS) {
      // Their messages fail; the pieces stay posted (MPI may still write into their memory, which the
      // channel keeps until it is destroyed).
      for (size_t i = 0; i < n; ++i)
        if (!done[i])
          fail(*posted.pieces[i].m, detail::str_cat(posted.pieces[i].m->what, ": ", detail::mpi_error_text(rc)));
    } else if (count != MPI_UNDEFINED) {
      for (int k = 0; k < count; ++k) {
        const auto i = static_cast<size_t>(posted.indices[static_cast<size_t>(k)]);
        const MPI_Status& status = posted.statuses[static_cast<size_t>(k)];
        Piece& p = posted.pieces[i];
        p.request = MPI_REQUEST_NULL;
        done[i] = 1;
        if (rc == MPI_ERR_IN_STATUS && status.MPI_ERROR != MPI_SUCCESS) {
          fail(*p.m, detail::str_cat(p.m->what, ": ", detail::mpi_error_text(status.MPI_ERROR)));
        } else if (p.expected >= 0) {
          int got = 0;
          MPI_Get_count(&status, MPI_BYTE, &got);
          if (got != p.expected)
            fail(*p.m, detail::str_cat(p.m->what, ": received ", got, " bytes from rank ", status.MPI_SOURCE, " where ",
                                       p.expected, " were expected: the two stages disagree about the ",
                                       "tensor at their boundary"));
        }
      }
    }
    bool any = false;
    size_t kept = 0;
    for (size_t i = 0; i < n; ++i) {
      Piece& p = posted.pieces[i];
      if (!done[i]) {
        if (kept != i) posted.pieces[kept] = std::move(p);
        ++kept;
        continue;
      }
      any = true;
      if (--posted.left[p.m.get()] == 0) {
        posted.left.erase(p.m.get());
        if (p.m->state.load() == 0) p.m->state.store(1, std::memory_order_release);
      }
    }
    posted.pieces.resize(kept);
    return any;
  }

  void progress() {
    Posted posted;
    using us = std::chrono::microseconds;
    us pause(10), slept(0);
    int idle = 0;
    for (;;) {
      std::deque<std::shared_ptr<Message>> fresh;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        if (posted.pieces.empty()) wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (stop_) break;
        fresh.swap(queue_);
      }
      for (auto& m : fresh) post(m, posted);
      if (!fresh.empty() || poll(posted)) {
        idle = 0;
        pause = us(10);
        slept = us(0);
        continue;
      }
      // Nothing moved: spin a little, then yield, then sleep (the compute threads need the core).
      if (++idle < 64) continue;
      if (idle < 320) {
        std::this_thread::yield();
        continue;
      }
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait_for(lock, pause, [&] { return stop_ || !queue_.empty(); });
      slept += pause;
      // As polite_wait.h waits: a quarter of the time slept so far, at most 200 us while a piece
      // to this node is pending and 1 ms while only pieces to other nodes are.
      bool local = false;
      for (const Piece& p : posted.pieces) local = local || p.m->piece == kNodePieceBytes;
      pause = next_polite_pause(pause, slept, local ? us(200) : us(1000));
    }
    for (auto& p : posted.pieces) new Tensor(p.m->keep);  // NOLINT: MPI may still touch their memory
  }

  void stop_thread(bool leaving) {
    if (!progress_.joinable()) return;
    if (!leaving) {  // the success path: every message done first
      for (;;) {
        {
          std::lock_guard<std::mutex> lock(mutex_);
          if (queue_.empty()) break;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_one();
    progress_.join();
  }

  // Without MPI_THREAD_MULTIPLE: the caller's thread polls (InlineWork).
  class InlineWork final : public Work {
   public:
    InlineWork(MpiChannel* c, std::shared_ptr<Message> m) : c_(c), m_(std::move(m)) {}
    void wait() override {
      while (!test()) std::this_thread::yield();
      finish(*m_);
    }
    bool test() override {
      if (m_->state.load() == 0) poll(c_->inline_);
      return m_->state.load() != 0;
    }

   private:
    MpiChannel* c_;
    std::shared_ptr<Message> m_;
  };

  std::string name_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::vector<bool> same_node_;
  std::thread progress_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Message>> queue_;
  bool stop_ = false;
  Posted inline_;
};

}  // namespace

std::unique_ptr<Channel> make_channel(MPI_Comm parent, Device device, const std::string& name,
                                      std::chrono::milliseconds timeout) {
  if (device.is_cuda()) {
    // NCCL needs a GPU per rank: where ranks of a node share one, every rank stages through host memory.
    MPI_Comm node = MPI_COMM_NULL;
    MPI_CHECK(MPI_Comm_split_type(parent, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
    int local = 1;
    MPI_CHECK(MPI_Comm_size(node, &local));
    MPI_CHECK(MPI_Comm_free(&node));
    int shared = local > cuda_device_count() ? 1 : 0;
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &shared, 1, MPI_INT, MPI_MAX, parent));
    if (!shared) return make_nccl_channel(parent, name, timeout);
  }
  return std::make_unique<MpiChannel>(parent, name);
}

namespace {

constexpr int kHeaderTag = 71, kBytesTag = 72;
constexpr int64_t kChunk = int64_t{1} << 30;  // bytes per MPI message (its count is an int)

void put(std::vector<char>& out, int64_t v) {
  const auto* p = reinterpret_cast<const char*>(&v);
  out.insert(out.end(), p, p + sizeof v);
}

int64_t take(const std::vector<char>& in, size_t& at) {
  RT_CHECK(at + sizeof(int64_t) <= in.size(), "recv_named: a truncated header (", in.size(), " bytes)");
  int64_t v = 0;
  std::memcpy(&v, in.data() + at, sizeof v);
  at += sizeof v;
  return v;
}

}  // namespace

void send_named(MPI_Comm comm, const NamedTensors& tensors, int dest) {
  // The header: the count, then per tensor its name's length, dtype, rank and dims, then its name.
  std::vector<char> header;
  int64_t total = 0;
  put(header, static_cast<int64_t>(tensors.size()));
  for (const auto& [name, t] : tensors) {
    put(header, static_cast<int64_t>(name.size()));
    put(header, static_cast<int64_t>(t.dtype()));
    put(header, t.ndim());
    for (int64_t d = 0; d < t.ndim(); ++d) put(header, t.size(d));
    header.insert(header.end(), name.begin(), name.end());
    total += t.nbytes();
  }
  MPI_CHECK(MPI_Send(header.data(), static_cast<int>(header.size()), MPI_BYTE, dest, kHeaderTag, comm));
  std::vector<char> bytes(static_cast<size_t>(total));
  int64_t at = 0;
  for (const auto& [name, t] : tensors) {
    const Tensor host = t.to(Device::cpu());
    std::copy_n(static_cast<const char*>(host.data_ptr()), host.nbytes(), bytes.data() + at);
    at += host.nbytes();
  }
  for (int64_t off = 0; off < total; off += kChunk) {
    const int n = static_cast<int>(std::min(kChunk, total - off));
    MPI_CHECK(MPI_Send(bytes.data() + off, n, MPI_BYTE, dest, kBytesTag, comm));
  }
}

NamedTensors recv_named(MPI_Comm comm, int source) {
  MPI_Status status;
  MPI_CHECK(MPI_Probe(source, kHeaderTag, comm, &status));
  int length = 0;
  MPI_CHECK(MPI_Get_count(&status, MPI_BYTE, &length));
  std::vector<char> header(static_cast<size_t>(length));
  MPI_CHECK(MPI_Recv(header.data(), length, MPI_BYTE, source, kHeaderTag, comm, MPI_STATUS_IGNORE));
  size_t at = 0;
  const int64_t count = take(header, at);
  NamedTensors out;
  int64_t total = 0;
  for (int64_t k = 0; k < count; ++k) {
    const int64_t name_size = take(header, at);
    const auto dtype = static_cast<DType>(take(header, at));
    std::vector<int64_t> dims(static_cast<size_t>(take(header, at)));
    for (int64_t& d : dims) d = take(header, at);
    RT_CHECK(name_size >= 0 && at + static_cast<size_t>(name_size) <= header.size(), "recv_named: a truncated header (",
             header.size(), " bytes)");
    std::string name(header.data() + at, static_cast<size_t>(name_size));
    at += static_cast<size_t>(name_size);
    out.emplace_back(std::move(name), Tensor::empty(Shape(std::span<const int64_t>(dims.data(), dims.size())), dtype));
    total += out.back().second.nbytes();
  }
  std::vector<char> bytes(static_cast<size_t>(total));
  for (int64_t off = 0; off < total; off += kChunk) {
    const int n = static_cast<int>(std::min(kChunk, total - off));
    MPI_CHECK(MPI_Recv(bytes.data() + off, n, MPI_BYTE, source, kBytesTag, comm, MPI_STATUS_IGNORE));
  }
  int64_t offset = 0;
  for (auto& [name, t] : out) {
    std::copy_n(bytes.data() + offset, t.nbytes(), static_cast<char*>(t.data_ptr()));
    offset += t.nbytes();
  }
  return out;
}

}  // namespace ringtrain::comm
