// Runs under mpirun with 1, 2, 3 and 4 ranks: every collective of the ring and mpi backends gives exact
// results for every dtype and for awkward element counts (0, 1, fewer than ranks, not divisible, many
// pipelined chunks), results are bitwise identical on every rank, asynchronous operations complete in
// submission order, and bad arguments are errors naming the tensor and rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/host_collectives.h"
#include "comm/world.h"
#include "core/check.h"
#include "core/dtype.h"
#include "core/parse.h"
#include "test_util.h"

namespace ringtrain::comm {
namespace {

struct Case {
  Backend backend;
  int64_t chunk_bytes;
  int node_size = 0;  // hierarchical: ranks per emulated node (0: the real nodes)
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return std::string(backend_name(info.param.backend)) + "_chunk" + std::to_string(info.param.chunk_bytes) +
         (info.param.node_size ? "_node" + std::to_string(info.param.node_size) : "");
}

class Collectives : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    CommOptions o;
    o.chunk_bytes = GetParam().chunk_bytes;
    o.pipeline_depth = 3;
    o.node_size = GetParam().node_size;
    comm = make_communicator(GetParam().backend, World::init().comm(), o);
  }
  CommunicatorPtr comm;
};

// Small integers: exact in every dtype, so sums are exact whatever the order.
double value(int64_t i, int rank) { return static_cast<double>(i % 7 + rank + 1); }

double expected_sum(int64_t i, int n) { return static_cast<double>(n * (i % 7) + n * (n + 1) / 2); }

// What an average must be bit for bit: the exact sum scaled in the compute type, rounded once.
double expected_average(double sum, int n, DType dt) {
  if (dt == DType::F64) return sum * (1.0 / n);
  const float scaled = static_cast<float>(sum) * (1.0f / static_cast<float>(n));
  return Tensor::from_vector({static_cast<double>(scaled)}, Shape{1}, dt).to(DType::F64).data<double>()[0];
}

Tensor filled(int64_t count, DType dt, int rank) {
  std::vector<double> v(count);
  for (int64_t i = 0; i < count; ++i) v[i] = value(i, rank);
  return Tensor::from_vector(v, Shape{count}, dt);
}

std::vector<double> as_f64(const Tensor& t) {
  Tensor d = t.to(DType::F64);
  return std::vector<double>(d.data<double>(), d.data<double>() + d.numel());
}

const std::vector<int64_t> kCounts = {0, 1, 2, 3, 5, 7, 64, 1001, 65537, 300007};

TEST_P(Collectives, AllReduceSumIsExactForEveryDtypeAndCount) {
  const int n = comm->size();
  for (DType dt : {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I32, DType::I64}) {
    for (int64_t count : kCounts) {
      Tensor t = filled(count, dt, comm->rank());
      comm->all_reduce(t, ReduceOp::Sum);
      const auto got = as_f64(t);
      int64_t wrong = 0, first = -1;
      for (int64_t i = 0; i < count; ++i)
        if (got[i] != expected_sum(i, n) && wrong++ == 0) first = i;
      ASSERT_EQ(wrong, 0) << dt << " count " << count << ": first wrong element " << first << " = " << got[first]
                          << ", expected " << expected_sum(first, n);
    }
  }
}

TEST_P(Collectives, AllReduceAverageMatchesTheRoundedExactAverage) {
  const int n = comm->size();
  for (DType dt : {DType::F32, DType::F64, DType::BF16, DType::F16}) {
    for (int64_t count : {int64_t{1}, int64_t{3}, int64_t{1001}, int64_t{65537}}) {
      Tensor t = filled(count, dt, comm->rank());
      comm->all_reduce(t, ReduceOp::Average);
      const auto got = as_f64(t);
      for (int64_t i = 0; i < count; ++i)
        ASSERT_EQ(got[i], expected_average(expected_sum(i, n), n, dt)) << dt << " count " << count << " at " << i;
    }
  }
}

TEST_P(Collectives, RandomFloatResultsAreBitwiseIdenticalOnEveryRank) {
  for (DType dt : {DType::F32, DType::BF16}) {
    Tensor t = Tensor::uniform(Shape{100003}, -1, 1, 1234 + comm->rank(), dt);
    comm->all_reduce(t, ReduceOp::Average);
    // Compare every rank's bytes with rank 0's.
    Tensor root = t.clone();
    comm->broadcast(root, 0);
    EXPECT_EQ(std::memcmp(root.data_ptr(), t.data_ptr(), t.nbytes()), 0) << dt << " differs on rank " << comm->rank();
  }
}

