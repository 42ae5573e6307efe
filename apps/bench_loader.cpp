// apps/bench_loader: images/s one rank's Loader delivers from a shard split, with augmentation, for a
// given number of worker threads. Prints one line per configuration (median of --repeats epochs) so
// the figure can be compared with the rate a training step consumes images.
//   bench_loader --data DIR [--split train] [--batch-size 128] [--threads 1,2] [--batches 100]
//                [--pad-crop 4] [--resized-crop 0] [--hflip] [--repeats 3] [--hdf5-reads]
//                [--decode scaled,region,whole]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <new>
#include <sstream>

#include "core/check.h"
#include "data/loader.h"
#include "runtime/config/cli.h"

using namespace ringtrain;
using namespace ringtrain::data;

// What bench_loader's flags can do when an allocation fails (runtime::main_error).
constexpr const char* kMemoryHint = "a smaller --batch-size, fewer --threads or a smaller --resized-crop";

int main(int argc, char** argv) try {
  CLI::App app{"Measures the loader's images/s on a shard split"};
  std::string data_dir, split = "train", threads_text = "1,2";
  int64_t batch = 128, batches = 100, pad_crop = 0, resized_crop = 0;
  int repeats = 3;
  std::string decode_text = "scaled";
  bool hflip = false, hdf5_reads = false;
  app.add_option("--data", data_dir, "shard dataset folder (made by make_shards)")->required();
  app.add_option("--split", split, "split to read")->capture_default_str();
  runtime::add_number(app, "-b,--batch-size", batch, "records per batch", 1, int64_t{1} << 20);
  constexpr NumberRange<int> kThreads{1, 1024};
  runtime::add_number_list(app, "--threads", threads_text, "comma-separated worker thread counts to measure", kThreads)
      ->capture_default_str();
  runtime::add_number(app, "--batches", batches, "batches per measured run", 1, int64_t{1} << 30);
  runtime::add_number(app, "--pad-crop", pad_crop, "random crop after zero padding by this many pixels", 0,
                      int64_t{1} << 16);
  runtime::add_number(app, "--resized-crop", resized_crop, "random-resized crop to this size (0 = off)", 0, 8192);
  app.add_flag("--hflip", hflip, "random horizontal flip");
  app.add_flag("--hdf5-reads", hdf5_reads, "read decoded images through HDF5 (its lock) instead of pread, to compare");
  app.add_option("--decode", decode_text,
                 "comma-separated JPEG decode modes to measure, interleaved: scaled (the crop's region at the "
                 "smallest DCT scale covering it), region (the region at full size), whole (all of it at full size)")
      ->capture_default_str();
  runtime::add_number(app, "--repeats", repeats, "runs per configuration (median reported)", 1, 1000);
  RT_PARSE_FLAGS(app, argc, argv);
  try {
    auto items = [](const std::string& text) {
      std::vector<std::string> out;
      std::stringstream ss(text);
      for (std::string item; std::getline(ss, item, ',');) out.push_back(item);
      return out;
    };
    const std::vector<int> thread_counts = parse_number_list("--threads", threads_text, kThreads);  // never empty
    const std::vector<std::string> decodes = items(decode_text);
    for (const std::string& d : decodes)
      if (d != "scaled" && d != "region" && d != "whole")
        RT_THROW("--decode: '", d, "' is not scaled, region or whole");
    if (decodes.empty()) RT_THROW("--decode: no mode in '", decode_text, "'");
    // Flags first: opening checksums every shard, which is slow for a large split.
    ShardDataset::OpenOptions oo;
    oo.direct_reads = !hdf5_reads;
    ShardDataset ds = ShardDataset::open(data_dir, split, oo);
    SamplerOptions so;
    so.dataset_size = ds.size();
    so.global_batch = batch;
    so.chunk = ds.chunk_records();
    DistributedSampler sampler(so);
    const int64_t runs = std::min(batches, sampler.batches_per_epoch());
    if (runs == 0) RT_THROW("split '", split, "' has fewer records (", ds.size(), ") than one batch (", batch, ")");
    const auto& info = ds.info();
    std::printf("split '%s': %lld records of %s, batch %lld, %lld batches per run, %s reads\n", split.c_str(),
                static_cast<long long>(ds.size()), info.shape_text().c_str(), static_cast<long long>(batch),
                static_cast<long long>(runs), ds.direct_shards() > 0 ? "pread" : "HDF5");
    // Rounds interleave every configuration (decode mode x thread count) so that a slow spell of a shared
    // machine hits them alike; ratios are medians over rounds of the ratio within a round.
    const size_t configs = decodes.size() * thread_counts.size();
    std::vector<std::vector<double>> rates(configs);
    for (int r = 0; r < repeats; ++r) {
      for (size_t c = 0; c < configs; ++c) {
        const std::string& decode = decodes[c / thread_counts.size()];
        LoaderOptions lo;
        lo.threads = thread_counts[c % thread_counts.size()];
        lo.threads_flag = "--threads";
        lo.transform.pad_crop = pad_crop;
        lo.transform.resized_crop = resized_crop;
        lo.transform.hflip = hflip;
        lo.transform.dct_scaling = decode == "scaled";
        lo.transform.region_decode = decode != "whole";
        Loader loader(ds, lo);
        std::vector<std::vector<int64_t>> list;
        for (int64_t t = 0; t < runs; ++t) list.push_back(sampler.rank_batch(r, t));
        auto start = std::chrono::steady_clock::now();
        loader.start(std::move(list), r);
        int64_t images = 0;
        while (auto b = loader.next()) images += b->valid;
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        rates[c].push_back(static_cast<double>(images) / s);
      }
    }
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    auto ratio = [&](size_t a, size_t b) {
      std::vector<double> r;
      for (int k = 0; k < repeats; ++k)
        r.push_back(rates[a][static_cast<size_t>(k)] / rates[b][static_cast<size_t>(k)]);
      return median(r);
    };
    for (size_t c = 0; c < configs; ++c) {
      const size_t d = c / thread_counts.size(), t = c % thread_counts.size();
      const auto [lo, hi] = std::minmax_element(rates[c].begin(), rates[c].end());
      if (info.encoded) std::printf("decode=%s ", decodes[d].c_str());
      std::printf("threads=%d img_per_s=%.0f (min %.0f, max %.0f over %d runs)", thread_counts[t], median(rates[c]),
                  *lo, *hi, repeats);
      if (t > 0) std::printf(" scaling=%.2fx vs threads=%d", ratio(c, c - t), thread_counts[0]);
      if (d > 0) std::printf(" %.2fx vs decode=%s", ratio(c, t), decodes[0].c_str());
      std::printf("\n");
    }
  } catch (...) {
    return runtime::main_error("bench_loader", kMemoryHint);
  }
  return 0;
} catch (...) {
  return runtime::main_error("bench_loader", kMemoryHint);  // no exception escapes main
}
