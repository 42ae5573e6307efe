// tests/runtime/test_plan.cpp: the loop's policies on their own (runtime/config/plan.h, runtime/checkpoint/resume.h's
// config comparison): the run's shape, the learning-rate schedule, the report/checkpoint/evaluate/stop cadences. Pure
// functions: no MPI, no files.
#include <gtest/gtest.h>

#include "runtime/checkpoint/resume.h"
#include "runtime/config/cli.h"
#include "runtime/config/data_source.h"
#include "runtime/config/plan.h"
#include "runtime/loop/reporter.h"
#include "test_util.h"

using namespace ringtrain;
using namespace ringtrain::runtime;

namespace {

DataInfo data_of(int64_t train_size) {
  DataInfo info;
  info.train_size = train_size;
  return info;
}

TrainerOptions options(int64_t batch, int64_t accum, int64_t epochs = 1, int64_t steps = 0) {
  TrainerOptions o;
  o.batch = batch;
  o.accum = accum;
  o.epochs = epochs;
  o.steps = steps;
  return o;
}

}  // namespace

TEST(RunPlan, StepsAreWholeAccumulationsOfEveryRanksBatches) {
  // 1000 records, 10 per rank x 2 ranks = 20 per sampler batch: 50 batches, 16 steps of 3 (2 left over).
  const RunPlan p = plan_run(options(10, 3, 2), data_of(1000), 2);
  EXPECT_EQ(p.per_step_global, 20);
  EXPECT_EQ(p.global_batch, 60);
  EXPECT_EQ(p.steps_per_epoch, 16);
  EXPECT_EQ(p.micro_per_epoch, 48);
  EXPECT_EQ(p.total_steps, 32);
  EXPECT_EQ(p.epochs, 2);
}

TEST(RunPlan, StepsOverrideEpochsAndTheLoopVisitsEnoughEpochs) {
  const RunPlan p = plan_run(options(10, 3, 1, 40), data_of(1000), 2);
  EXPECT_EQ(p.total_steps, 40);
  EXPECT_EQ(p.epochs, 3);  // 16 + 16 + 8
  EXPECT_EQ(plan_run(options(10, 3, 1, 32), data_of(1000), 2).epochs, 2);
}

TEST(RunPlan, TheSamplerBatchIsOneMicroBatchOfEveryRank) {
  TrainerOptions o = options(8, 4);
  o.seed = 7;
  DataInfo info = data_of(500);
  info.chunk = 16;
  const data::SamplerOptions so = sampler_options(o, info, 1, 3);
  EXPECT_EQ(so.global_batch, 24);
  EXPECT_EQ(so.rank, 1);
  EXPECT_EQ(so.world_size, 3);
  EXPECT_EQ(so.seed, 7u);
  EXPECT_EQ(so.chunk, 16);
  EXPECT_EQ(so.dataset_size, 500);
}

TEST(RunPlan, AGlobalBatchLargerThanTheSplitNamesTheFlags) {
  const std::string e = ringtrain::testing::error_of([] { plan_run(options(100, 2), data_of(300), 2); });
  EXPECT_NE(e.find("--batch-size 100 x 2 ranks x --accum-steps 2 = global batch 400 is larger than the training split "
                   "(300 records)"),
            std::string::npos)
      << e;
}

TEST(LearningRate, LinearScalingIsByTheGlobalBatch) {
  TrainerOptions o = options(64, 2);
  o.lr = 0.1;
  const RunPlan p = plan_run(o, data_of(10000), 2);  // global batch 256
  EXPECT_DOUBLE_EQ(base_lr(o, p), 0.1);
  o.lr_scaling = LrScaling::Linear;
  EXPECT_DOUBLE_EQ(base_lr(o, plan_run(o, data_of(10000), 4)), 0.2);
  EXPECT_DOUBLE_EQ(schedule_for(o, plan_run(o, data_of(10000), 4)).base_lr, 0.2);
}

TEST(LearningRate, MultistepMilestonesAreEpochsInSteps) {
  TrainerOptions o = options(10, 1, 8);
  o.lr_schedule = LrShape::MultiStep;
  const RunPlan p = plan_run(o, data_of(1000), 1);                             // 100 steps per epoch
  EXPECT_EQ(schedule_for(o, p).milestones, (std::vector<int64_t>{400, 600}));  // 50% and 75% of 8 epochs
  o.lr_milestones = "1,2.5";
  EXPECT_EQ(schedule_for(o, p).milestones, (std::vector<int64_t>{100, 250}));
  o.lr_milestones = "3,2";
  EXPECT_NE(ringtrain::testing::error_of([&] {
              schedule_for(o, p);
            }).find("--lr-milestones must be increasing epochs, got '3,2'"),
            std::string::npos);
}