TEST_P(Collectives, BroadcastAllGatherReduceScatter) {
  const int n = comm->size(), r = comm->rank();
  for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{5}, int64_t{70001}}) {
    for (int root = 0; root < n; ++root) {
      Tensor t = filled(count, DType::F32, r);
      comm->broadcast(t, root);
      const auto got = as_f64(t);
      for (int64_t i = 0; i < count; ++i) ASSERT_EQ(got[i], value(i, root)) << "broadcast from " << root;
    }
    Tensor in = filled(count, DType::BF16, r);
    Tensor out = Tensor::zeros(Shape{count * n}, DType::BF16);
    comm->all_gather(in, out);
    const auto gathered = as_f64(out);
    for (int k = 0; k < n; ++k)
      for (int64_t i = 0; i < count; ++i) ASSERT_EQ(gathered[k * count + i], value(i, k)) << "all_gather block " << k;

    Tensor big = filled(count * n, DType::F32, r);
    Tensor mine = Tensor::zeros(Shape{count}, DType::F32);
    comm->reduce_scatter(big, mine, ReduceOp::Sum);
    const auto scattered = as_f64(mine);
    for (int64_t i = 0; i < count; ++i)
      ASSERT_EQ(scattered[i], expected_sum(r * count + i, n)) << "reduce_scatter element " << i;
  }
}

// ZeRO's halves: the shards partition the buffer, reduce_scatter_shard leaves all_reduce's bits in this
// rank's shard, and all_gather_shard then restores all_reduce's whole result even when everything
// outside the shard was overwritten in between (the optimizer writes only its own shard).
TEST_P(Collectives, ShardHalvesGiveTheAllReducesBits) {
  const int n = comm->size(), r = comm->rank();
  for (DType dt : {DType::F32, DType::F64, DType::BF16}) {
    for (int64_t count : kCounts) {
      const auto [first, last] = comm->shard(count);
      ASSERT_LE(0, first);
      ASSERT_LE(first, last);
      ASSERT_LE(last, count);
      // The shards of all ranks cover [0, count) once.
      const int64_t mine[2] = {first, last};
      const std::vector<int64_t> all = all_gather(World::init().comm(), std::span<const int64_t>(mine, 2));
      std::vector<int> covered(static_cast<size_t>(count), 0);
      for (int k = 0; k < n; ++k)
        for (int64_t i = all[2 * k]; i < all[2 * k + 1]; ++i) ++covered[static_cast<size_t>(i)];
      ASSERT_TRUE(std::all_of(covered.begin(), covered.end(), [](int c) { return c == 1; }))
          << dt << " count " << count;
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Average}) {
        Tensor a = Tensor::uniform(Shape{count}, -1, 1, 77 + r + static_cast<uint64_t>(count), dt);
        Tensor b = a.clone();
        comm->all_reduce(a, op);
        comm->reduce_scatter_shard_async(b, op)->wait();
        const int64_t es = dtype_size(dt);
        ASSERT_EQ(std::memcmp(static_cast<char*>(a.data_ptr()) + first * es,
                              static_cast<char*>(b.data_ptr()) + first * es, static_cast<size_t>((last - first) * es)),
                  0)
            << dt << " count " << count << ": the reduced shard differs from all_reduce's";
        Tensor c = Tensor::full(Shape{count}, 12345.0, dt);  // what is not this rank's shard: garbage
        if (last > first) c.slice(first, last).copy_(b.slice(first, last));
        comm->all_gather_shard_async(c)->wait();
        ASSERT_EQ(std::memcmp(a.data_ptr(), c.data_ptr(), a.nbytes()), 0)
            << dt << " count " << count << ": the gathered buffer differs";
      }
    }
  }
}

TEST_P(Collectives, AsynchronousOperationsCompleteInSubmissionOrder) {
  const int n = comm->size();
  std::vector<Tensor> tensors;
  std::vector<WorkPtr> work;
  for (int k = 0; k < 8; ++k) {
    tensors.push_back(Tensor::full(Shape{10000 + k}, k + comm->rank(), DType::F32));
    work.push_back(comm->all_reduce_async(tensors.back(), ReduceOp::Sum));
  }
  work.back()->wait();
  // Ordered: once the last is done, every earlier one is too.
  for (auto& w : work) EXPECT_TRUE(w->test());
  for (int k = 0; k < 8; ++k) {
    work[k]->wait();
    EXPECT_EQ(tensors[k].data<float>()[0], static_cast<float>(k * n + n * (n - 1) / 2));
  }
  comm->barrier();
}

