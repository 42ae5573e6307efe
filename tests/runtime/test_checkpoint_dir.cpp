// Tests for runtime/checkpoint/checkpoint_dir.h: naming and retention (keep_last), the resume pick that skips
// half-written, foreign and corrupt files with a warning naming them, stale temporary files removed,
// TrainState's round trip and its errors naming the file and key, and the sampler position converted
// across world sizes.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "runtime/checkpoint/checkpoint_dir.h"
#include "test_util.h"

namespace ringtrain::runtime {
namespace {
namespace fs = std::filesystem;

class CheckpointDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("rt_ckptdir_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  Checkpoint checkpoint(int64_t step, const std::string& run_id = "") const {
    TrainState s;
    s.step = step;
    s.position = {0, step};
    s.global_batch = 16;
    s.per_step_global = 16;
    s.run_id = run_id;
    return Checkpoint{{{"w", Tensor::full(Shape{3}, static_cast<double>(step))}}, {}, s.to_json()};
  }
  std::vector<int64_t> steps_on_disk(const CheckpointDir& d) const {
    std::vector<int64_t> out;
    for (const auto& [step, path] : d.list()) out.push_back(step);
    return out;
  }
  fs::path dir_;
};

TEST_F(CheckpointDirTest, NamesFilesByStepAndKeepsTheNewestK) {
  CheckpointDir keep2(dir_, 2);
  EXPECT_EQ(keep2.path(42).filename(), "ckpt-step00000042.h5");
  for (int64_t s = 1; s <= 5; ++s) keep2.save(s, checkpoint(s));
  EXPECT_EQ(steps_on_disk(keep2), (std::vector<int64_t>{4, 5}));
  std::ofstream(dir_ / "notes.txt") << "not a checkpoint";  // other files are never touched
  CheckpointDir all(dir_, 0);
  for (int64_t s = 6; s <= 8; ++s) all.save(s, checkpoint(s));
  EXPECT_EQ(steps_on_disk(all), (std::vector<int64_t>{4, 5, 6, 7, 8}));
  keep2.save(9, checkpoint(9));
  EXPECT_EQ(steps_on_disk(keep2), (std::vector<int64_t>{8, 9}));
  EXPECT_TRUE(fs::exists(dir_ / "notes.txt"));
  EXPECT_NE(testing::error_of([&] { CheckpointDir(dir_, -1); }).find("--keep-last"), std::string::npos);
}

TEST_F(CheckpointDirTest, ResumeAutoSkipsHalfWrittenAndForeignFilesNamingThem) {
  CheckpointDir d(dir_);
  d.save(3, checkpoint(3));
  d.save(6, checkpoint(6));
  // Newer than both: a truncated copy (a crash mid-copy), a text file with the right name, and an HDF5
  // checkpoint whose metadata lacks the sampler position.
  const auto size = fs::file_size(d.path(6));
  fs::copy_file(d.path(6), d.path(9));
  fs::resize_file(d.path(9), size / 2);
  std::ofstream(d.path(10)) << "garbage";
  Checkpoint no_sampler = checkpoint(11);
  no_sampler.meta_json = R"({"step": 11, "world_size": 1, "global_batch": 16})";
  save_checkpoint(d.path(11), no_sampler);
  std::vector<std::string> warnings;
  const auto loaded = d.load_newest([&](const std::string& w) { warnings.push_back(w); });
  ASSERT_TRUE(loaded);
  EXPECT_EQ(loaded->state.step, 6);
  EXPECT_EQ(loaded->path, d.path(6));
  EXPECT_EQ(loaded->checkpoint.model[0].second.to_vector()[0], 6.0);
  ASSERT_EQ(warnings.size(), 3u);
  EXPECT_NE(warnings[0].find("skipping '" + d.path(11).string() + "'"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("key 'sampler' is missing"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[1].find("skipping '" + d.path(10).string() + "'"), std::string::npos) << warnings[1];
  EXPECT_NE(warnings[2].find("skipping '" + d.path(9).string() + "'"), std::string::npos) << warnings[2];
  EXPECT_FALSE(CheckpointDir(dir_ / "empty").load_newest({})) << "no folder: nothing to resume";
}

TEST_F(CheckpointDirTest, CheckpointsNewerThanAnExplicitResumeAreSetAside) {
  CheckpointDir d(dir_);
  for (int64_t s : {100, 200, 300}) d.save(s, checkpoint(s));
  const auto renamed = d.supersede_after(100);
  EXPECT_EQ(renamed,
            (std::vector<std::string>{d.path(200).string() + ".superseded", d.path(300).string() + ".superseded"}));
  EXPECT_EQ(steps_on_disk(d), (std::vector<int64_t>{100}));
  EXPECT_TRUE(fs::exists(d.path(300).string() + ".superseded")) << "kept, only no longer picked";
  EXPECT_EQ(d.load_newest({})->state.step, 100);
}

TEST_F(CheckpointDirTest, RemovesTemporaryFilesOfInterruptedWrites) {
  CheckpointDir d(dir_);
  d.save(2, checkpoint(2));
  // pid 2^22 + 1 is above Linux's pid_max default: no such process, so the write was interrupted.
  const std::string stale = ".ckpt-step00000004.h5.tmp-4194305";
  const std::string live = ".ckpt-step00000005.h5.tmp-" + std::to_string(::getppid());  // a live writer
  for (const auto& name : {stale, live, std::string(".other.tmp-1")}) std::ofstream(dir_ / name) << "partial";
  EXPECT_EQ(d.remove_stale_temp_files(), (std::vector<std::string>{stale}));
  EXPECT_FALSE(fs::exists(dir_ / stale));
  EXPECT_TRUE(fs::exists(dir_ / live));
  EXPECT_TRUE(fs::exists(dir_ / ".other.tmp-1"));
  EXPECT_TRUE(fs::exists(d.path(2)));
}

// A writer killed with kill -9 stays a zombie until its parent reaps it (for ever, in a container whose
// init does not): its file is stale all the same, or the relaunch after the kill would keep it.
TEST_F(CheckpointDirTest, AZombieWritersFileIsStale) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) ::_exit(0);
  for (int i = 0; i < 200; ++i) {  // until the child has exited (a zombie: not yet waited for)
    std::ifstream stat("/proc/" + std::to_string(child) + "/stat");
    std::string line;
    std::getline(stat, line);
    if (line.find(") Z") != std::string::npos) break;
    ::usleep(10000);
  }
  const std::string zombie = ".ckpt-step00000007.h5.tmp-" + std::to_string(child);
  std::ofstream(dir_ / zombie) << "partial";
  EXPECT_EQ(CheckpointDir(dir_).remove_stale_temp_files(), (std::vector<std::string>{zombie}));
  ::waitpid(child, nullptr, 0);
}

TEST_F(CheckpointDirTest, AnUnusableFolderIsAnErrorNamingTheFlag) {
  std::ofstream(dir_ / "file") << "x";
  const std::string e = testing::error_of([&] { CheckpointDir(dir_ / "file" / "sub").check_writable(); });
  EXPECT_NE(e.find("--checkpoint-dir: cannot create '" + (dir_ / "file" / "sub").string() + "'"), std::string::npos)
      << e;
  EXPECT_NO_THROW(CheckpointDir(dir_ / "new" / "deep").check_writable());
  EXPECT_TRUE(fs::is_directory(dir_ / "new" / "deep"));
  EXPECT_TRUE(fs::is_empty(dir_ / "new" / "deep")) << "the probe file is removed";
}

// Every checkpoint carries its run: keep_last deletes only this run's own files, a folder scan tells the
// runs apart, and files of another run (or unreadable ones) are the ones a run may not take as its own.
TEST_F(CheckpointDirTest, KeepLastDeletesOnlyThisRunsOwnCheckpoints) {
  const std::string mine = new_run_id(), theirs = new_run_id();
  ASSERT_NE(mine, theirs);
  ASSERT_EQ(mine.size(), 16u);
  CheckpointDir other(dir_);
  for (int64_t s = 1; s <= 3; ++s) other.save(s, checkpoint(s, theirs));
  CheckpointDir d(dir_, 2);
  d.set_run(mine, false);
  for (int64_t s = 10; s <= 14; ++s) d.save(s, checkpoint(s, mine));
  EXPECT_EQ(steps_on_disk(d), (std::vector<int64_t>{1, 2, 3, 13, 14})) << "the other run's 1-3 must survive";
  const auto entries = d.scan();
  ASSERT_EQ(entries.size(), 5u);
  EXPECT_EQ(entries[0].run_id, theirs);
  EXPECT_EQ(entries[4].run_id, mine);
  const auto others = others_of(d, entries);
  ASSERT_EQ(others.size(), 3u);
  EXPECT_EQ(describe_entries(others), "run " + theirs + " (steps 1-3, 3 files)");
  std::ofstream(d.path(20)) << "not a checkpoint";
  const auto with_bad = others_of(d, d.scan());
  ASSERT_EQ(with_bad.size(), 4u);
  EXPECT_NE(describe_entries(with_bad).find("unreadable (step 20, 1 file)"), std::string::npos)
      << describe_entries(with_bad);
}

// A file written before runs had an identity belongs to no run, unless this run was resumed from such a file.
TEST_F(CheckpointDirTest, FilesWithoutAnIdentityAreOnlyAResumedLegacyRunsOwn) {
  CheckpointDir legacy(dir_);
  legacy.save(4, checkpoint(4));
  CheckpointDir d(dir_, 1);
  d.set_run(new_run_id(), false);
  EXPECT_EQ(others_of(d, d.scan()).size(), 1u);
  EXPECT_EQ(describe_entries(others_of(d, d.scan())), "files written before runs had an identity (step 4, 1 file)");
  d.set_run(new_run_id(), true);
  EXPECT_TRUE(others_of(d, d.scan()).empty());
}

// Setting aside never replaces a file set aside before: the second explicit resume gets a new name.
TEST_F(CheckpointDirTest, FilesSetAsideAreNeverOverwritten) {
  CheckpointDir d(dir_);
  d.save(5, checkpoint(5));
  d.save(8, checkpoint(8));
  EXPECT_EQ(d.supersede_after(5), (std::vector<std::string>{(dir_ / "ckpt-step00000008.h5.superseded").string()}));
  d.save(8, checkpoint(8));  // the resumed run wrote step 8 again; a second resume from 5 sets it aside too
  EXPECT_EQ(d.supersede_after(5), (std::vector<std::string>{(dir_ / "ckpt-step00000008.h5.superseded-2").string()}));
  EXPECT_TRUE(fs::exists(dir_ / "ckpt-step00000008.h5.superseded"));
  // --start-over: into a new folder each time, the files keeping their names.
  d.save(9, checkpoint(9));
  const fs::path first = d.move_aside(d.scan());
  EXPECT_TRUE(fs::exists(first / "ckpt-step00000005.h5"));
  EXPECT_TRUE(fs::exists(first / "ckpt-step00000009.h5"));
  d.save(9, checkpoint(9));
  const fs::path second = d.move_aside(d.scan());
  EXPECT_NE(first, second);
  EXPECT_TRUE(fs::exists(first / "ckpt-step00000009.h5") && fs::exists(second / "ckpt-step00000009.h5"));
  EXPECT_TRUE(d.list().empty());
}

// A name of a checkpoint that is not a file (a folder, a dangling link) is not skipped in silence.
TEST_F(CheckpointDirTest, ResumeAutoWarnsAboutEntriesNamedLikeCheckpointsThatAreNotFiles) {
  CheckpointDir d(dir_);
  d.save(2, checkpoint(2));
  fs::create_directories(d.path(7));
  fs::create_symlink(dir_ / "nowhere.h5", d.path(8));
  std::vector<std::string> warnings;
  const auto loaded = d.load_newest([&](const std::string& w) { warnings.push_back(w); });
  ASSERT_TRUE(loaded);
  EXPECT_EQ(loaded->state.step, 2);
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_NE(warnings[0].find("ckpt-step00000007.h5' is named like a checkpoint but is a folder"), std::string::npos)
      << warnings[0];
  EXPECT_NE(warnings[1].find("ckpt-step00000008.h5' is named like a checkpoint but is a link to nothing readable"),
            std::string::npos)
      << warnings[1];
}

// The probe uses the longest name the run will write, so a folder too deep for it fails at the start.
TEST_F(CheckpointDirTest, AFolderTooDeepForTheRunsFileNamesFailsAtTheStart) {
  // A path whose components are short but whose whole length leaves room for a short probe only.
  fs::path deep = dir_;
  while (deep.string().size() < 4070) deep /= std::string(std::min<size_t>(200, 4070 - deep.string().size() - 1), 'd');
  std::error_code ec;
  fs::create_directories(deep, ec);
  if (ec) GTEST_SKIP() << "cannot make a " << deep.string().size() << "-character path here: " << ec.message();
  const std::string e = testing::error_of([&] { CheckpointDir(deep).check_writable(); });
  EXPECT_NE(e.find("is too deep: the names this run writes there"), std::string::npos) << e.substr(e.size() - 300);
}

TEST(TrainState, RoundTripsAndNamesTheFileAndKeyOfABadField) {
  TrainState s;
  s.step = 12;
  s.position = {2, 5};
  s.world_size = 4;
  s.global_batch = 64;
  s.per_step_global = 32;
  s.lr = 0.05;
  s.rng_stream = 77;
  s.loss_scale = LossScaleState{1024, 3};
  s.config = {{"batch_size", 8}};
  const TrainState t = TrainState::from_json(s.to_json(), "f.h5");
  EXPECT_EQ(t.step, 12);
  EXPECT_EQ(t.position.epoch, 2);
  EXPECT_EQ(t.position.next_batch, 5);
  EXPECT_EQ(t.world_size, 4);
  EXPECT_EQ(t.per_step_global, 32);
  EXPECT_EQ(t.rng_stream, 77u);
  ASSERT_TRUE(t.loss_scale);
  EXPECT_EQ(t.loss_scale->growth_tracker, 3);
  EXPECT_EQ(t.config["batch_size"], 8);
  auto error = [](const std::string& text) { return testing::error_of([&] { TrainState::from_json(text, "f.h5"); }); };
  EXPECT_NE(error("{not json").find("checkpoint 'f.h5': /meta/json is not valid JSON"), std::string::npos);
  const std::string base = R"("step": 1, "world_size": 1, "global_batch": 8, "sampler": {"epoch": 0, "next_batch": )";
  EXPECT_NE(error("{" + base + "\"3\"}}").find("'f.h5:/meta/json': key 'sampler.next_batch' must be an integer"),
            std::string::npos);
  EXPECT_NE(error("{" + base + "-1}}")
                .find("key 'sampler.next_batch' must be an integer from 0 to 9223372036854775807, got -1"),
            std::string::npos);
  EXPECT_NE(error(R"({"step": 1})").find("key 'sampler' is missing"), std::string::npos);
  EXPECT_NE(error("{" + base + R"(1}, "per_step_global": 3})")
                .find("key 'per_step_global' must be a divisor of global_batch 8, got 3"),
            std::string::npos);
}

TEST(TrainState, ThePositionConvertsAcrossWorldSizesAtTheSameGlobalBatch) {
  TrainState s;
  s.position = {1, 3};  // 3 batches of 2 ranks x 8 = 48 samples into epoch 1
  s.per_step_global = 16;
  EXPECT_EQ(s.position_for(8, 100, "f.h5").next_batch, 6);  // 1 rank x 8: 6 batches
  EXPECT_EQ(s.position_for(48, 100, "f.h5").next_batch, 1);
  EXPECT_EQ(s.position_for(16, 3, "f.h5").epoch, 2) << "a complete epoch continues at the next";
  EXPECT_EQ(s.position_for(16, 3, "f.h5").next_batch, 0);
  const std::string e = testing::error_of([&] { s.position_for(32, 100, "f.h5"); });
  EXPECT_NE(
      e.find("--resume f.h5: the checkpoint stopped after 48 samples of its epoch, not a multiple of this run's 32"),
      std::string::npos)
      << e;
  const std::string beyond = testing::error_of([&] { s.position_for(8, 5, "f.h5"); });
  EXPECT_NE(beyond.find("key 'sampler.next_batch' 3 is beyond the end of an epoch (5 batches of 8 images"),
            std::string::npos)
      << beyond;
  s.per_step_global = 0;  // written before per_step_global existed: this run's batches
  EXPECT_EQ(s.position_for(8, 100, "f.h5").next_batch, 3);
}

}  // namespace
}  // namespace ringtrain::runtime
