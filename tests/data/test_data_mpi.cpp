// Runs under mpirun with 2 ranks: a bad dataset makes every rank report the same error (validation is
// deterministic and every rank validates), so a job can end everywhere instead of leaving a rank
// waiting in a collective; a good dataset gives disjoint per-rank batches that together form the
// single-rank global batch.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <mpi.h>
#include <unistd.h>

#include <filesystem>

#include "core/check.h"
#include "data/sampler.h"
#include "data/shards.h"

namespace ringtrain::data {
namespace {
namespace fs = std::filesystem;

int rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world() {
  int w = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &w);
  return w;
}

fs::path shared_dir() {
  // Rank 0 picks the folder name and tells the others (same machine under mpirun here).
  int pid = rank() == 0 ? static_cast<int>(::getpid()) : 0;
  MPI_Bcast(&pid, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return fs::path(::testing::TempDir()) / ("rt_data_mpi_" + std::to_string(pid));
}

void write_dataset(const fs::path& dir, int32_t bad_label) {
  WriterOptions o;
  o.dir = dir;
  o.num_shards = 2;
  o.total_records = 40;
  o.height = o.width = 2;
  o.channels = 1;
  o.num_classes = 5;
  ShardWriter w(o);
  uint8_t px[4] = {1, 2, 3, 4};
  for (int i = 0; i < 40; ++i) w.add(px, i % 5);
  w.finish();
  if (bad_label >= 0) {
    std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
    hid_t f = H5Fopen((dir / "train-00001-of-00002.h5").c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t ds = H5Dopen2(f, "labels", H5P_DEFAULT);
    std::vector<int32_t> labels(20, 0);
    labels[7] = bad_label;
    H5Dwrite(ds, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, labels.data());
    H5Dclose(ds);
    H5Fclose(f);
  }
}

TEST(DataMpi, EveryRankReportsTheSameValidationError) {
  const fs::path dir = shared_dir();
  if (rank() == 0) write_dataset(dir, 9);
  MPI_Barrier(MPI_COMM_WORLD);
  std::string message;
  try {
    ShardDataset::open(dir, "train", {.verify_checksums = false, .check_labels = true});
  } catch (const Error& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("label 9 outside [0, 5)"), std::string::npos) << "rank " << rank() << ": " << message;
  // Every rank failed, with the same text as rank 0.
  int failed = message.empty() ? 0 : 1, failures = 0;
  MPI_Allreduce(&failed, &failures, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_EQ(failures, world());
  std::vector<char> root_text(1024, '\0');
  if (rank() == 0) message.copy(root_text.data(), root_text.size() - 1);
  MPI_Bcast(root_text.data(), static_cast<int>(root_text.size()), MPI_CHAR, 0, MPI_COMM_WORLD);
  EXPECT_EQ(message.substr(0, root_text.size() - 1), std::string(root_text.data()));
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank() == 0) fs::remove_all(dir);
}

TEST(DataMpi, RanksReadDisjointPartsOfEachGlobalBatch) {
  const fs::path dir = shared_dir();
  if (rank() == 0) write_dataset(dir, -1);
  MPI_Barrier(MPI_COMM_WORLD);
  ShardDataset ds = ShardDataset::open(dir, "train");
  SamplerOptions so;
  so.dataset_size = ds.size();
  so.global_batch = 8;
  so.rank = rank();
  so.world_size = world();
  so.chunk = 4;
  so.window = 8;
  DistributedSampler mine(so);
  so.rank = 0;
  so.world_size = 1;
  DistributedSampler single(so);
  for (int64_t t = 0; t < mine.batches_per_epoch(); ++t) {
    std::vector<int64_t> part = mine.rank_batch(0, t);
    std::vector<long long> gathered(8);
    std::vector<long long> send(part.begin(), part.end());
    MPI_Allgather(send.data(), static_cast<int>(send.size()), MPI_LONG_LONG, gathered.data(),
                  static_cast<int>(send.size()), MPI_LONG_LONG, MPI_COMM_WORLD);
    std::vector<int64_t> expected = single.rank_batch(0, t);
    EXPECT_EQ(std::vector<int64_t>(gathered.begin(), gathered.end()), expected) << "batch " << t;
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank() == 0) fs::remove_all(dir);
}

}  // namespace
}  // namespace ringtrain::data