TEST_P(Collectives, BadArgumentsAreErrorsNamingTheTensor) {
  Tensor bytes = Tensor::zeros(Shape{4}, DType::U8);
  std::string e = ringtrain::testing::error_of([&] { comm->all_reduce(bytes); });
  EXPECT_NE(e.find("dtype u8 cannot be summed"), std::string::npos) << e;
  Tensor ints = Tensor::zeros(Shape{4}, DType::I32);
  e = ringtrain::testing::error_of([&] { comm->all_reduce(ints, ReduceOp::Average); });
  EXPECT_NE(e.find("cannot be averaged"), std::string::npos) << e;
  e = ringtrain::testing::error_of(
      [&] { comm->all_gather(Tensor::zeros(Shape{3}), Tensor::zeros(Shape{3 * comm->size() + 1})); });
  EXPECT_NE(e.find("all_gather on rank " + std::to_string(comm->rank())), std::string::npos) << e;
  EXPECT_NE(e.find("must hold"), std::string::npos) << e;
  e = ringtrain::testing::error_of([&] { comm->broadcast(Tensor::zeros(Shape{3}), comm->size()); });
  EXPECT_NE(e.find("root " + std::to_string(comm->size()) + " is not a rank"), std::string::npos) << e;
}

INSTANTIATE_TEST_SUITE_P(Backends, Collectives,
                         ::testing::Values(Case{Backend::Ring, 512 << 10}, Case{Backend::Ring, 1024},
                                           Case{Backend::Ring, 4096}, Case{Backend::Mpi, 512 << 10},
                                           // The real nodes: one host here, 2x2 through the emulated cluster.
                                           Case{Backend::Hierarchical, 512 << 10},
                                           // Emulated nodes of 2 (and 3) ranks: 2x2 on 4 ranks, uneven on 3.
                                           Case{Backend::Hierarchical, 1024, 2}, Case{Backend::Hierarchical, 4096, 2},
                                           Case{Backend::Hierarchical, 4096, 3}),
                         case_name);

// GPU tensors: the ring stages them through pinned host memory (ranks may share one GPU); NCCL reduces
// them on the device. Both must agree exactly with the CPU results.
void check_gpu_all_reduce(Backend backend) {
  World& w = World::init();
  CommunicatorPtr comm = make_communicator(backend, w.comm());
  const int n = comm->size();
  for (DType dt : {DType::F32, DType::BF16}) {
    for (int64_t count : {int64_t{1}, int64_t{5}, int64_t{300007}}) {
      Tensor t = filled(count, dt, comm->rank()).to(Device::cuda(0));
      comm->all_reduce(t, ReduceOp::Sum);
      const auto got = as_f64(t.to(Device::cpu()));
      for (int64_t i = 0; i < count; ++i)
        ASSERT_EQ(got[i], expected_sum(i, n)) << dt << " count " << count << " at " << i;
    }
  }
  Tensor cpu = Tensor::zeros(Shape{4});
  if (backend == Backend::Nccl) {
    const std::string e = ringtrain::testing::error_of([&] { comm->all_reduce(cpu); });
    EXPECT_NE(e.find("ring"), std::string::npos) << "a CPU tensor on nccl should point to the ring backend: " << e;
  }
}

TEST(GpuCollectives, RingStagesCudaTensorsThroughPinnedMemory) {
  RT_REQUIRE_CUDA();
  check_gpu_all_reduce(Backend::Ring);
}

TEST(GpuCollectives, NcclAllReduceIsExact) {
  RT_REQUIRE_CUDA();
  World& w = World::init();
  if (w.local_size() > cuda_device_count())
    GTEST_SKIP() << "NCCL needs one GPU per rank: " << w.local_size() << " ranks, " << cuda_device_count() << " GPU(s)";
  w.bind(Device::cuda(0));
  check_gpu_all_reduce(Backend::Nccl);
}

