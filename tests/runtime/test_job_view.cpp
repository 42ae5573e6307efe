// runtime/tools/job_view.h: the tail of a growing log (complete lines only, a replaced log started over) and the
// screen drawn from it (the plan, progress against the run's steps, the step's phases, the evaluation,
// every rank's GPU, the summary once it came).
#include "runtime/tools/job_view.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "../test_util.h"

namespace ringtrain::runtime {
namespace {
namespace fs = std::filesystem;

std::string has(const std::string& screen, const std::string& part) {
  return screen.find(part) != std::string::npos ? "" : "missing '" + part + "' in:\n" + screen;
}

TEST(JobView, TheScreenOfARunningGpuJob) {
  LogTail tail(RINGTRAIN_JOB_VIEW_LOG);
  ASSERT_TRUE(tail.poll());
  const std::string s = render_job_view(tail.last(), 3);
  for (const char* part :
       {"ringtrain job: resnet50 on cuda:0, 2 rank(s) on 1 node(s), nccl, batch 64 x 2 accum = 256 global",
        "predicted peak 32.00 GiB per rank, budget 132.00 GiB (rank 0)", "step 300/1000 (30%), epoch 1: loss 3.1000",
        "2160 img/s", "step time 0.480 s = data 0.010 + forward 0.150 + backward 0.280 + comm 0.030",
        "evaluation at step 250: top-1 45.20%", "   0   97%", "   1   95%", "61C", "412 W",
        "running; the log last grew 3 s ago"})
    EXPECT_EQ(has(s, part), "");
}

TEST(JobView, TheTailReadsOnlyCompleteLinesAndStartsOverOnANewLog) {
  const fs::path path = fs::path(::testing::TempDir()) / ("rt_jobview_" + std::to_string(::getpid()) + ".jsonl");
  fs::remove(path);
  LogTail tail(path.string());
  EXPECT_FALSE(tail.poll()) << "no file yet";
  EXPECT_EQ(render_job_view({}, 0), "no plan record yet: the job has not started training\n");
  {
    std::ofstream out(path);
    out << R"({"type":"plan","arch":"resnet20","world_size":1,"nodes":1,"total_steps":10})"
        << "\n"
        << R"({"type":"train","step":4,"epoch":0,"loss":2.5)";  // a writer mid-line
  }
  ASSERT_TRUE(tail.poll());
  EXPECT_EQ(tail.last().count("train"), 0u);
  EXPECT_EQ(has(render_job_view(tail.last(), 0), "no step reported yet"), "");
  {
    std::ofstream out(path, std::ios::app);
    out << R"(,"lr":0.1,"img_per_s":100})"
        << "\n"
        << R"({"type":"summary","steps":10,"elapsed_s":12,"img_per_s":99,"peak_mem_bytes":104857600})"
        << "\n";
  }
  ASSERT_TRUE(tail.poll());
  const std::string s = render_job_view(tail.last(), 0);
  EXPECT_EQ(has(s, "step 4/10 (40%)"), "");
  EXPECT_EQ(has(s, "finished: 10 steps in 12 s, 99 img/s, peak memory 100.00 MiB"), "");
  EXPECT_EQ(has(s, "no GPU readings"), "");
  // A new run replaces the log: what the old one said is gone.
  {
    std::ofstream(path) << R"({"type":"plan","arch":"resnet50","world_size":4,"nodes":2})"
                        << "\n";
  }
  ASSERT_TRUE(tail.poll());
  EXPECT_EQ(tail.last().count("summary"), 0u);
  EXPECT_EQ(has(render_job_view(tail.last(), 0), "resnet50"), "");
  fs::remove(path);
}

// A longer log moved over the watched one (a new inode, never shorter): the old plan must not be drawn
// with the new run's steps ("step 8/6 (133%)"); a new plan record starts the view over too.
TEST(JobView, ALongerLogReplacingTheWatchedOneStartsTheViewOver) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("rt_jobview_r" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path path = dir / "log.jsonl";
  std::ofstream(path) << R"({"type":"plan","arch":"resnet20","total_steps":6})"
                      << "\n"
                      << R"({"type":"train","step":3,"epoch":0,"loss":2.5,"lr":0.1,"img_per_s":100})"
                      << "\n";
  LogTail tail(path.string());
  ASSERT_TRUE(tail.poll());
  EXPECT_EQ(has(render_job_view(tail.last(), 0), "step 3/6 (50%)"), "");
  std::ofstream(dir / "new.jsonl") << R"({"type":"plan","arch":"resnet56","total_steps":10})"
                                   << "\n"
                                   << R"({"type":"train","step":7,"epoch":0,"loss":2.0,"lr":0.1,"img_per_s":100})"
                                   << "\n"
                                   << R"({"type":"train","step":8,"epoch":0,"loss":1.9,"lr":0.1,"img_per_s":100})"
                                   << "\n";
  fs::rename(dir / "new.jsonl", path);
  ASSERT_TRUE(tail.poll());
  std::string s = render_job_view(tail.last(), 0);
  EXPECT_EQ(has(s, "resnet56"), "");
  EXPECT_EQ(has(s, "step 8/10 (80%)"), "");
  // The same file, appended to by a second run: its plan record starts the view over.
  std::ofstream(path, std::ios::app) << R"({"type":"plan","arch":"resnet110","total_steps":4})"
                                     << "\n";
  ASSERT_TRUE(tail.poll());
  s = render_job_view(tail.last(), 0);
  EXPECT_EQ(has(s, "resnet110"), "");
  EXPECT_EQ(has(s, "no step reported yet"), "");
  fs::remove_all(dir);
}

// A longer log written over the watched one in place (`cat new > log`: the same inode, never shorter when
// read) is a new log too: run 1's plan is never drawn with run 2's steps.
TEST(JobView, ALogRewrittenInPlaceStartsTheViewOver) {
  const fs::path path = fs::path(::testing::TempDir()) / ("rt_jobview_i" + std::to_string(::getpid()) + ".jsonl");
  std::ofstream(path) << R"({"type":"plan","arch":"resnet20","total_steps":6})"
                      << "\n"
                      << R"({"type":"train","step":3,"epoch":0,"loss":2.5,"lr":0.1,"img_per_s":100})"
                      << "\n";
  struct stat before {};
  ASSERT_EQ(::stat(path.c_str(), &before), 0);
  LogTail tail(path.string());
  ASSERT_TRUE(tail.poll());
  EXPECT_EQ(has(render_job_view(tail.last(), 0), "step 3/6 (50%)"), "");
  {
    std::ofstream out(path, std::ios::trunc);  // the same file, truncated and written longer
    out << R"({"type":"plan","arch":"resnet56","total_steps":10})"
        << "\n";
    for (int step = 1; step <= 8; ++step)
      out << R"({"type":"train","step":)" << step << R"(,"epoch":0,"loss":2.0,"lr":0.1,"img_per_s":100})"
          << "\n";
  }
  struct stat after {};
  ASSERT_EQ(::stat(path.c_str(), &after), 0);
  ASSERT_EQ(after.st_ino, before.st_ino);
  ASSERT_TRUE(tail.poll());
  const std::string s = render_job_view(tail.last(), 0);
  EXPECT_EQ(has(s, "resnet56"), "");
  EXPECT_EQ(has(s, "step 8/10 (80%)"), "");
  fs::remove(path);
}

// What is not a log, or a record with a field of the wrong type, is an error naming the path, the line
// and the key; never a crash (bad_alloc on a folder, a type_error) or a hang (a FIFO).
TEST(JobView, AFolderAFifoOrAWrongTypeIsNamed) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("rt_jobview_b" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "folder");
  EXPECT_NE(testing::error_of([&] { LogTail((dir / "folder").string()).poll(); }).find("is a folder"),
            std::string::npos);
  ASSERT_EQ(::mkfifo((dir / "fifo").c_str(), 0600), 0);
  EXPECT_NE(testing::error_of([&] { LogTail((dir / "fifo").string()).poll(); }).find("is a FIFO"), std::string::npos);
  for (const auto& [record, key] :
       {std::pair{R"({"type":"plan","arch":5})", "key 'arch' must be a string, got 5"},
        std::pair{R"({"type":"plan","world_size":"two"})", "key 'world_size' must be an integer"},
        std::pair{R"({"type":"plan","memory":{"budget_bytes_by_rank":"x"}})", "key 'memory.budget_bytes_by_rank'"},
        std::pair{R"({"type":"gpu","samples":[{"rank":"0"}]})", "key 'samples[0].rank' must be an integer"},
        std::pair{R"({"type":"plan","world_size":18446744073709551616})", "key 'world_size' must be an integer"},
        std::pair{R"({"type":"plan","batch_size":-3})", "key 'batch_size' must be an integer from 0"},
        std::pair{R"({"type":7})", "key 'type' must be a string"},
        std::pair{R"({"type":"train","step":"8"})", "key 'step' must be an integer"},
        std::pair{R"({"type":"train","step":1,"loss":"low"})", "key 'loss' must be a number (or null)"},
        std::pair{R"({"type":"train","step":1,"time":{"forward":[1]}})", "key 'time.forward' must be a number"},
        std::pair{R"({"type":"train","step":1,"time":3})", "key 'time' must be an object"},
        std::pair{R"({"type":"eval","step":1,"test_top1":true})", "key 'test_top1' must be a number"},
        std::pair{R"({"type":"summary","steps":"10","elapsed_s":12})", "key 'steps' must be an integer"},
        std::pair{R"({"type":"summary","steps":10,"elapsed_s":"12 s"})", "key 'elapsed_s' must be a number"}}) {
    const fs::path log = dir / "log.jsonl";
    std::ofstream(log) << R"({"type":"plan","arch":"resnet20"})"
                       << "\n"
                       << record << "\n";
    const std::string e = testing::error_of([&] { LogTail(log.string()).poll(); });
    EXPECT_NE(e.find(log.string() + ":2': " + key), std::string::npos) << e;
  }
  // A figure that was not finite is written as null (a NaN loss): drawn as nan, not refused.
  std::ofstream(dir / "nan.jsonl") << R"({"type":"plan","arch":"resnet20","total_steps":4})"
                                   << "\n"
                                   << R"({"type":"train","step":2,"epoch":0,"loss":null,"lr":0.1,"img_per_s":10})"
                                   << "\n";
  LogTail nan_tail((dir / "nan.jsonl").string());
  ASSERT_TRUE(nan_tail.poll());
  EXPECT_EQ(has(render_job_view(nan_tail.last(), 0), "loss nan"), "");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ringtrain::runtime
