// tests/runtime/test_layout_plan.cpp: the layout planner's pure part (runtime/layout/layout_plan.h), without MPI
// or a model: the link model and its fit, the compute profile's line (never superlinear), the layouts a world
// and a global batch give and why others are not considered, the predicted cost (data parallel, ZeRO-1,
// pipelines), the choice under a budget, and the refusals that name their reason.
#include "runtime/layout/layout_plan.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "core/check.h"
#include "runtime/config/cli.h"
#include "runtime/config/options.h"
#include "test_util.h"

namespace ringtrain::runtime {
namespace {

using ringtrain::testing::error_of;
constexpr int64_t MiB = int64_t{1} << 20;

// A model of `n` equal blocks: each 10 ms forward and 20 ms backward per 32 images with a fixed 1 ms,
// 1 MiB of parameters each (the last 4 MiB: a classifier's), a 64 KiB activation per image between blocks.
ComputeProfile profile(int n = 8) {
  ComputeProfile c;
  c.batch[0] = 16, c.batch[1] = 32;
  for (int i = 0; i < n; ++i) {
    BlockProfile b;
    b.name = "block" + std::to_string(i);
    b.forward[0] = 0.001 + 0.009 / 2, b.forward[1] = 0.010;
    b.backward[0] = 0.002 + 0.018 / 2, b.backward[1] = 0.020;
    b.param_bytes = i == n - 1 ? 4 * MiB : MiB;
    b.output_bytes_per_image = 64 * 1024;
    b.recomputable = i != n - 1;
    c.blocks.push_back(b);
  }
  c.optimizer_seconds_per_byte = 1e-9;
  c.source = "the test's";
  return c;
}

MemoryFacts facts() {
  MemoryFacts f;
  f.baseline = 200 * MiB;
  f.param_bytes = 11 * MiB;
  f.image_bytes = 12 * 1024;
  f.batches_in_flight = 2;
  f.curve = {10 * MiB, 4 * MiB};
  return f;
}

PlanInput input(int hosts, int per_host, int64_t G) {
  PlanInput in;
  in.world = {hosts, per_host, false};
  in.global_batch = G;
  in.options.optimizer = OptimizerKind::Sgd;
  in.compute = profile();
  in.facts = facts();
  ActivationCurve rc = in.facts.curve;
  rc.per_image /= 4;  // recompute keeps a quarter
  in.recompute_curve = rc;
  in.link.source = "the test's";
  in.backends = backends_for(in.world);
  return in;
}

// One network model: ringtrain_plan's collectives give the seconds scripts/scaling_model.py gives on the same
// inputs (its planner_cases(), written to the file by tests/scripts/test_scaling_model.py, which checks the
// Python side against the same file).
TEST(LayoutLink, TheScalingModelScriptGivesTheSameSeconds) {
  std::ifstream in(RINGTRAIN_LINK_MODEL_CASES);
  ASSERT_TRUE(in) << "cannot open " << RINGTRAIN_LINK_MODEL_CASES;
  const nlohmann::json doc = nlohmann::json::parse(in);
  ASSERT_GE(doc.at("cases").size(), 100u);
  for (const auto& c : doc.at("cases")) {
    LinkModel l;
    l.alpha_intra = c.at("alpha_intra_s"), l.bw_intra = c.at("bw_intra_bytes_per_s");
    l.alpha_inter = c.at("alpha_inter_s"), l.bw_inter = c.at("bw_inter_bytes_per_s");
    const comm::Backend backend = comm::parse_backend(c.at("backend").get<std::string>());
    const double want = c.at("seconds"),
                 got = allreduce_seconds(l, backend, c.at("bytes"), c.at("ranks"), c.at("per_host"));
    EXPECT_NEAR(got, want, 1e-6 * want) << c.dump();
  }
}

TEST(LayoutLink, RingAndHierarchicalFollowTheAlphaBetaModel) {
  LinkModel l;
  l.alpha_intra = 1e-5, l.bw_intra = 1e9, l.alpha_inter = 1e-4, l.bw_inter = 1e8;
  const int64_t B = 8 * MiB;
  EXPECT_EQ(allreduce_seconds(l, comm::Backend::Ring, B, 1, 1), 0);
  // Inside one host: 2(n-1) steps of alpha + B/n/bw.
  EXPECT_NEAR(allreduce_seconds(l, comm::Backend::Ring, B, 4, 4), 6 * (1e-5 + B / 4.0 / 1e9), 1e-12);
  // Across hosts, the ring runs at the slowest hop's pace: the larger latency and the smaller rate, wherever they
  // are (a host's link faster than its ranks' copies leaves the copies the bottleneck).
  EXPECT_NEAR(allreduce_seconds(l, comm::Backend::Ring, B, 4, 2), 6 * (1e-4 + B / 4.0 / 1e8), 1e-12);
  LinkModel fast_wire = l;
  fast_wire.alpha_inter = 1e-6, fast_wire.bw_inter = 1e10;
  EXPECT_NEAR(allreduce_seconds(fast_wire, comm::Backend::Ring, B, 4, 2), 6 * (1e-5 + B / 4.0 / 1e9), 1e-12);
  // Hierarchical: the host's ring, then 2(H-1) steps of B/H over the host's link.
  const double h = allreduce_seconds(l, comm::Backend::Hierarchical, B, 8, 4);
  EXPECT_NEAR(h, 6 * (1e-5 + B / 4.0 / 1e9) + 2 * (1e-4 + B / 2.0 / 1e8), 1e-12);
  EXPECT_LT(h, allreduce_seconds(l, comm::Backend::Ring, B, 8, 4));
  EXPECT_NEAR(half_allreduce_seconds(l, comm::Backend::Ring, B, 4, 4),
              allreduce_seconds(l, comm::Backend::Ring, B, 4, 4) / 2, 1e-15);
  EXPECT_NEAR(p2p_seconds(l, MiB, true), 1e-4 + MiB / 1e8, 1e-15);
  EXPECT_NEAR(p2p_seconds(l, MiB, false), 1e-5 + MiB / 1e9, 1e-15);
  EXPECT_NE(error_of([&] { allreduce_seconds(l, comm::Backend::Ring, B, 2, 3); }).find("3 per host"),
            std::string::npos);
}

TEST(LayoutLink, TheFitRecoversAlphaAndBandwidthFromARing) {
  const double alpha = 25e-6, bw = 2.5e9;
  for (int n : {2, 4}) {
    std::vector<std::pair<int64_t, double>> s;
    for (int64_t b : {int64_t{64} << 10, int64_t{1} << 20, int64_t{4} << 20})
      s.push_back({b, 2.0 * (n - 1) * (alpha + static_cast<double>(b) / n / bw)});
    const auto [a, w] = fit_ring(s, n);
    EXPECT_NEAR(a / alpha, 1, 1e-6) << n;
    EXPECT_NEAR(w / bw, 1, 1e-6) << n;
  }
  // Noise that tips alpha below zero keeps both positive and fits the largest size.
  const auto [a, w] = fit_ring({{1 << 20, 1e-3}, {4 << 20, 2e-3}}, 2);
  EXPECT_GT(a, 0);
  EXPECT_GT(w, 0);
  EXPECT_NEAR(2 * (a + (4 << 20) / 2.0 / w), 2e-3, 1e-9);
  EXPECT_NE(error_of([] {
              fit_ring({{1 << 20, 1e-3}, {1 << 20, 1.1e-3}}, 2);
            }).find("two message sizes"),
            std::string::npos);
  EXPECT_NE(error_of([] { fit_ring({{1 << 20, 1e-3}, {2 << 20, 2e-3}}, 1); }).find("no hops"), std::string::npos);
}

// b is a bit and B a byte (10Gb/s was read as 10 GB/s and 10GBps as 1.25 GB/s); the number follows the one
// number rule; a rate or a latency no link has is refused, naming the flag and the range.
TEST(LayoutLink, RatesReadBitsAndBytesByTheirLetterAndStayInRange) {
  EXPECT_DOUBLE_EQ(parse_link_rate("10Gb/s", "--link"), 1.25e9);
  EXPECT_DOUBLE_EQ(parse_link_rate("10Gbps", "--link"), 1.25e9);
  EXPECT_DOUBLE_EQ(parse_link_rate("100Gbit", "--link"), 12.5e9);
  EXPECT_DOUBLE_EQ(parse_link_rate("25gbit/s", "--link"), 3.125e9);
  EXPECT_DOUBLE_EQ(parse_link_rate("100mbit", "--link"), 12.5e6);
  EXPECT_DOUBLE_EQ(parse_link_rate("10GB/s", "--link"), 10e9);
  EXPECT_DOUBLE_EQ(parse_link_rate("10GBps", "--link"), 10e9);
  EXPECT_DOUBLE_EQ(parse_link_rate("1.5TB", "--link"), 1.5e12);
  EXPECT_DOUBLE_EQ(parse_link_rate("2e3Mbits", "--link"), 250e6);
  EXPECT_DOUBLE_EQ(parse_link_rate("400Gbytes/s", "--link"), 400e9);
  for (const char* bad : {"0x10Gbit", " 10Gbit", "10Gbit ", "10 Gbit", "10G", "10", "fast", "+10Gbit", "10Gbs", "10Gps",
                          "nanGbit", "infGbit", "10Xbit"})
    EXPECT_NE(error_of([&] { parse_link_rate(bad, "--link"); }).find("--link: expected a link rate from 1Mbit"),
              std::string::npos)
        << bad;
  for (const char* out : {"1e-300Gbit", "0.5Mbit", "0Gbit", "-10Gbit", "101Tbit", "1e300GB/s"})
    EXPECT_NE(
        error_of([&] { parse_link_rate(out, "--intra-link"); }).find("--intra-link '" + std::string(out) + "' is "),
        std::string::npos)
        << out;
  EXPECT_DOUBLE_EQ(parse_latency("20us", "--link-latency"), 20e-6);
  EXPECT_DOUBLE_EQ(parse_latency("0.1ms", "--link-latency"), 1e-4);
  EXPECT_DOUBLE_EQ(parse_latency("5e-6s", "--link-latency"), 5e-6);
  for (const char* bad : {"0x10us", " 5us", "5", "5 us", "5min"})
    EXPECT_NE(error_of([&] { parse_latency(bad, "--link-latency"); }).find("--link-latency: expected a latency"),
              std::string::npos)
        << bad;
  for (const char* out : {"1e300s", "2s", "0ns", "1e-12s"})
    EXPECT_NE(
        error_of([&] { parse_latency(out, "--link-latency"); }).find("--link-latency '" + std::string(out) + "' is"),
        std::string::npos)
        << out;
}

TEST(LayoutLink, AFileNamesTheKeyThatIsWrong) {
  LinkModel l;
  l.alpha_intra = 3e-6, l.bw_intra = 5e9, l.alpha_inter = 2e-5, l.bw_inter = 1.2e9;
  const LinkModel back = LinkModel::from_json(l.to_json(), "link.json");
  EXPECT_EQ(back.bw_inter, l.bw_inter);
  EXPECT_EQ(back.alpha_intra, l.alpha_intra);
  EXPECT_EQ(back.source, "link.json");
  nlohmann::json j = l.to_json();
  j.erase("bw_inter_bytes_per_s");
  EXPECT_NE(error_of([&] {
              LinkModel::from_json(j, "link.json");
            }).find("'link.json': key 'bw_inter_bytes_per_s' is missing (a positive number from 125000 to 1e+15)"),
            std::string::npos);
  j["bw_inter_bytes_per_s"] = "10GB";  // a text where a number belongs
  EXPECT_NE(
      error_of([&] {
        LinkModel::from_json(j, "t.json");
      }).find("'t.json': key 'bw_inter_bytes_per_s' must be a positive number from 125000 to 1e+15, got \"10GB\""),
      std::string::npos);
  EXPECT_NE(error_of([&] {
              LinkModel::from_json(nlohmann::json::array(), "a.json");
            }).find("'a.json' must hold a JSON object"),
            std::string::npos);
  j = l.to_json();
  j["alpha_intra_s"] = -1;
  EXPECT_NE(
      error_of([&] { LinkModel::from_json(j, "l2.json"); }).find("'l2.json': key 'alpha_intra_s' must be a positive"),
      std::string::npos);
  // Figures no link has (they made every prediction infinite): refused naming the key and the range.
  for (const auto& [key, value] : {std::pair{"bw_inter_bytes_per_s", 1e-300}, std::pair{"alpha_inter_s", 1e300},
                                   std::pair{"bw_intra_bytes_per_s", 1e300}}) {
    j = l.to_json();
    j[key] = value;
    EXPECT_NE(error_of([&] {
                LinkModel::from_json(j, "l4.json");
              }).find(std::string("'l4.json': key '") + key + "' must be a positive number "),
              std::string::npos)
        << key;
  }
  // The transport's CPU between hosts: kept, optional (a file written before it has none: 0), and bounded.
  l.inter_cpu_per_wire = 0.75;
  EXPECT_EQ(LinkModel::from_json(l.to_json(), "link.json").inter_cpu_per_wire, 0.75);
  j = l.to_json();
  j.erase("inter_cpu_per_wire");
  EXPECT_EQ(LinkModel::from_json(j, "old.json").inter_cpu_per_wire, 0);
  for (const nlohmann::json& bad : {nlohmann::json(-0.5), nlohmann::json(9), nlohmann::json("1")}) {
    j["inter_cpu_per_wire"] = bad;
    EXPECT_NE(error_of([&] {
                LinkModel::from_json(j, "l3.json");
              }).find("'l3.json': key 'inter_cpu_per_wire' must be a number from 0 to 8, got " + bad.dump()),
              std::string::npos)
        << bad;
  }
}

TEST(LayoutCompute, TheLineIsNeverSuperlinearAndTheProfileRoundTrips) {
  ComputeProfile c = profile(2);
  EXPECT_NEAR(c.forward(0, 32), 0.010, 1e-12);
  EXPECT_NEAR(c.forward(0, 16), 0.0055, 1e-12);
  EXPECT_NEAR(c.forward(0, 64), 0.019, 1e-12);
  // A block measured alone is noisy: its own line may cross zero. It keeps its measured times at both
  // batches (the model's whole time is a line through the whole passes; each block's share of it moves from
  // its share at one batch to its share at the other), so such noise does not raise the prediction: a
  // block's line clamped at zero once put it above both its measurements (ResNet-56 on 4 ranks: 24 of 58
  // lines, b8 predicted 18% above its measured whole pass).
  c.blocks[0].forward[0] = 0.002, c.blocks[0].forward[1] = 0.010;  // its own line would cross zero at b = 12
  c.blocks[1].backward[0] = 0.016;                                 // and another's small pass measured slow
  EXPECT_NEAR(c.forward(0, 16), 0.002, 1e-12);
  EXPECT_NEAR(c.forward(0, 32), 0.010, 1e-12);
  auto whole = [&](int64_t b) {
    double t = 0;
    for (size_t i = 0; i < c.blocks.size(); ++i) t += c.forward(i, b) + c.backward(i, b);
    return t;
  };
  const double measured[2] = {0.002 + 0.011 + 0.0055 + 0.016, 0.010 + 0.020 + 0.010 + 0.020};
  EXPECT_NEAR(whole(16), measured[0], 1e-12);
  EXPECT_NEAR(whole(32), measured[1], 1e-12);
  EXPECT_NEAR(whole(24), (measured[0] + measured[1]) / 2, 1e-12);
  // The model is never superlinear: a smaller micro-batch is never faster per image than the larger
  // measured one, and nothing is below zero.
  for (int64_t b : {1, 2, 8, 12, 16, 24, 32, 64})
    for (size_t i = 0; i < c.blocks.size(); ++i) EXPECT_GE(c.forward(i, b), 0) << b;
  for (int64_t b : {1, 2, 8, 12, 16, 24}) EXPECT_GE(whole(b) / b, measured[1] / 32 - 1e-15) << b;
  // Where the whole passes themselves say the smaller batch is faster per image (noise), the model takes the
  // larger batch's rate for both: the larger's time kept, the smaller's raised to that rate.
  c.blocks[1].forward[0] = 0.001, c.blocks[1].backward[0] = 0.002;  // the small pass: 16 ms for 16 images
  EXPECT_NEAR(whole(32), measured[1], 1e-12);
  EXPECT_NEAR(whole(16), measured[1] / 2, 1e-12);
  EXPECT_NEAR(whole(8), measured[1] / 4, 1e-12);
  // A time that falls with the batch (noise) gives a flat line, never a negative slope.
  c = profile(2);
  c.blocks[1].backward[0] = 0.03, c.blocks[1].backward[1] = 0.02;
  c.blocks[0].backward[0] = 0.03, c.blocks[0].backward[1] = 0.02;
  EXPECT_NEAR(whole(64), whole(16), 1e-12);
  // The whole pass's scale between the two batches, never past them, never below 1.
  c.scale[0] = 1.1, c.scale[1] = 1.3;
  EXPECT_NEAR(c.scale_at(24), 1.2, 1e-12);
  EXPECT_NEAR(c.scale_at(64), 1.3, 1e-12);
  EXPECT_NEAR(c.scale_at(1), 1.1, 1e-12);
  const ComputeProfile back = ComputeProfile::from_json(c.to_json(), "p.json");
  EXPECT_EQ(back.blocks.size(), 2u);
  EXPECT_EQ(back.forward(0, 24), c.forward(0, 24));
  EXPECT_EQ(back.param_bytes(), c.param_bytes());
  EXPECT_EQ(back.scale_at(24), c.scale_at(24));
  nlohmann::json j = c.to_json();
  j["blocks"][1].erase("param_bytes");
  EXPECT_NE(error_of([&] { ComputeProfile::from_json(j, "p.json"); }).find("p.json: not a compute profile"),
            std::string::npos);
  j = c.to_json();
  j["batch"] = {32, 16};
  EXPECT_NE(error_of([&] { ComputeProfile::from_json(j, "p.json"); }).find("key 'batch'"), std::string::npos);
}

// A prediction that is not a time (a link set in code past the readers' bounds) is refused naming the
// layout and the term, never printed as inf, nan or a 300-digit time.
TEST(LayoutPredict, AFigureThatIsNoTimeIsRefusedNotPrinted) {
  PlanInput in = input(2, 4, 64);
  in.link.alpha_intra = 1e-5, in.link.bw_intra = 1e9, in.link.alpha_inter = 1e-4, in.link.bw_inter = 1e8;
  const std::vector<Layout> all = enumerate_layouts(in, nullptr);
  ASSERT_FALSE(all.empty());
  for (const Layout& l : all) EXPECT_TRUE(std::isfinite(predict_layout(in, l).step)) << l.flags();
  in.link.bw_inter = 1e-300;  // from_json and --link refuse it; set in code it would make every sync infinite
  Layout ring;
  for (const Layout& l : all)
    if (l.stages == 1 && l.backend == comm::Backend::Ring) ring = l;
  const std::string e = error_of([&] { predict_layout(in, ring); });
  EXPECT_NE(e.find("the layout plan: layout " + ring.flags() + " predicts a communication time of"), std::string::npos)
      << e;
}

TEST(LayoutEnumerate, FourRanksGiveEveryStageCountAndTheVariantsOfEach) {
  PlanInput in = input(1, 4, 64);
  std::vector<std::string> skipped;
  const std::vector<Layout> all = enumerate_layouts(in, &skipped);
  std::map<int, int> per_stages;
  std::set<std::string> flags;
  for (const Layout& l : all) {
    per_stages[l.stages]++;
    EXPECT_EQ(l.stages * l.replicas, 4);
    EXPECT_EQ(l.batch * l.accum * l.replicas, 64) << l.flags();
    EXPECT_EQ(l.recompute, RecomputeChoice::Off) << "everything fits: no recompute";
    EXPECT_TRUE(flags.insert(l.flags()).second) << "twice: " << l.flags();
    if (l.stages > 1) {
      EXPECT_EQ(l.zero, 0);
      EXPECT_EQ(l.accum % l.stages, 0) << "a pipeline needs at least S micro-batches";
      ASSERT_EQ(l.split.size(), static_cast<size_t>(l.stages + 1));
      EXPECT_EQ(l.split.front(), 0);
      EXPECT_EQ(l.split.back(), 8);
    }
  }
  // D4: accumulation 1, 2, 4 x ZeRO off/on x the bucket sizes that make different buckets (11 MiB of
  // gradients: 25 MB is the 1 MB first bucket and one more, 5 MB three more).
  EXPECT_EQ(per_stages[1], 3 * 2 * 2);
  EXPECT_EQ(per_stages[2], 3 * 2);  // D2: M = 2, 4, 8 x the two bucket sizes
  EXPECT_EQ(per_stages[4], 3);      // D1: M = 4, 8, 16, nothing to all-reduce
  EXPECT_GE(all.size(), 8u);
  bool said_recompute = false;
  for (const auto& s : skipped) said_recompute = said_recompute || s.find("recompute") != std::string::npos;
  EXPECT_TRUE(said_recompute);
}

TEST(LayoutEnumerate, HierarchicalIsConsideredOnlyWhereItIsNotTheFlatRing) {
  // 2 hosts x 4 ranks. Data parallelism spans both hosts with 4 ranks on each: both backends. 2 stages of
  // 4 replicas, 4 stages of 2 and 8 stages of 1: each stage's replicas sit on one host, where the
  // hierarchical backend runs the flat ring (comm/ring.cpp): one layout, listed once, as ring.
  PlanInput in = input(2, 4, 64);
  std::vector<std::string> skipped;
  std::map<int, std::set<comm::Backend>> by_stages;
  for (const Layout& l : enumerate_layouts(in, &skipped))
    if (l.replicas > 1) by_stages[l.stages].insert(l.backend);
  EXPECT_EQ(by_stages[1], (std::set<comm::Backend>{comm::Backend::Ring, comm::Backend::Hierarchical}));
  EXPECT_EQ(by_stages[2], std::set<comm::Backend>{comm::Backend::Ring});
  EXPECT_EQ(by_stages[4], std::set<comm::Backend>{comm::Backend::Ring});
  std::string text;
  for (const auto& s : skipped) text += s + "\n";
  EXPECT_NE(text.find("2 stages: --backend hierarchical, where each stage's 4 replicas share a host"),
            std::string::npos)
      << text;
  // 4 hosts x 2 ranks, 2 stages: each stage's 4 replicas are 2 on each of 2 hosts, which it runs
  // hierarchically; 4 stages leave each stage's 2 replicas on one host.
  in = input(4, 2, 64);
  by_stages.clear();
  for (const Layout& l : enumerate_layouts(in))
    if (l.replicas > 1) by_stages[l.stages].insert(l.backend);
  EXPECT_EQ(by_stages[2], (std::set<comm::Backend>{comm::Backend::Ring, comm::Backend::Hierarchical}));
  EXPECT_EQ(by_stages[4], std::set<comm::Backend>{comm::Backend::Ring});
  // Asked for by hand, it stays, whatever it runs.
  in.backends = {comm::Backend::Hierarchical};
  for (const Layout& l : enumerate_layouts(in)) {
    if (l.replicas > 1) {
      EXPECT_EQ(l.backend, comm::Backend::Hierarchical) << l.flags();
    }
  }
}

TEST(LayoutEnumerate, StagesTheBatchOrTheModelCannotTakeAreSkippedWithTheirReason) {
  PlanInput in = input(1, 4, 12);  // 12 images: D2's 6 make 2 micro-batches but not 4 or 8; D1's 12 make 4
  in.compute = profile(3);         // and 3 blocks make no 4 stages
  std::vector<std::string> skipped;
  for (const Layout& l : enumerate_layouts(in, &skipped)) {
    EXPECT_NE(l.stages, 4);
    if (l.stages == 2) {
      EXPECT_EQ(l.accum, 2) << l.flags();
    }
  }
  std::string text;
  for (const auto& s : skipped) text += s + "\n";
  EXPECT_NE(text.find("4 stages: the model has 3 blocks"), std::string::npos) << text;
  // Nothing left: the refusal gives every stage count's reason.
  in.global_batch = 6;
  const std::string e = error_of([&] { enumerate_layouts(in); });
  EXPECT_NE(e.find("the global batch 6 cannot be split over the world of 4 ranks"), std::string::npos) << e;
  EXPECT_NE(e.find("1 stage: the global batch 6 is not a multiple of its 4 replicas"), std::string::npos) << e;
  EXPECT_NE(e.find("2 stages: 3 images per replica cannot make 2 micro-batches"), std::string::npos) << e;
  EXPECT_NE(e.find("4 stages: the model has 3 blocks"), std::string::npos) << e;
}

TEST(LayoutEnumerate, AGlobalBatchNoStageCountSplitsIsRefusedNamingIt) {
  PlanInput in = input(1, 2, 7);
  const std::string e = error_of([&] { enumerate_layouts(in); });
  EXPECT_NE(e.find("the global batch 7 cannot be split over the world of 2 ranks"), std::string::npos) << e;
  EXPECT_NE(e.find("1 stage: the global batch 7 is not a multiple of its 2 replicas"), std::string::npos) << e;
  EXPECT_NE(e.find("2 stages: 7 images per replica cannot make 2 micro-batches"), std::string::npos) << e;
  bool permanent = false;
  try {
    enumerate_layouts(in);
  } catch (const PermanentError&) {
    permanent = true;
  }
  EXPECT_TRUE(permanent) << "no restart fixes a batch that cannot be split";
}

TEST(LayoutEnumerate, ACustomStepFunctionGetsNoPipelines) {
  PlanInput in = input(1, 4, 64);
  in.max_stages = 1;
  std::vector<std::string> skipped;
  for (const Layout& l : enumerate_layouts(in, &skipped)) EXPECT_EQ(l.stages, 1);
  std::string text;
  for (const auto& s : skipped) text += s + "\n";
  EXPECT_NE(text.find("a custom step function sees the whole model"), std::string::npos) << text;
}

TEST(LayoutCost, DataParallelIsComputeExposedSyncAndTheUpdate) {
  PlanInput in = input(1, 2, 64);
  Layout l;
  l.replicas = 2, l.batch = 32, l.accum = 1, l.bucket_mb = 25;
  const LayoutCost c = predict_layout(in, l);
  EXPECT_NEAR(c.compute, 8 * (0.010 + 0.020), 1e-12);
  EXPECT_NEAR(c.optimizer, 11.0 * MiB * 1e-9, 1e-12);
  EXPECT_GE(c.comm, 0);
  EXPECT_NEAR(c.step, c.compute + c.bubble + c.comm + c.optimizer, 1e-12);
  // The first (1 MB) bucket's sync hides under the other blocks' backward; only the last bucket's tail shows:
  // at most one whole all-reduce of everything.
  EXPECT_LE(c.comm, allreduce_seconds(in.link, comm::Backend::Ring, 11 * MiB, 2, 2) + 1e-12);
  // Accumulation repeats the compute, not the sync.
  Layout a = l;
  a.batch = 16, a.accum = 2;
  const LayoutCost ca = predict_layout(in, a);
  EXPECT_NEAR(ca.compute, 2 * 8 * (0.0055 + 0.011), 1e-12);
  EXPECT_NEAR(ca.optimizer, c.optimizer, 1e-15);
  // --recompute runs each block's forward again but the last's; that forward and the backward after it find
  // the block's activations in the cache: their times alone, the whole pass's scale (1.25) taken off.
  Layout r = l;
  r.recompute = RecomputeChoice::Blocks;
  EXPECT_NEAR(predict_layout(in, r).compute, 8 * 0.030 + 7 * 0.010, 1e-12);
  in.compute.scale[0] = in.compute.scale[1] = 1.25;
  EXPECT_NEAR(predict_layout(in, r).compute, 8 * 0.010 + 0.020 + 7 * 0.030 / 1.25, 1e-12);
  EXPECT_NEAR(predict_layout(in, l).compute, c.compute, 1e-12);  // without recompute: as measured
  in.compute.scale[0] = in.compute.scale[1] = 1;
  // ZeRO-1 keeps half the state on each of 2 replicas; its update, the shards' copies and the all-gather
  // are never predicted faster than plain's update, so its step is never below one replica's alone.
  Layout z = l;
  z.zero = 1;
  EXPECT_NEAR(predict_layout(in, z).optimizer, c.optimizer, 1e-15);
  EXPECT_GE(predict_layout(in, z).step, c.compute + c.optimizer);
  EXPECT_LT(predict_layout(in, z).peak, c.peak);
  // A slow link between hosts makes the same layout communicate more, and says so.
  PlanInput slow = input(2, 1, 64);
  slow.link.bw_inter = 1e7;
  const LayoutCost cs = predict_layout(slow, l);
  EXPECT_GT(cs.comm, c.comm);
  EXPECT_GT(cs.comm_share(), c.comm_share());
  EXPECT_GT(cs.comm_share(), 0.5);
}

TEST(LayoutCost, APipelinePaysItsBubbleAndItsSends) {
  PlanInput in = input(1, 2, 64);
  Layout l;
  l.stages = 2, l.replicas = 1, l.batch = 16, l.accum = 4, l.split = {0, 4, 8};
  const LayoutCost c = predict_layout(in, l);
  const double stage = 4 * (0.0055 + 0.011);
  EXPECT_NEAR(c.compute, 4 * stage, 1e-12);
  const double send = 2 * p2p_seconds(in.link, 16 * 64 * 1024, false);
  EXPECT_NEAR(c.bubble, stage + send + 3 * send, 1e-12);
  EXPECT_EQ(c.comm, 0);  // one replica a stage: nothing to all-reduce
  // An unbalanced split waits for its slowest stage.
  Layout u = l;
  u.split = {0, 6, 8};
  EXPECT_GT(predict_layout(in, u).step, c.step);
  // The pipeline's recompute runs each stage's forward twice more: without gradients through all its blocks
  // but the last (keeping their inputs), then each block again before its backward.
  Layout r = l;
  r.recompute = RecomputeChoice::Pipeline;
  EXPECT_NEAR(predict_layout(in, r).compute, 4 * (stage + 7 * 0.0055), 1e-12);
  // Each block's second forward and its backward in the cache: the whole pass's scale taken off them.
  in.compute.scale[0] = in.compute.scale[1] = 1.25;
  EXPECT_NEAR(predict_layout(in, r).compute, 4 * (4 * 0.0055 + 3 * 0.0055 + stage / 1.25), 1e-12);
  in.compute.scale[0] = in.compute.scale[1] = 1;
  EXPECT_LT(predict_layout(in, r).peak, c.peak);
}

TEST(LayoutCost, APipelineStageHoldsItsBlocksStateAndActivationsOfTheMicroBatchesInFlight) {
  // Blocks 0-1 keep 3 MiB an image, the other 6 blocks 1 MiB: the first stage of {0, 4, 8} holds 8 of the
  // 12 MiB, of 2 micro-batches under 1F1B (the second: 4 MiB of one); GPipe holds all M on every stage.
  PlanInput in = input(1, 2, 64);
  for (size_t i = 0; i < in.compute.blocks.size(); ++i)
    in.compute.blocks[i].activation_bytes_per_image = i < 2 ? 3 * MiB : MiB;
  Layout l;
  l.stages = 2, l.replicas = 1, l.batch = 16, l.accum = 4, l.split = {0, 4, 8};
  const int64_t fixed = in.facts.curve.fixed, per_image = in.facts.curve.per_image;  // the whole model's
  const MemoryPrediction one_f_one_b = predict_layout(in, l).memory;
  EXPECT_NEAR(one_f_one_b.activations, fixed + 16 * per_image * 8 / 12 * 2, 8);  // rounding
  // That stage's state is its 4 blocks' 4 MiB (the classifier's 4 MiB sit on the second): gradients as
  // large, SGD's momentum, and the baseline without the other stage's 7 MiB of weights.
  EXPECT_EQ(one_f_one_b.gradients, 4 * MiB);
  EXPECT_EQ(one_f_one_b.baseline, in.facts.baseline - 7 * MiB);
  EXPECT_EQ(one_f_one_b.total, one_f_one_b.baseline + one_f_one_b.gradients + one_f_one_b.optimizer_state +
                                   one_f_one_b.activations + one_f_one_b.input);
  // --pipeline-recompute: the first stage holds no input of its own (the batch is the data's), one
  // micro-batch's inputs of its blocks 1-3 (the outputs of 0-2) and its widest block's activations with the
  // gradients of its output and input (block 1's: block 0's has no input gradient); the second holds its
  // input for the micro-batch in flight, 3 block inputs and a 1 MiB block: less.
  Layout r = l;
  r.recompute = RecomputeChoice::Pipeline;
  EXPECT_EQ(predict_layout(in, r).memory.activations, fixed + 16 * (3 * 64 * 1024 + 3 * MiB + 2 * 64 * 1024));
  for (size_t i = 0; i < 2; ++i) in.compute.blocks[i].activation_bytes_per_image = MiB;
  in.compute.blocks[4].output_bytes_per_image = in.compute.blocks[3].output_bytes_per_image = 2 * MiB;
  // Now the second stage's: its input (block 3's output) for 1 micro-batch, block 4's 2 MiB output among
  // its blocks' inputs, and block 4 with its output's and input's 2 MiB gradients.
  EXPECT_EQ(predict_layout(in, r).memory.activations,
            fixed + 16 * (2 * MiB + 2 * MiB + 2 * 64 * 1024 + MiB + 2 * MiB + 2 * MiB));
  for (size_t i = 0; i < 2; ++i) in.compute.blocks[i].activation_bytes_per_image = 3 * MiB;
  in.compute.blocks[4].output_bytes_per_image = in.compute.blocks[3].output_bytes_per_image = 64 * 1024;
  in.options.pipeline_schedule = PipelineSchedule::GPipe;
  EXPECT_NEAR(predict_layout(in, l).memory.activations, fixed + 16 * per_image * 8 / 12 * 4, 8);
  // With light activations everywhere, the stage holding the classifier's state is the peak.
  in.options.pipeline_schedule = PipelineSchedule::OneFOneB;
  for (auto& b : in.compute.blocks) b.activation_bytes_per_image = 1;
  in.facts.curve = {0, 1024};
  EXPECT_EQ(predict_layout(in, l).memory.gradients, 7 * MiB);
  // Not measured (a calibration file of old): the memory plan's one micro-batch of the whole model.
  for (auto& b : in.compute.blocks) b.activation_bytes_per_image = 0;
  EXPECT_EQ(predict_layout(in, l).memory.activations, in.facts.curve.at(16));
}

TEST(LayoutCost, CpuRanksSharingTheirCoresHideNoSyncAndRunFasterInABubble) {
  // 4 ranks on one host of 2 cores, 1 thread each, measured all busy (twice as slow as alone).
  PlanInput in = input(1, 4, 128);
  in.link.bw_intra = 1e8;  // a sync as long as a good part of the backward
  Layout dp;
  dp.replicas = 4, dp.batch = 32, dp.accum = 1;
  const LayoutCost devices = predict_layout(in, dp);  // a device each: the sync hides under the backward
  in.cores_per_host = 2, in.threads_per_rank = 1;
  in.compute.contention = 2;
  const LayoutCost cpu = predict_layout(in, dp);
  EXPECT_NEAR(cpu.compute, devices.compute, 1e-12);  // all busy, as the probe ran
  EXPECT_GT(cpu.comm, devices.comm);                 // the sync's copies and sums take the cores: none hides
  EXPECT_GE(cpu.comm, allreduce_seconds(in.link, comm::Backend::Ring, 11 * MiB, 4, 4));  // all 11 MiB of it
  // Across 2 hosts of 2 ranks on a slow link: only the copies (the sync as between ranks of one host) take
  // the cores; what the wire adds overlaps the backward as on a device.
  PlanInput two = input(2, 2, 128);
  two.link.bw_intra = 1e9, two.link.bw_inter = 1e8;
  two.cores_per_host = 2, two.threads_per_rank = 1, two.compute.contention = 1;
  const double whole = allreduce_seconds(two.link, comm::Backend::Ring, 11 * MiB, 4, 2);
  LinkModel memory = two.link;
  memory.bw_inter = memory.bw_intra, memory.alpha_inter = memory.alpha_intra;
  const double copies = allreduce_seconds(memory, comm::Backend::Ring, 11 * MiB, 4, 2);
  const LayoutCost across = predict_layout(two, dp);
  EXPECT_GE(across.comm, copies);
  EXPECT_LT(across.comm, whole + copies);
  // Where the transport between hosts takes the cores too (the emulated cluster's TCP through veth on the
  // ranks' own cores), that share of the wire hides under nothing either: at 1 second of the cores a second
  // of wire, none of the sync overlaps the backward, the copies and the wire both count in full; a share
  // between adds in proportion; devices and cores with room never pay it.
  PlanInput taken = two;
  taken.link.alpha_inter = taken.link.alpha_intra = 0;  // no latency per bucket: the sums below are exact
  LinkModel copied = taken.link;
  copied.bw_inter = copied.bw_intra;
  const double sync = allreduce_seconds(taken.link, comm::Backend::Ring, 11 * MiB, 4, 2);
  const double sync_copies = allreduce_seconds(copied, comm::Backend::Ring, 11 * MiB, 4, 2);
  const double overlapped = predict_layout(taken, dp).comm;
  EXPECT_LT(overlapped, sync);
  taken.link.inter_cpu_per_wire = 1;
  EXPECT_NEAR(predict_layout(taken, dp).comm, sync, 1e-12);
  taken.link.inter_cpu_per_wire = 0.5;
  EXPECT_GT(predict_layout(taken, dp).comm, overlapped);
  EXPECT_LT(predict_layout(taken, dp).comm, sync);
  taken.link.inter_cpu_per_wire = 2;  // the transport's CPU outlasting the idle link's time
  EXPECT_NEAR(predict_layout(taken, dp).comm, sync + (sync - sync_copies), 1e-12);
  PlanInput room = taken;  // room on the cores: all wire, as without it
  room.cores_per_host = 8;
  PlanInput room_plain = room;
  room_plain.link.inter_cpu_per_wire = 0;
  EXPECT_NEAR(predict_layout(room, dp).comm, predict_layout(room_plain, dp).comm, 1e-12);
  PlanInput dev = room, dev_plain = room_plain;  // a device each
  dev.world.cuda = dev_plain.world.cuda = true;
  dev.cores_per_host = dev_plain.cores_per_host = 0;
  EXPECT_NEAR(predict_layout(dev, dp).comm, predict_layout(dev_plain, dp).comm, 1e-12);
  // A pipeline of 2 stages x 2 replicas, 2 micro-batches: 3 slots with 2, 4 and 2 ranks busy: the first
  // and the last at the speed of a rank alone (half the probe's time), the middle at the probe's.
  Layout pp;
  pp.stages = 2, pp.replicas = 2, pp.batch = 32, pp.accum = 2, pp.split = {0, 4, 8};
  in.cores_per_host = 0, in.compute.contention = 1;
  const LayoutCost pp_devices = predict_layout(in, pp);
  in.cores_per_host = 2, in.compute.contention = 2;
  const LayoutCost pp_cpu = predict_layout(in, pp);
  const double speed = (1 + 2 + 1) / 3.0 / 2;
  EXPECT_NEAR(pp_cpu.compute, pp_devices.compute * speed, 1e-12);
}

TEST(LayoutCost, ScaleOutIsNeverSuperlinearAndTheShareGrows) {
  // The same micro-batch per replica on 1, 2, 4, 8, 16 hosts over 1 Gbit/s: throughput never more than
  // the world's size times one rank's, and the communication share never falls.
  double one = 0, last_share = -1;
  for (int hosts : {1, 2, 4, 8, 16}) {
    PlanInput in = input(hosts, 1, 32 * hosts);
    in.link.bw_inter = 1.25e8;
    Layout l;
    l.replicas = hosts, l.batch = 32, l.accum = 1;
    const LayoutCost c = predict_layout(in, l);
    const double ips = 32.0 * hosts / c.step;
    if (hosts == 1) one = ips;
    EXPECT_LE(ips, hosts * one * (1 + 1e-12)) << hosts;
    EXPECT_GE(c.comm_share(), last_share) << hosts;
    last_share = c.comm_share();
  }
  // The same for the best layout of each world, ZeRO-1, accumulation and stages among them, on links so fast
  // that nothing but compute and the update shows.
  double best_one = 0;
  for (int hosts : {1, 2, 4, 8, 16}) {
    PlanInput in = input(hosts, 2, 64 * hosts);
    in.link.alpha_intra = in.link.alpha_inter = 1e-9;
    in.link.bw_intra = in.link.bw_inter = 1e15;
    const LayoutPlan plan = plan_layouts(in);
    const double ips = 64.0 * hosts / plan.chosen().cost.step;
    if (hosts == 1) best_one = ips;
    EXPECT_LE(ips, hosts * best_one * (1 + 1e-12)) << hosts << ": " << plan.chosen().layout.flags();
  }
  EXPECT_GT(last_share, 0);
}

TEST(LayoutPlan, TheChoiceIsTheFastestThatFitsAndTheOthersSayWhyNot) {
  PlanInput in = input(1, 4, 64);
  const LayoutPlan plan = plan_layouts(in);
  ASSERT_GE(plan.layouts.size(), 8u);
  for (size_t i = 1; i < plan.layouts.size(); ++i) {
    EXPECT_LE(plan.layouts[0].cost.step, plan.layouts[i].cost.step);
    EXPECT_FALSE(plan.layouts[i].why_not.empty()) << i;
  }
  EXPECT_TRUE(plan.layouts[0].why_not.empty());
  const std::string t = plan.table(3);
  EXPECT_NE(t.find("<- chosen"), std::string::npos) << t;
  EXPECT_NE(t.find("slower by"), std::string::npos) << t;
  const nlohmann::json j = plan.to_json();
  EXPECT_EQ(j["global_batch"], 64);
  EXPECT_EQ(j["chosen"]["flags"], plan.chosen().layout.flags());
  EXPECT_EQ(j["considered"].size(), plan.layouts.size());
  EXPECT_TRUE(j["predicted"].contains("comm_share"));
}

TEST(LayoutPlan, ABudgetPlainDataParallelismExceedsForcesAFittingLayout) {
  PlanInput in = input(1, 2, 64);
  in.max_stages = 1;  // ZeRO-1, accumulation or recompute must do it
  Layout plain;
  plain.replicas = 2, plain.batch = 32, plain.accum = 1;
  const int64_t peak = predict_layout(in, plain).peak;
  in.budget = peak;  // less 5% to spare: plain does not fit
  in.budget_source = "--max-memory";
  const LayoutPlan plan = plan_layouts(in);
  const Layout& c = plan.chosen().layout;
  EXPECT_TRUE(plan.chosen().cost.fits);
  EXPECT_LT(plan.chosen().cost.peak + plan.chosen().cost.peak / 20, peak + 1);
  EXPECT_TRUE(c.zero == 1 || c.accum > 1 || c.recompute != RecomputeChoice::Off) << c.flags();
  bool told = false;
  for (const auto& p : plan.layouts)
    if (!p.cost.fits) told = told || p.why_not.find("does not fit") != std::string::npos;
  EXPECT_TRUE(told);
}

TEST(LayoutPlan, NothingFittingIsRefusedNamingTheSmallestPeakAndTheBudget) {
  PlanInput in = input(1, 2, 64);
  in.budget = 100 * MiB;  // below the baseline
  in.budget_source = "--max-memory 100M";
  const std::string e = error_of([&] { plan_layouts(in); });
  EXPECT_NE(e.find("no layout of the"), std::string::npos) << e;
  EXPECT_NE(e.find("fits the budget of 100.00 MiB"), std::string::npos) << e;
  EXPECT_NE(e.find("--max-memory 100M"), std::string::npos) << e;
  EXPECT_NE(e.find("the smallest predicted peak"), std::string::npos) << e;
}

// The flags a layout prints give, parsed as a user gives them, the options the planner sets.
TEST(LayoutFlags, ParsedByHandTheyGiveTheOptionsApplySets) {
  PlanInput in = input(1, 4, 64);
  in.facts.curve.per_image = 512 * MiB;  // nothing fits plainly at a big batch: recompute variants appear
  in.budget = 30LL * 1024 * MiB;
  for (const Layout& l : enumerate_layouts(in)) {
    TrainerOptions planned;
    l.apply(planned);
    TrainerOptions by_hand;
    CLI::App app{"t"};
    std::string data;
    add_trainer_flags(app, by_hand, data);
    std::vector<std::string> args{"t"};
    std::string word;
    for (std::istringstream s(l.flags()); s >> word;) args.push_back(word);
    std::vector<const char*> argv;
    for (const auto& a : args) argv.push_back(a.c_str());
    app.parse(static_cast<int>(argv.size()), argv.data());
    EXPECT_EQ(by_hand.batch, planned.batch) << l.flags();
    EXPECT_EQ(by_hand.accum, planned.accum) << l.flags();
    EXPECT_EQ(by_hand.zero, planned.zero) << l.flags();
    EXPECT_EQ(by_hand.recompute, planned.recompute) << l.flags();
    EXPECT_EQ(by_hand.pipeline_recompute, planned.pipeline_recompute) << l.flags();
    EXPECT_EQ(by_hand.pipeline_stages, planned.pipeline_stages) << l.flags();
    EXPECT_EQ(by_hand.pipeline_split, planned.pipeline_split) << l.flags();
    EXPECT_EQ(by_hand.backend, planned.backend) << l.flags();
    EXPECT_EQ(by_hand.bucket_mb, planned.bucket_mb) << l.flags();
    EXPECT_NO_THROW(validate_options(by_hand)) << l.flags();
  }
}

TEST(LayoutFlags, AutoRefusesTheFlagsItChooses) {
  for (const auto& [set, flag] : std::vector<std::pair<std::function<void(TrainerOptions&)>, std::string>>{
           {[](TrainerOptions& o) { o.zero = 1; }, "--zero"},
           {[](TrainerOptions& o) { o.recompute = true; }, "--recompute"},
           {[](TrainerOptions& o) { o.pipeline_stages = 2; }, "--pipeline-stages"}}) {
    TrainerOptions o;
    o.layout_auto = true;
    set(o);
    EXPECT_NE(error_of([&] { validate_options(o); }).find("--layout auto chooses " + flag + " itself"),
              std::string::npos)
        << flag;
  }
  TrainerOptions o;
  o.link_calibration = "link.json";
  EXPECT_NE(error_of([&] { validate_options(o); }).find("--link-calibration link.json is read by --layout auto only"),
            std::string::npos);
}

}  // namespace
}  // namespace ringtrain::runtime