TEST(GpuCollectives, NcclIsAnErrorWithoutCuda) {
  if (cuda_status().built_with_cuda) GTEST_SKIP() << "this build has the CUDA path";
  const std::string e = ringtrain::testing::error_of([] { make_communicator(Backend::Nccl, World::init().comm()); });
  EXPECT_NE(e.find("the nccl backend needs a CUDA build"), std::string::npos) << e;
}

TEST(Agreement, OneRankErrorMakesEveryRankThrowTheSameMessage) {
  World& w = World::init();
  const std::string local = w.rank() == w.size() - 1 ? "shard 3 is corrupt" : "";
  const std::string e = ringtrain::testing::error_of([&] { agree_or_throw(w.comm(), local, "opening the dataset"); });
  EXPECT_NE(e.find("opening the dataset failed on rank " + std::to_string(w.size() - 1)), std::string::npos) << e;
  EXPECT_NE(e.find("shard 3 is corrupt"), std::string::npos) << e;
  EXPECT_NO_THROW(agree_or_throw(w.comm(), "", "nothing"));
}

// failure_of gives a rank's part of an agreed step as its local error: what it threw, "" when it returned.
TEST(Agreement, FailureOfIsWhatTheWorkThrew) {
  World& w = World::init();
  EXPECT_EQ(failure_of([] {}), "");
  EXPECT_EQ(failure_of([] { throw std::runtime_error("shard 3 is corrupt"); }), "shard 3 is corrupt");
  EXPECT_EQ(failure_of([] { throw std::runtime_error(""); }), "an error without a message");
  int ran = 0;
  const std::string local = failure_of([&] {
    ++ran;
    RT_CHECK(w.rank() != w.size() - 1, "rank ", w.rank(), " has no data");
  });
  EXPECT_EQ(ran, 1);
  const std::string e = ringtrain::testing::error_of([&] { agree_or_throw(w.comm(), local, "opening the dataset"); });
  EXPECT_NE(e.find("rank " + std::to_string(w.size() - 1) + " has no data"), std::string::npos) << e;
}

// The nodes the test runs on: RT_EXPECT_NODES=NxP when the emulated cluster (scripts/cluster.sh, ranks
// placed by slot: 0..P-1 on node0, ...) runs it; one host otherwise.
struct ExpectedNodes {
  int nodes = 1, per_node = 0;  // per_node 0: every rank on this host
};
ExpectedNodes expected_nodes() {
  ExpectedNodes e;
  if (const char* text = std::getenv("RT_EXPECT_NODES")) {
    const std::string s = text;
    const size_t x = s.find('x');
    const auto n = to_number<int>(s.substr(0, x)),
               p = x == std::string::npos ? std::nullopt : to_number<int>(s.substr(x + 1));
    RT_CHECK(n && p, "RT_EXPECT_NODES must be NxP, got '", text, "'");
    e.nodes = *n;
    e.per_node = *p;
  }
  return e;
}

TEST(WorldInfo, RanksAndNodesAreConsistent) {
  World& w = World::init();
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  EXPECT_EQ(w.size(), size);
  EXPECT_GE(w.local_rank(), 0);
  EXPECT_LT(w.local_rank(), w.local_size());
  EXPECT_TRUE(w.nodes_uniform());
  const ExpectedNodes nodes = expected_nodes();
  if (nodes.per_node == 0) {
    EXPECT_EQ(w.num_nodes(), 1);  // CTest runs every rank on this machine
    EXPECT_EQ(w.local_size(), w.size());
    EXPECT_EQ(auto_backend(w, Device::cpu()), Backend::Ring);
  } else {
    ASSERT_EQ(w.size(), nodes.nodes * nodes.per_node) << "RT_EXPECT_NODES does not match the world";
    EXPECT_EQ(w.num_nodes(), nodes.nodes);
    EXPECT_EQ(w.local_size(), nodes.per_node);
    EXPECT_EQ(w.local_rank(), w.rank() % nodes.per_node);
    for (int r = 0; r < w.size(); ++r)
      EXPECT_EQ(w.hosts()[r], "node" + std::to_string(r / nodes.per_node)) << "rank " << r;
    EXPECT_EQ(auto_backend(w, Device::cpu()), nodes.per_node > 1 ? Backend::Hierarchical : Backend::Ring);
  }
  EXPECT_EQ(auto_backend(w, Device::cuda(0)), Backend::Nccl);
  EXPECT_EQ(static_cast<int>(w.hosts().size()), w.size());
  EXPECT_EQ(w.thread_level(), MPI_THREAD_MULTIPLE);
  const DeviceBinding b = w.bind(Device::cpu());
  EXPECT_GE(b.threads, 1);
  EXPECT_NE(b.description.find("rank " + std::to_string(w.rank()) + " -> cpu"), std::string::npos);
  if (cuda_device_count() == 0) {
    const std::string e = ringtrain::testing::error_of([&] { w.bind(Device::cuda(0)); });
    EXPECT_NE(e.find("asked for a CUDA device but none is usable"), std::string::npos) << e;
  }
}