TEST(LearningRate, StepDecayAndWarmupCountInSteps) {
  TrainerOptions o = options(10, 1, 4);
  o.lr_schedule = LrShape::Step;
  o.lr_step_epochs = 1.5;
  o.warmup_epochs = 0.5;
  const LrScheduleOptions s = schedule_for(o, plan_run(o, data_of(1000), 1));
  EXPECT_EQ(s.step_size, 150);
  EXPECT_EQ(s.warmup_steps, 50);
  EXPECT_EQ(s.total_steps, 400);
  EXPECT_EQ(s.shape, LrShape::Step);
}

TEST(LearningRate, ACosineWarmupMustEndBeforeTheRun) {
  TrainerOptions o = options(10, 1, 2);
  o.warmup_epochs = 2;
  const std::string e = ringtrain::testing::error_of([&] { schedule_for(o, plan_run(o, data_of(1000), 1)); });
  EXPECT_NE(e.find("--warmup-epochs 2 (200 steps) must end before the run does (200 steps)"), std::string::npos) << e;
  o.lr_schedule = LrShape::Step;  // a step schedule may warm up for the whole run
  EXPECT_NO_THROW(schedule_for(o, plan_run(o, data_of(1000), 1)));
}

TEST(LearningRate, MilestonesThatAreNotEpochsNameTheFlag) {
  EXPECT_EQ(parse_milestones("30,60.5"), (std::vector<double>{30, 60.5}));
  for (const char* bad : {"30,,60", "x", "-1", "nan", "30;60", "1e400"})
    EXPECT_NE(ringtrain::testing::error_of([&] {
                parse_milestones(bad);
              }).find("--lr-milestones (epochs): a comma-separated list, each item a finite number in [0, 1e+06]"),
              std::string::npos)
        << bad;
}

TEST(Cadence, ReportsEveryLogEveryStepsSinceTheLastAndAtTheEnd) {
  TrainerOptions o = options(10, 1, 1);
  o.log_every = 5;
  const RunPlan p = plan_run(o, data_of(120), 1);  // 12 steps
  EXPECT_FALSE(after_step(o, p, 4, 4, false, false).report);
  EXPECT_TRUE(after_step(o, p, 5, 5, false, false).report);
  EXPECT_TRUE(after_step(o, p, 7, 7, false, false).report);  // counted from the last report, not the step number
  EXPECT_TRUE(after_step(o, p, 1, 1, true, false).report);   // the bar redraws every step
  const AfterStep last = after_step(o, p, 12, 2, false, false);
  EXPECT_TRUE(last.report);
  EXPECT_TRUE(last.stop);
  EXPECT_FALSE(after_step(o, p, 11, 1, false, false).stop);
}

TEST(Cadence, CheckpointsEveryNStepsOrWhenTimeIsDueButNotAtTheLastStep) {
  TrainerOptions o = options(10, 1, 1);
  o.checkpoint_every = 4;
  const RunPlan p = plan_run(o, data_of(120), 1);  // 12 steps
  std::vector<int64_t> saved;
  for (int64_t step = 1; step <= p.total_steps; ++step)
    if (after_step(o, p, step, 1, false, false).checkpoint) saved.push_back(step);
  EXPECT_EQ(saved, (std::vector<int64_t>{4, 8}));  // 12 is the final checkpoint, written after the loop
  EXPECT_TRUE(after_step(o, p, 5, 1, false, true).checkpoint);
  EXPECT_FALSE(after_step(o, p, 12, 1, false, true).checkpoint);
  o.checkpoint_every = 0;
  EXPECT_FALSE(after_step(o, p, 4, 1, false, false).checkpoint);
}

TEST(Cadence, EvaluatesEveryEvalEveryEpochsAtTheLastAndWhenStopped) {
  TrainerOptions o = options(10, 1, 5);
  o.eval_every = 2;
  const RunPlan p = plan_run(o, data_of(100), 1);
  std::vector<int64_t> evaluated;
  for (int64_t epoch = 0; epoch < p.epochs; ++epoch)
    if (after_epoch(o, p, epoch, false, true, false).evaluate) evaluated.push_back(epoch);
  EXPECT_EQ(evaluated, (std::vector<int64_t>{1, 3, 4}));
  EXPECT_TRUE(after_epoch(o, p, 0, true, false, false).evaluate);  // --steps ended the run inside epoch 0
}

