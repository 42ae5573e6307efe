// Datasets for the runtime's tests under mpirun: rank 0 writes them in a folder every rank sees (all ranks
// run on this machine under CTest), and every rank waits for it.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "comm/host_collectives.h"
#include "comm/world.h"
#include "data/shards.h"
#include "test_util.h"

namespace ringtrain::testing {

// <TempDir>/<prefix>_<what>_<rank 0's pid>: the same name on every rank, another each run.
inline std::filesystem::path shared_dir(const std::string& prefix, const std::string& what) {
  comm::World& world = comm::World::init();
  const int64_t pid = comm::broadcast(world.comm(), int64_t{::getpid()}, 0);
  return std::filesystem::path(::testing::TempDir()) / (prefix + "_" + what + "_" + std::to_string(pid));
}

// `train_count` and `test_count` records of 6x6x3 with 3 classes (deterministic bytes), in 2 shards a split.
inline std::filesystem::path make_dataset(const std::string& prefix, const std::string& what, int64_t train_count,
                                          int64_t test_count) {
  comm::World& world = comm::World::init();
  const std::filesystem::path dir = shared_dir(prefix, what);
  if (world.is_root()) {
    std::filesystem::remove_all(dir);
    for (const auto& [split, count] :
         {std::pair{std::string("train"), train_count}, std::pair{std::string("test"), test_count}}) {
      data::WriterOptions o;
      o.dir = dir;
      o.split = split;
      o.num_shards = 2;
      o.total_records = count;
      o.height = o.width = 6;
      o.channels = 3;
      o.num_classes = 3;
      data::ShardWriter w(o);
      std::vector<uint8_t> image(6 * 6 * 3);
      for (int64_t r = 0; r < count; ++r) {
        for (size_t i = 0; i < image.size(); ++i)
          image[i] = static_cast<uint8_t>((r * 37 + i * 11 + (i % 3) * r) % 256);
        w.add(image.data(), static_cast<int32_t>((r * 7) % 3));
      }
      w.finish();
    }
  }
  comm::barrier(world.comm());
  return dir;
}

}  // namespace ringtrain::testing