TEST(HostCollectives, ReduceBroadcastAndGatherHostValues) {
  World& w = World::init();
  const int r = w.rank(), n = w.size();
  double d[2] = {1.0, static_cast<double>(r)};
  all_reduce(w.comm(), std::span<double>(d, 2));
  EXPECT_EQ(d[0], n);
  EXPECT_EQ(d[1], n * (n - 1) / 2.0);
  EXPECT_EQ(all_reduce(w.comm(), int64_t{r}, HostOp::Max), n - 1);
  EXPECT_EQ(all_reduce(w.comm(), static_cast<double>(r) + 0.5, HostOp::Min), 0.5);
  // Rank 0's string wins, whatever the others pass (even longer ones).
  EXPECT_EQ(broadcast(w.comm(), r == 0 ? std::string("from rank 0") : std::string(100 + r, 'x'), 0), "from rank 0");
  EXPECT_EQ(broadcast(w.comm(), int64_t{r == n - 1 ? 42 : -1}, n - 1), 42);
  const auto strings = gather_strings(w.comm(), std::string(static_cast<size_t>(r), 'a' + static_cast<char>(r)));
  const auto everywhere = all_gather_strings(w.comm(), "r" + std::to_string(r));
  ASSERT_EQ(static_cast<int>(everywhere.size()), n);
  for (int k = 0; k < n; ++k) EXPECT_EQ(everywhere[k], "r" + std::to_string(k));
  if (r == 0) {
    ASSERT_EQ(static_cast<int>(strings.size()), n);
    for (int k = 0; k < n; ++k) EXPECT_EQ(strings[k], std::string(static_cast<size_t>(k), 'a' + static_cast<char>(k)));
  } else {
    EXPECT_TRUE(strings.empty());
  }
  const double mine[2] = {static_cast<double>(r), 2.0 * r};
  const auto all = gather(w.comm(), std::span<const double>(mine, 2));
  if (r == 0) {
    for (int k = 0; k < n; ++k) EXPECT_EQ(all[2 * k + 1], 2.0 * k);
  }
  const int64_t pair[2] = {r, -r};
  const auto pairs = all_gather(w.comm(), std::span<const int64_t>(pair, 2));
  EXPECT_EQ(static_cast<int>(pairs.size()), 2 * n);
  EXPECT_EQ(pairs[2 * (n - 1) + 1], -(n - 1));
  barrier(w.comm());
}

// A rank waiting in a host collective for a slower one (a pipeline's stage at the step's check-in while
// another still computes) sleeps between polls instead of busy-polling a core the others need.
TEST(HostCollectives, AnAllReduceWaitingForASlowRankLeavesTheCore) {
  World& w = World::init();
  const int r = w.rank(), n = w.size();
  if (n < 2) GTEST_SKIP() << "one rank: nobody to wait for";
  barrier(w.comm());
  if (r == n - 1) std::this_thread::sleep_for(std::chrono::milliseconds(400));
  const auto thread_cpu = [] {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
  };
  const double cpu0 = thread_cpu();
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(all_reduce(w.comm(), int64_t{r + 1}), int64_t{n} * (n + 1) / 2);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double cpu = thread_cpu() - cpu0;
  if (r == n - 1) return;
  EXPECT_GT(wall, 0.2) << "rank " << r << " did not wait for the slow rank";
  EXPECT_LT(cpu, 0.25 * wall) << "rank " << r << " spent " << cpu << " s of CPU waiting " << wall << " s";
}

