// Tests for runtime/config/data_source.h: the shard source refuses a test split that does not fit the train split
// (classes, image shape after the transforms) naming both, skips an empty test split with a warning, and
// the synthetic source serves the sampler's batches, deterministic per (seed, epoch, batch, rank).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "data/sampler.h"
#include "runtime/config/data_source.h"
#include "test_util.h"

namespace ringtrain::runtime {
namespace {
namespace fs = std::filesystem;

class ShardSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("rt_source_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write(const std::string& split, int64_t records, int64_t side, int classes) {
    data::WriterOptions o;
    o.dir = dir_;
    o.split = split;
    o.total_records = records;
    o.height = o.width = side;
    o.channels = 3;
    o.num_classes = classes;
    data::ShardWriter w(o);
    std::vector<uint8_t> image(static_cast<size_t>(side * side * 3), 7);
    for (int64_t r = 0; r < records; ++r) w.add(image.data(), static_cast<int32_t>(r % classes));
    w.finish();
  }
  fs::path dir_;
};

TEST_F(ShardSourceTest, ATestSplitThatDoesNotFitTheTrainSplitIsRefused) {
  write("train", 20, 8, 3);
  write("test", 5, 6, 3);
  std::string e = testing::error_of([&] { open_shards(dir_.string(), {}); });
  EXPECT_NE(e.find("the test split's images are 6x6x3"), std::string::npos) << e;
  EXPECT_NE(e.find("but the train split's are 8x8x3"), std::string::npos) << e;
  // With a resized crop both come out at the crop size: then the shapes fit.
  EXPECT_NO_THROW(open_shards(dir_.string(), {.train_transform = {.resized_crop = 4}}));
  write("test", 5, 8, 4);
  e = testing::error_of([&] { open_shards(dir_.string(), {}); });
  EXPECT_NE(e.find("the test split has 4 classes but the train split (and so the model) has 3"), std::string::npos)
      << e;
}

TEST_F(ShardSourceTest, AnEmptyTestSplitIsSkippedWithAWarning) {
  write("train", 20, 8, 3);
  write("test", 0, 8, 3);
  auto source = open_shards(dir_.string(), {});
  EXPECT_EQ(source->test_loader(), nullptr);
  EXPECT_EQ(source->info().test_size, 0);
  ASSERT_EQ(source->warnings().size(), 1u);
  EXPECT_NE(source->warnings()[0].find("the test split has no records; evaluation is skipped"), std::string::npos);
  write("train", 0, 8, 3);
  EXPECT_NE(testing::error_of([&] { open_shards(dir_.string(), {}); }).find("split 'train' has no records"),
            std::string::npos);
  EXPECT_NE(testing::error_of([&] { open_shards((dir_ / "nope").string(), {}); }).find("--data: dataset folder"),
            std::string::npos);
}

TEST(SyntheticSource, ServesTheSamplersBatchesDeterministically) {
  auto a = synthetic_data({.size = 40, .height = 4, .width = 4, .channels = 2, .classes = 3, .seed = 5});
  auto b = synthetic_data({.size = 40, .height = 4, .width = 4, .channels = 2, .classes = 3, .seed = 5});
  data::DistributedSampler sampler({.dataset_size = 40, .global_batch = 8, .rank = 1, .world_size = 2});
  sampler.set_epoch(2);
  a->start_epoch(sampler, 2);
  int batches = 0;
  while (auto batch = a->next()) {
    EXPECT_EQ(batch->images.shape(), (Shape{4, 4, 4, 2}));
    EXPECT_EQ(batch->labels.to_vector(), (std::vector<double>{1, 2, 0, 1}));  // (i * 7 + the sampler's rank) % classes
    ++batches;
  }
  EXPECT_EQ(batches, 5);
  EXPECT_EQ(a->position().next_batch, 5);
  sampler.restore({2, 3});  // a resumed epoch continues at its batch, with the same images
  b->start_epoch(sampler, 2);
  auto third = b->next();
  a->start_epoch(sampler, 2);
  EXPECT_EQ(third->index, 3);
  EXPECT_EQ(third->images.to_vector(), a->next()->images.to_vector());
  // The rank is the sampler's, as fit() decides it (--layout auto may put this rank in another replica).
  data::DistributedSampler other({.dataset_size = 40, .global_batch = 8, .rank = 0, .world_size = 2});
  a->start_epoch(other, 0);
  EXPECT_EQ(a->next()->labels.to_vector(), (std::vector<double>{0, 1, 2, 0}));
}

}  // namespace
}  // namespace ringtrain::runtime