TEST(Cadence, EpochCheckpointsAtCompleteEpochsBeforeTheEndOnce) {
  TrainerOptions o = options(10, 1, 3);
  const RunPlan p = plan_run(o, data_of(100), 1);
  EXPECT_TRUE(after_epoch(o, p, 0, false, true, false).checkpoint);
  EXPECT_FALSE(after_epoch(o, p, 0, false, true, true).checkpoint);    // the time cadence wrote this step already
  EXPECT_FALSE(after_epoch(o, p, 2, true, true, false).checkpoint);    // the final one comes after the loop
  EXPECT_FALSE(after_epoch(o, p, 0, false, false, false).checkpoint);  // the epoch's data ran out early
  o.checkpoint_every = 5;
  EXPECT_FALSE(after_epoch(o, p, 0, false, true, false).checkpoint);
}

TEST(Cadence, TimeCheckpointsComeDueAfterTheirMinutes) {
  TrainerOptions o;
  EXPECT_FALSE(time_checkpoint_due(o, 1e9));  // off
  o.checkpoint_every_min = 0.5;
  EXPECT_FALSE(time_checkpoint_due(o, 29.9));
  EXPECT_TRUE(time_checkpoint_due(o, 30));
}

TEST(Cadence, TheFirstStepOfARunStaysOutOfTheBreakdownUnlessAlone) {
  EXPECT_FALSE(counts_in_breakdown(1, 0, 10));
  EXPECT_TRUE(counts_in_breakdown(2, 0, 10));
  EXPECT_FALSE(counts_in_breakdown(6, 5, 10));  // resumed at 5: its first step is 6
  EXPECT_TRUE(counts_in_breakdown(1, 0, 1));
  EXPECT_TRUE(finished({.step = 10, .position = {}}, plan_run(options(10, 1, 1), data_of(100), 1)));
  EXPECT_FALSE(finished({.step = 9, .position = {}}, plan_run(options(10, 1, 1), data_of(100), 1)));
}

TEST(ResumeConfig, AnotherModelOptimizerOrDatasetIsRefused) {
  const nlohmann::json written{{"model", "resnet20"}, {"optimizer", "sgd"}, {"dataset", "a"}, {"lr", 0.1}};
  for (const auto& [key, value] : {std::pair{"model", "resnet56"}, {"optimizer", "adamw"}, {"dataset", "b"}}) {
    nlohmann::json now = written;
    now[key] = value;
    const ConfigComparison c = compare_config(written, now, "f.h5");
    EXPECT_NE(c.refusal.find("--resume f.h5: the checkpoint was written with"), std::string::npos) << c.refusal;
    // Named as the user knows them: the model is no flag of every program ("--model" exists nowhere).
    const std::string named = std::string(key) == "dataset" ? "the dataset \"a\""
                              : std::string(key) == "model" ? "the model \"resnet20\""
                                                            : "--optimizer \"sgd\"";
    EXPECT_NE(c.refusal.find(named), std::string::npos) << c.refusal;
    EXPECT_EQ(c.refusal.find("--model"), std::string::npos) << c.refusal;
  }
}

TEST(ResumeConfig, ScheduleChangesAreListedOldToNew) {
  const nlohmann::json written{{"model", "m"}, {"lr", 0.1}, {"epochs", 2}, {"lr_schedule", "cosine"}};
  nlohmann::json now = written;
  EXPECT_TRUE(compare_config(written, now, "f").changes.empty());
  now["lr"] = 0.2;
  now["epochs"] = 4;
  const ConfigComparison c = compare_config(written, now, "f");
  EXPECT_TRUE(c.refusal.empty());
  EXPECT_EQ(c.changes, "--epochs 2 -> 4, --lr 0.1 -> 0.2");
}

// The flags a checkpoint records are the command line's, every one of them (the app's own too), so a
// resume that changes any flag that is not about how the run is carried out is said, naming old and new.
namespace {

// The configuration a checkpoint records for an app's command line: the shared flags and two of its own.
nlohmann::json flags_of(std::vector<std::string> args) {
  CLI::App app{"t"};
  TrainerOptions o;
  std::string data;
  bool hflip = true;
  int64_t image_size = 0;
  add_trainer_flags(app, o, data);
  app.add_flag("!--no-hflip", hflip, "an app's own flag");
  app.add_option("--image-size", image_size, "another");
  args.insert(args.begin(), "t");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  app.parse(static_cast<int>(argv.size()), argv.data());
  nlohmann::json config = o.to_json();
  return config;
}

}  // namespace