// Destroying a communicator never waits for a peer: an operation no other rank will join is cancelled,
// and what is queued behind it fails, both with errors saying the communicator was destroyed.
TEST(Lifetime, DestroyingARingCommunicatorWithAStuckOperationReturnsPromptly) {
  World& w = World::init();
  if (w.size() < 2) GTEST_SKIP() << "needs 2 or more ranks";
  auto comm = make_communicator(Backend::Ring, w.comm());
  WorkPtr stuck, queued;
  if (w.rank() == 1) {
    stuck = comm->all_reduce_async(Tensor::ones(Shape{1000}));  // rank 0 never joins it
    queued = comm->all_reduce_async(Tensor::ones(Shape{10}));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const auto t0 = std::chrono::steady_clock::now();
  comm.reset();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(seconds, 2.0);
  if (w.rank() == 1) {
    EXPECT_NE(ringtrain::testing::error_of([&] { stuck->wait(); }).find("cancelled"), std::string::npos);
    EXPECT_NE(ringtrain::testing::error_of([&] { queued->wait(); }).find("destroyed before this operation ran"),
              std::string::npos);
  }
  barrier(w.comm());
}

TEST(Lifetime, CloseDrainsThenRefusesNewWork) {
  World& w = World::init();
  for (Backend b : {Backend::Ring, Backend::Mpi, Backend::Hierarchical}) {
    CommOptions o;
    o.node_size = 2;
    auto comm = make_communicator(b, w.comm(), o);
    Tensor t = Tensor::ones(Shape{257});
    WorkPtr pending = comm->all_reduce_async(t);
    comm->close();  // collective: waits for the all-reduce above on every rank
    EXPECT_TRUE(pending->test());
    EXPECT_EQ(t.to_vector()[256], w.size());
    const std::string e = ringtrain::testing::error_of([&] { comm->all_reduce(t); });
    EXPECT_NE(e.find("the communicator is closed"), std::string::npos) << backend_name(b) << ": " << e;
    comm->close();  // idempotent
  }
}

TEST(Hierarchical, SaysHowItSpansTheRanks) {
  World& w = World::init();
  const int n = w.size();
  CommOptions two;
  two.node_size = 2;
  const std::string emulated = make_communicator(Backend::Hierarchical, w.comm(), two)->describe();
  std::string want = "flat ring over " + std::to_string(n) + " rank(s): one node";
  if (n == 4) want = "hierarchical: 2 nodes x 2 ranks";
  if (n == 3) want = "flat ring over 3 rank(s): the nodes hold different numbers";
  EXPECT_NE(emulated.find(want), std::string::npos) << emulated;
  const std::string real = make_communicator(Backend::Hierarchical, w.comm())->describe();
  const ExpectedNodes nodes = expected_nodes();
  std::string want_real = n > 1 ? "one node" : "flat ring over 1 rank(s)";
  if (nodes.per_node > 1)
    want_real = detail::str_cat("hierarchical: ", nodes.nodes, " nodes x ", nodes.per_node, " ranks");
  if (nodes.per_node == 1 && n > 1) want_real = "one rank per node";
  EXPECT_NE(real.find(want_real), std::string::npos) << real;
  EXPECT_EQ(make_communicator(Backend::Ring, w.comm())->describe(), "ring over " + std::to_string(n) + " rank(s)");
}

TEST(Hierarchical, AgreesWithTheFlatRingToRounding) {
  World& w = World::init();
  CommOptions o;
  o.node_size = 2;
  o.chunk_bytes = 4096;
  auto hier = make_communicator(Backend::Hierarchical, w.comm(), o);
  auto flat = make_communicator(Backend::Ring, w.comm());
  for (int64_t count : {int64_t{1}, int64_t{3}, int64_t{99991}}) {
    Tensor a = Tensor::uniform(Shape{count}, -1, 1, 77 + w.rank(), DType::F32);
    Tensor b = a.clone();
    hier->all_reduce(a, ReduceOp::Average);
    flat->all_reduce(b, ReduceOp::Average);
    const auto x = a.to_vector(), y = b.to_vector();
    for (int64_t i = 0; i < count; ++i) ASSERT_NEAR(x[i], y[i], 1e-6) << "count " << count << " element " << i;
  }
}

TEST(Backends, ParseNamesTheBadValue) {
  EXPECT_EQ(parse_backend("ring"), Backend::Ring);
  EXPECT_EQ(parse_backend("hierarchical"), Backend::Hierarchical);
  EXPECT_STREQ(backend_name(Backend::Hierarchical), "hierarchical");
  const std::string e = ringtrain::testing::error_of([] { parse_backend("gloo"); });
  EXPECT_NE(e.find("unknown communication backend 'gloo'"), std::string::npos) << e;
}

}  // namespace
}  // namespace ringtrain::comm
