// Checkpoints: bitwise round trip of model, optimizer and meta; atomic replacement (an interrupted
// write leaves the previous file intact and no temporary behind); errors naming file and object;
// a model + optimizer resumed from a checkpoint continues bitwise like the uninterrupted run.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "core/check.h"
#include "core/hash.h"
#include "core/ops.h"
#include "io/checkpoint.h"
#include "layers/loss.h"
#include "layers/models/resnet.h"
#include "optim/optimizer.h"
#include "test_util.h"

namespace ringtrain {
namespace {
namespace fs = std::filesystem;

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("rt_ckpt_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

// The stored checksum avalanches every word: the bit flips that cancel in word-wise FNV-1a (two flips of
// bit 63 add 2^64) change it.
TEST(Digest64, FlipsThatCancelInWordwiseFnvDoNot) {
  const uint64_t top = uint64_t{1} << 63;
  uint64_t words[4] = {1, 2, 3, 4};
  const uint64_t fnv = Fnv1a().add_words(words, sizeof words).value(),
                 digest = Digest64().add(words, sizeof words).value();
  words[0] ^= top;
  words[2] ^= top;
  EXPECT_EQ(Fnv1a().add_words(words, sizeof words).value(), fnv) << "the weakness this checksum avoids";
  EXPECT_NE(Digest64().add(words, sizeof words).value(), digest);
  EXPECT_NE(Digest64().add_word(1).add_word(2).value(), Digest64().add_word(2).add_word(1).value()) << "order counts";
}

// A flipped byte in a tensor or in the metadata is an error naming the file at load, not a NaN later.
TEST_F(CheckpointTest, AFlippedByteIsCaughtByTheChecksum) {
  std::vector<double> pattern(64);
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = 1000.0 + static_cast<double>(i);  // findable bytes
  const Checkpoint c{{{"w", Tensor::from_vector(pattern, Shape{64}, DType::F64)}},
                     {{"w.momentum", Tensor::zeros(Shape{64}, DType::F64)}},
                     R"({"step": 123456789})"};
  auto flipped = [&](const std::string& needle_name, const std::string& needle) {
    const fs::path f = dir_ / (needle_name + ".h5");
    save_checkpoint(f, c);
    std::string bytes;
    {
      std::ifstream in(f, std::ios::binary);
      bytes.assign(std::istreambuf_iterator<char>(in), {});
    }
    const size_t at = bytes.find(needle);
    EXPECT_NE(at, std::string::npos) << needle_name;
    if (at == std::string::npos) return std::string();
    bytes[at + needle.size() / 2] ^= 0x01;
    std::ofstream(f, std::ios::binary | std::ios::trunc) << bytes;
    return testing::error_of([&] { load_checkpoint(f); });
  };
  EXPECT_NO_THROW(load_checkpoint((save_checkpoint(dir_ / "ok.h5", c), dir_ / "ok.h5")));
  const double probe = 1010.0;
  const std::string e1 = flipped("tensor", std::string(reinterpret_cast<const char*>(&probe), sizeof probe));
  EXPECT_NE(e1.find("checkpoint '" + (dir_ / "tensor.h5").string() + "' is corrupt"), std::string::npos) << e1;
  const std::string e2 = flipped("meta", "123456789");
  EXPECT_NE(e2.find("is corrupt: its tensors and metadata hash to"), std::string::npos) << e2;
}

TEST_F(CheckpointTest, RoundTripIsBitwiseForEveryDtype) {
  Checkpoint c;
  c.model = {{"conv1.weight", Tensor::normal(Shape{4, 3, 3, 2}, 0, 1, 1)},
             {"bn1.num_batches_tracked", Tensor::scalar(7, DType::I64)},
             {"half", Tensor::normal(Shape{5}, 0, 1, 2, DType::F16)},
             {"brain", Tensor::normal(Shape{5}, 0, 1, 3, DType::BF16)},
             {"double", Tensor::normal(Shape{2, 2}, 0, 1, 4, DType::F64)},
             {"ints", Tensor::from_vector({1, -2, 3}, Shape{3}, DType::I32)},
             {"bytes", Tensor::from_vector({0, 255}, Shape{2}, DType::U8)},
             {"empty", Tensor::zeros(Shape{0, 3})}};
  c.optimizer = {{"step", Tensor::scalar(12, DType::I64)}, {"conv1.weight.momentum", Tensor::ones(Shape{4, 3, 3, 2})}};
  c.meta_json = R"({"epoch": 3, "arch": "resnet20"})";
  save_checkpoint(dir_ / "a.h5", c);
  Checkpoint back = load_checkpoint(dir_ / "a.h5");
  EXPECT_EQ(back.meta_json, c.meta_json);
  ASSERT_EQ(back.model.size(), c.model.size());
  std::map<std::string, Tensor> by_name(back.model.begin(), back.model.end());
  for (auto& [name, t] : c.model) {
    ASSERT_TRUE(by_name.count(name)) << name;
    const Tensor& r = by_name.at(name);
    EXPECT_EQ(r.dtype(), t.dtype()) << name;
    EXPECT_EQ(r.shape(), t.shape()) << name;
    EXPECT_EQ(r.to_vector(), t.to_vector()) << name;
  }
  EXPECT_EQ(back.optimizer.size(), 2u);
}

TEST_F(CheckpointTest, InterruptedWriteLeavesThePreviousFileIntact) {
  Checkpoint first;
  first.model = {{"w", Tensor::full(Shape{3}, 1.0)}};
  save_checkpoint(dir_ / "ckpt.h5", first);
  Checkpoint second;
  second.model = {{"w", Tensor::full(Shape{3}, 2.0)}};
  EXPECT_THROW(save_checkpoint(dir_ / "ckpt.h5", second, {.before_rename = [] { RT_THROW("simulated crash"); }}),
               Error);
  EXPECT_EQ(load_checkpoint(dir_ / "ckpt.h5").model[0].second.to_vector(), std::vector<double>(3, 1.0));
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir_)) {
    ++files;
    EXPECT_EQ(e.path().filename(), "ckpt.h5") << "temporary left behind: " << e.path();
  }
  EXPECT_EQ(files, 1);
  save_checkpoint(dir_ / "ckpt.h5", second);
  EXPECT_EQ(load_checkpoint(dir_ / "ckpt.h5").model[0].second.to_vector(), std::vector<double>(3, 2.0));
}

TEST_F(CheckpointTest, ErrorsNameTheFile) {
  auto err = testing::error_of;
  EXPECT_NE(err([&] { load_checkpoint(dir_ / "missing.h5"); }).find("missing.h5' does not exist"), std::string::npos);
  std::ofstream(dir_ / "junk.h5") << "not hdf5";
  EXPECT_NE(err([&] { load_checkpoint(dir_ / "junk.h5"); }).find("junk.h5' is truncated or not an HDF5 file"),
            std::string::npos);
  Checkpoint c;
  c.model = {{"w", Tensor::ones(Shape{1000})}};
  save_checkpoint(dir_ / "cut.h5", c);
  fs::resize_file(dir_ / "cut.h5", fs::file_size(dir_ / "cut.h5") / 2);
  EXPECT_NE(err([&] { load_checkpoint(dir_ / "cut.h5"); }).find("cut.h5"), std::string::npos);
  EXPECT_THROW(save_checkpoint(dir_ / "bad.h5", Checkpoint{{{"a/b", Tensor::ones(Shape{1})}}, {}, "{}"}), Error);
}

TEST_F(CheckpointTest, ResumedTrainingIsBitwiseIdenticalToTheUninterruptedRun) {
  Tensor x = Tensor::normal(Shape{8, 8, 8, 3}, 0, 1, 9);
  Tensor y = Tensor::from_vector({0, 1, 2, 3, 4, 5, 6, 7}, Shape{8}, DType::I64);
  auto train = [&](ResNet& m, Sgd& opt, int steps) {
    for (int s = 0; s < steps; ++s) {
      opt.zero_grad();
      CrossEntropyLoss(0.1)(m(x), y).backward();
      opt.step(0.05);
    }
  };
  manual_seed(1);
  ResNet straight("resnet20", {.num_classes = 10});
  Sgd straight_opt(as_named(straight.named_parameters()), {.momentum = 0.9, .nesterov = true, .weight_decay = 5e-4});
  train(straight, straight_opt, 6);

  manual_seed(1);
  ResNet first("resnet20", {.num_classes = 10});
  Sgd first_opt(as_named(first.named_parameters()), {.momentum = 0.9, .nesterov = true, .weight_decay = 5e-4});
  train(first, first_opt, 3);
  save_checkpoint(dir_ / "mid.h5", {first.state_dict(), first_opt.state(), R"({"step": 3})"});

  manual_seed(99);  // a different init: everything must come from the checkpoint
  ResNet resumed("resnet20", {.num_classes = 10});
  Sgd resumed_opt(as_named(resumed.named_parameters()), {.momentum = 0.9, .nesterov = true, .weight_decay = 5e-4});
  Checkpoint c = load_checkpoint(dir_ / "mid.h5");
  resumed.load_state_dict(c.model);
  resumed_opt.load_state(c.optimizer);
  train(resumed, resumed_opt, 3);
  auto a = straight.state_dict(), b = resumed.state_dict();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].second.to_vector(), b[i].second.to_vector()) << a[i].first;
}

}  // namespace
}  // namespace ringtrain