TEST(ResumeConfig, EveryFlagOfTheCommandLineIsComparedButTheRuntimeOnes) {
  const nlohmann::json base = flags_of({"--data", "d", "--lr", "0.1"});
  ASSERT_TRUE(base.contains("flags"));
  EXPECT_EQ(base["flags"]["no_hflip"], "off");
  EXPECT_EQ(base["flags"]["seed"], "0");
  EXPECT_EQ(compare_config(base, flags_of({"--data", "d", "--lr", "1e-1"}), "f").changes, "") << "one number";
  // How a run is carried out may change silently: threads, folders, cadences, logs, the timeout.
  EXPECT_EQ(compare_config(base,
                           flags_of({"--data", "elsewhere", "--lr", "0.1", "--threads", "3", "--log-every", "7",
                                     "--checkpoint-dir", "c", "--timeout", "60", "--zero", "1"}),
                           "f")
                .changes,
            "");
  // What it trains may not: the seed, Nesterov, an app's augmentation flags, precision, label smoothing.
  const std::string changed =
      compare_config(base,
                     flags_of({"--data", "d", "--lr", "0.1", "--seed", "1", "--nesterov", "--no-hflip", "--image-size",
                               "64", "--precision", "bf16", "--label-smoothing", "0.1"}),
                     "f")
          .changes;
  for (const char* want : {"--seed 0 -> 1", "--nesterov off -> on", "--no-hflip off -> on", "--image-size 0 -> 64",
                           "--precision fp32 -> bf16", "--label-smoothing 0 -> 0.1"})
    EXPECT_NE(changed.find(want), std::string::npos) << want << " in: " << changed;
  // A checkpoint written before flags were recorded: its typed configuration is compared instead.
  nlohmann::json old = base;
  old.erase("flags");
  nlohmann::json now = flags_of({"--data", "d", "--lr", "0.1", "--seed", "5"});
  EXPECT_NE(compare_config(old, now, "f").changes.find("--seed 0 -> 5"), std::string::npos);
}

// --tf32 changes what f32 convolutions and GEMMs compute on a GPU: another value on resume is said. A
// checkpoint written before the flag existed has no "tf32" (in its flags nor in its typed configuration);
// its run used TF32, so it counts as on: resumed with the default nothing is said, with off the change is.
TEST(ResumeConfig, AnotherTf32IsSaidAndACheckpointWithoutItCountsAsOn) {
  const nlohmann::json on = flags_of({"--data", "d"}), off = flags_of({"--data", "d", "--tf32", "off"});
  EXPECT_EQ(compare_config(on, off, "f").changes, "--tf32 on -> off");
  EXPECT_EQ(compare_config(off, on, "f").changes, "--tf32 off -> on");
  EXPECT_EQ(compare_config(off, off, "f").changes, "");
  nlohmann::json before = on;
  before.erase("tf32");
  before["flags"].erase("tf32");
  EXPECT_EQ(compare_config(before, on, "f").changes, "") << "an older checkpoint resumed with the default";
  EXPECT_EQ(compare_config(before, off, "f").changes, "--tf32 on -> off");
  nlohmann::json typed = before;  // nor any recorded flags: the typed configurations are compared
  typed.erase("flags");
  EXPECT_EQ(compare_config(typed, on, "f").changes, "");
  EXPECT_EQ(compare_config(typed, off, "f").changes, "--tf32 on -> off");
  // Only flags introduced later have a value before they existed: another missing flag is still a change.
  nlohmann::json no_seed = on;
  no_seed["flags"].erase("seed");
  EXPECT_EQ(compare_config(no_seed, on, "f").changes, "--seed (none) -> 0");
}

// The startup line's map of ranks to hosts, which names the ranks of a host mpirun reports lost.
TEST(RanksByHost, ConsecutiveRanksAreRanges) {
  using ringtrain::runtime::ranks_by_host;
  EXPECT_EQ(ranks_by_host({"node0", "node0", "node1", "node1"}), "node0 0-1, node1 2-3");
  EXPECT_EQ(ranks_by_host({"a", "b", "a", "b", "a"}), "a 0,2,4, b 1,3");
  EXPECT_EQ(ranks_by_host({"a", "a", "a", "b", "a"}), "a 0-2,4, b 3");
}
