// Tests for runtime/tools/supervisor.h: the elastic supervisor's decisions — hostfiles, mpirun arguments, the
// training command's flags, the world of a relaunch (the global batch kept), event lines and the verdict
// on a failure. The processes themselves are tests/apps/elastic.sh's and the cluster "elastic" scenario's.
#include "runtime/tools/supervisor.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace ringtrain::runtime::supervisor {
namespace {

using json = nlohmann::json;

TEST(Supervisor, ReadsHostfilesNamingTheBadLine) {
  const auto hosts = parse_hostfile("# the cluster\nnode0 slots=2\n\nnode1 slots=4 max_slots=8  # big\nnode0\n", "h");
  ASSERT_EQ(hosts.size(), 2u);
  EXPECT_EQ(hosts[0].name, "node0");
  EXPECT_EQ(hosts[0].slots, 3) << "a host named twice adds its slots";
  EXPECT_EQ(hosts[1].slots, 4);
  EXPECT_EQ(total_slots(hosts), 7);
  EXPECT_EQ(hostfile_text(hosts_for(hosts, 4)), "node0 slots=3\nnode1 slots=1\n");
  EXPECT_EQ(hostfile_text(hosts_for(hosts, 2)), "node0 slots=2\n");
  EXPECT_NE(
      testing::error_of([] { parse_hostfile("a\nb slots=x\n", "hf"); }).find("hostfile 'hf' line 2: slots must be"),
      std::string::npos);
  EXPECT_NE(testing::error_of([] { parse_hostfile("a cores=2\n", "hf"); }).find("expected 'HOST [slots=N]"),
            std::string::npos);
  EXPECT_NE(testing::error_of([] { parse_hostfile("# none\n", "hf"); }).find("names no host"), std::string::npos);
}

TEST(Supervisor, SplitsMpirunArgsAsShDoes) {
  EXPECT_EQ(split_words("  -x A=1  --mca btl 'tcp,self' \"a b\" c\\ d "),
            (std::vector<std::string>{"-x", "A=1", "--mca", "btl", "tcp,self", "a b", "c d"}));
  EXPECT_TRUE(split_words("").empty());
  EXPECT_NE(testing::error_of([] { split_words("--mca 'x"); }).find("unbalanced ' quote"), std::string::npos);
  const MpirunArgs m = parse_mpirun_args(split_words("--hostfile /h --mca plm_rsh_agent /a/agent --bind-to none"));
  EXPECT_EQ(m.hostfile, "/h");
  EXPECT_EQ(m.agent, "/a/agent");
  EXPECT_EQ(m.rest, (std::vector<std::string>{"--mca", "plm_rsh_agent", "/a/agent", "--bind-to", "none"}));
  for (const char* own : {"-np", "-n", "--host", "-H"})
    EXPECT_NE(testing::error_of([&] {
                parse_mpirun_args({own, "4"});
              }).find(std::string(own) + " is ringtrain_run's to set"),
              std::string::npos)
        << own;
}

TEST(Supervisor, ReadsTheTrainingCommandsFlagsLastOneWins) {
  const JobFlags f = read_job_flags({"./train", "--accum-steps", "2", "--checkpoint-dir=ck", "--log-jsonl", "l.jsonl",
                                     "--accum-steps=3", "--resume", "auto"});
  EXPECT_EQ(f.accum, 3);
  EXPECT_EQ(f.checkpoint_dir, "ck");
  EXPECT_EQ(f.log_jsonl, "l.jsonl");
  EXPECT_EQ(f.resume, "auto");
  EXPECT_EQ(read_job_flags({"./train"}).accum, 1);
  EXPECT_NE(testing::error_of([] {
              read_job_flags({"./t", "--accum-steps", "0"});
            }).find("--accum-steps must be"),
            std::string::npos);
  EXPECT_NE(testing::error_of([] {
              read_job_flags({"./t", "--checkpoint-dir"});
            }).find("has no value"),
            std::string::npos);
  const ResumePoint at9{"ck/ckpt-step00000009.h5", 9};
  EXPECT_EQ(relaunch_command({"./t", "-b", "8"}, JobFlags{}, 2, at9),
            (std::vector<std::string>{"./t", "-b", "8", "--accum-steps", "2", "--resume", "ck/ckpt-step00000009.h5"}));
  EXPECT_EQ(relaunch_command({"./t"}, JobFlags{}, 1, ResumePoint{}), (std::vector<std::string>{"./t"}));
  // With --global-batch the trainer chooses the accumulation for the new world itself.
  const JobFlags global = read_job_flags({"./t", "-b", "auto", "--global-batch", "256"});
  EXPECT_TRUE(global.global_batch);
  EXPECT_EQ(
      relaunch_command({"./t", "-b", "auto", "--global-batch", "256"}, global, 2, at9),
      (std::vector<std::string>{"./t", "-b", "auto", "--global-batch", "256", "--resume", "ck/ckpt-step00000009.h5"}));
  EXPECT_EQ(relaunch_command({"./t"}, JobFlags{}, 1, at9, true),
            (std::vector<std::string>{"./t", "--resume", "ck/ckpt-step00000009.h5", "--allow-batch-change"}));
}

// A relaunch resumes exactly what it announces: the newest checkpoint this run resumed or wrote, else the
// command's own --resume (never an --resume auto of its own, which on a folder without this run's
// checkpoints starts from random weights), and a relaunch that resumed anything else is a permanent error.
TEST(Supervisor, ARelaunchResumesWhatItAnnouncesAndIsCheckedAgainstIt) {
  JobFlags from_path;
  from_path.resume = "old/ckpt-step00000006.h5";
  // The first launch failed before it reported anything: the command's --resume stays, nothing is added.
  ResumePoint p = newest_resume_point({}, "", -1, {});
  EXPECT_TRUE(p.path.empty());
  EXPECT_EQ(relaunch_command({"./t", "--resume", "old/ckpt-step00000006.h5"}, from_path, 1, p),
            (std::vector<std::string>{"./t", "--resume", "old/ckpt-step00000006.h5"}));
  EXPECT_EQ(describe_resume(p, from_path), "the command's --resume old/ckpt-step00000006.h5");
  EXPECT_EQ(check_resumed(p, from_path, "old/ckpt-step00000006.h5", 6), "");
  EXPECT_NE(check_resumed(p, from_path, "", 0)
                .find("the relaunch resumed from the start but "
                      "old/ckpt-step00000006.h5 was announced"),
            std::string::npos);
  // It reported its resume (step 6), then wrote step 9 and failed: the relaunch resumes step 9, explicitly.
  p = newest_resume_point(p, "old/ckpt-step00000006.h5", 6, {{9, "new/ckpt-step00000009.h5"}});
  EXPECT_EQ(p.path, "new/ckpt-step00000009.h5");
  EXPECT_EQ(p.step, 9);
  EXPECT_EQ(describe_resume(p, from_path), "step 9 from new/ckpt-step00000009.h5");
  EXPECT_EQ(check_resumed(p, from_path, "new/ckpt-step00000009.h5", 9), "");
  EXPECT_NE(check_resumed(p, from_path, "new/ckpt-step00000009.h5", 3).find("at step 3 but step 9 was announced"),
            std::string::npos);
  EXPECT_NE(check_resumed(p, from_path, "other/ckpt-step00000012.h5", 12).find("resumed from other/"),
            std::string::npos);
  // An older report never replaces a newer one.
  EXPECT_EQ(newest_resume_point(p, "old/ckpt-step00000006.h5", 6, {}).step, 9);
  // A fresh run that failed before its first checkpoint starts afresh, and must.
  const JobFlags fresh{};
  EXPECT_EQ(describe_resume({}, fresh), "the start (no checkpoint yet)");
  EXPECT_EQ(check_resumed({}, fresh, "", 0), "");
  EXPECT_NE(check_resumed({}, fresh, "x/ckpt-step00000003.h5", 3), "");
}

// The global batch is base_np x base_accum per-rank batches: a relaunch takes the most ranks that divide it.
TEST(Supervisor, PlansTheLargestWorldThatKeepsTheGlobalBatch) {
  std::string why;
  auto w = plan_world(2, 1, 1, 1, 2, false, why);
  ASSERT_TRUE(w);
  EXPECT_EQ(w->np, 1);
  EXPECT_EQ(w->accum, 2);
  w = plan_world(8, 1, 7, 1, 8, false, why);  // 7 slots left of 8: 4 ranks x accum 2
  ASSERT_TRUE(w);
  EXPECT_EQ(w->np, 4);
  EXPECT_EQ(w->accum, 2);
  w = plan_world(4, 2, 16, 1, 8, false, why);  // hosts back, --max-np 8: 8 ranks x accum 1
  ASSERT_TRUE(w);
  EXPECT_EQ(w->np, 8);
  EXPECT_EQ(w->accum, 1);
  EXPECT_FALSE(plan_world(4, 1, 1, 2, 4, false, why));
  EXPECT_NE(why.find("only 1 rank slot(s) are left on the hosts that answer, fewer than --min-np 2"), std::string::npos)
      << why;
  EXPECT_FALSE(plan_world(3, 1, 2, 2, 3, false, why));
  EXPECT_NE(why.find("cannot be kept on 2 to 2 ranks"), std::string::npos) << why;
  w = plan_world(3, 1, 2, 2, 3, true, why);
  ASSERT_TRUE(w);
  EXPECT_TRUE(w->batch_changed);
  EXPECT_EQ(w->np, 2);
  EXPECT_EQ(w->accum, 2);
}

// With pipeline stages the world stays stages x replicas: the replicas shrink first (accum grows to keep
// the batch); only when no multiple of the stages keeps it are the stages lowered.
TEST(Supervisor, PlansAPipelinedWorldLoweringReplicasBeforeStages) {
  std::string why;
  auto w = plan_world(8, 1, 7, 1, 8, false, why, 2);  // 2 stages x 4 replicas, 7 slots: 2 x 2, accum 2
  ASSERT_TRUE(w);
  EXPECT_EQ(w->np, 4);
  EXPECT_EQ(w->stages, 2);
  EXPECT_EQ(w->accum, 2);
  w = plan_world(4, 2, 3, 1, 4, false, why, 2);  // 2 x 2 x accum 2 on 3 slots: 2 x 1 x accum 4
  ASSERT_TRUE(w);
  EXPECT_EQ(w->np, 2);
  EXPECT_EQ(w->stages, 2);
  EXPECT_EQ(w->accum, 4);
  w = plan_world(4, 1, 3, 1, 4, false, why, 4);  // 4 stages on 3 slots: 3 ranks cannot hold 4 stages
  ASSERT_TRUE(w);
  EXPECT_EQ(w->stages, 3);
  EXPECT_EQ(w->np, 3);
  EXPECT_EQ(w->accum, 1);
  w = plan_world(2, 4, 1, 1, 2, false, why, 2);  // 1 slot left: no stages
  ASSERT_TRUE(w);
  EXPECT_EQ(w->stages, 1);
  EXPECT_EQ(w->np, 1);
  EXPECT_EQ(w->accum, 4);
  w = plan_world(6, 1, 4, 1, 6, false, why, 2);  // 2 x 3 replicas on 4 slots: 2 x 1 x accum 3 (the stages kept)
  ASSERT_TRUE(w);
  EXPECT_EQ(w->stages, 2);
  EXPECT_EQ(w->np, 2);
  EXPECT_EQ(w->accum, 3);
  EXPECT_FALSE(plan_world(6, 1, 4, 4, 6, false, why, 2));
  EXPECT_NE(why.find("the global batch (3 replicas of 2 stages x --accum-steps 1 = 3 per-rank batches) cannot be kept "
                     "on 4 to 4 ranks at any stage count"),
            std::string::npos)
      << why;
  w = plan_world(6, 1, 4, 4, 6, true, why, 2);
  ASSERT_TRUE(w);
  EXPECT_TRUE(w->batch_changed);
  EXPECT_EQ(w->np, 4);
  EXPECT_EQ(w->stages, 2);
  EXPECT_EQ(w->accum, 2);  // round(3 / 2)
  // The command's stages, and a relaunch at other stages drops the old split.
  const JobFlags f = read_job_flags({"./t", "--pipeline-stages", "2", "--pipeline-split=0,5", "--accum-steps", "2"});
  EXPECT_EQ(f.stages, 2);
  EXPECT_TRUE(f.split_given);
  EXPECT_EQ(read_job_flags({"./t"}).stages, 1);
  EXPECT_NE(testing::error_of([] {
              read_job_flags({"./t", "--pipeline-stages", "x"});
            }).find("the training command's --pipeline-stages must be a positive number, got 'x'"),
            std::string::npos);
  EXPECT_EQ(relaunch_command({"./t", "--pipeline-stages", "2", "--pipeline-split=0,5", "--accum-steps", "2"}, f, 4,
                             ResumePoint{}, false, 1),
            (std::vector<std::string>{"./t", "--pipeline-stages", "2", "--accum-steps", "2", "--pipeline-stages", "1",
                                      "--accum-steps", "4"}));
  EXPECT_EQ(
      relaunch_command({"./t", "--pipeline-stages", "2", "--pipeline-split", "0,5"}, f, 2, ResumePoint{}, false, 2),
      (std::vector<std::string>{"./t", "--pipeline-stages", "2", "--pipeline-split", "0,5"}));
}

TEST(Supervisor, ParsesEventLinesOnly) {
  auto e = parse_event("ringtrain-event {\"event\":\"step\",\"step\":7}");
  ASSERT_TRUE(e);
  EXPECT_EQ((*e)["step"], 7);
  EXPECT_TRUE(parse_event("[1,0]<stdout>:ringtrain-event {\"event\":\"plan\"}"));
  EXPECT_FALSE(parse_event("epoch 1/1 step 4/12 loss 2.0"));
  EXPECT_FALSE(parse_event("ringtrain-event {broken"));
  EXPECT_FALSE(parse_event("ringtrain-event [1,2]"));
  EXPECT_FALSE(parse_event("ringtrain-event {\"no_event\":1}"));
}

TEST(Supervisor, JudgesWhatARestartCanFix) {
  const json transient = {{"event", "error"}, {"rank", 1}, {"host", "n1"}, {"permanent", false}, {"message", "boom"}};
  const json permanent = {
      {"event", "error"}, {"rank", 0}, {"host", "n0"}, {"permanent", true}, {"message", "bad shard"}};
  Failure f;
  f.trained = true;
  f.errors = {transient};
  f.last_step = 5;
  EXPECT_EQ(judge(f, nullptr), Verdict::Restart);
  EXPECT_EQ(describe(f), "rank 1 (n1): boom");
  Failure again = f;
  EXPECT_EQ(judge(again, &f), Verdict::Repeated) << "the same error at the same step";
  again.last_step = 9;
  EXPECT_EQ(judge(again, &f), Verdict::Restart) << "progress since: transient";
  f.errors.push_back(permanent);
  EXPECT_EQ(judge(f, nullptr), Verdict::Permanent);
  EXPECT_EQ(describe(f), "rank 0 (n0): bad shard") << "the permanent error is the one named";
  Failure silent;
  silent.exit_status = 137;
  EXPECT_EQ(judge(silent, nullptr), Verdict::NoReason) << "failed before training, no word, every host alive";
  EXPECT_EQ(describe(silent), "the job exited with status 137 and no rank said why");
  silent.lost_hosts = {"node1"};
  EXPECT_EQ(judge(silent, nullptr), Verdict::Restart);
  EXPECT_EQ(describe(silent), "host(s) lost: node1");
  Failure killed;
  killed.trained = true;
  killed.mpirun_says = "mpirun: process rank 0 exited on signal 9";
  EXPECT_EQ(judge(killed, nullptr), Verdict::Restart) << "a rank died without a word after training began";
  EXPECT_EQ(describe(killed), "mpirun: process rank 0 exited on signal 9");
}

}  // namespace
}  // namespace ringtrain::runtime::supervisor
