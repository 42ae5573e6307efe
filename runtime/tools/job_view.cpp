// runtime/tools/job_view.cpp: reading a growing JSONL log, and the screen of the job it describes.
#include "runtime/tools/job_view.h"

#include <sys/stat.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <initializer_list>

#include "core/allocator.h"
#include "core/check.h"
#include "io/files.h"
#include "io/json_in.h"

namespace ringtrain::runtime {

using json = nlohmann::json;

namespace {

// Each of `keys` that is there is a number, or null: the log's spelling of a figure that was not finite (a
// NaN loss), which the view shows as nan.
void numbers(const io::JsonIn& r, std::initializer_list<const char*> keys) {
  for (const char* key : keys)
    if (r.has(key) && !r.raw()[key].is_null() && !r.raw()[key].is_number()) r.wrong(key, "a number (or null)");
}
// Each of `keys` that is there is a count: a whole number, 0 or more.
void counts(const io::JsonIn& r, std::initializer_list<const char*> keys) {
  for (const char* key : keys)
    if (r.has(key)) r.integer(key, 0, int64_t{1} << 62);
}

// The fields the view reads, with their types checked: a wrong one is an error naming the log, the
// line and the key (io::JsonIn), never a crash or a made-up number.
void check_record(const json& record, const std::string& where) {
  const io::JsonIn r(record, where);
  const std::string type = r.text("type");
  if (type == "plan") {
    for (const char* key : {"arch", "device", "backend"}) r.text_or(key, "");
    for (const char* key : {"world_size", "nodes", "batch_size", "accum_steps", "global_batch", "total_steps"})
      r.integer_or(key, 0, 0, int64_t{1} << 50);
    if (r.has("predicted_peak_mem_bytes")) r.number("predicted_peak_mem_bytes");
    if (r.has("memory")) r.at("memory").floats_or("budget_bytes_by_rank");
  } else if (type == "train") {
    numbers(r, {"loss", "lr", "img_per_s"});
    counts(r, {"step", "epoch"});
    if (r.has("time")) numbers(r.at("time"), {"data_wait", "forward", "backward", "exposed_comm", "optimizer"});
  } else if (type == "eval") {
    numbers(r, {"test_top1", "test_top5", "test_loss"});
    counts(r, {"step"});
  } else if (type == "summary") {
    numbers(r, {"elapsed_s", "img_per_s", "peak_mem_bytes", "predicted_peak_mem_bytes"});
    counts(r, {"steps"});
  } else if (type == "gpu" && r.has("samples")) {
    for (const io::JsonIn& sample : r.objects("samples")) sample.integer_or("rank", -1, -1, 1 << 30);
  }
}

}  // namespace

bool LogTail::poll() {
  struct stat st {};
  if (::stat(path_.c_str(), &st) != 0) return false;
  // A folder would read as gigabytes of nothing, a FIFO would block: only a regular file is a log.
  io::require_regular_file(path_, "--watch");
  // Another file there, a shorter one, or one whose beginning changed (rewritten in place: `cat new > log`):
  // a new log, read from its start.
  if (st.st_ino != inode_ || st.st_dev != device_ || st.st_size < offset_ || head_changed()) {
    inode_ = st.st_ino;
    device_ = st.st_dev;
    offset_ = 0;
    line_ = 0;
    partial_.clear();
    head_.clear();
    last_.clear();
  }
  std::ifstream in(path_, std::ios::binary);
  if (!in) return false;
  in.seekg(0, std::ios::end);
  const int64_t size = in.tellg();
  if (size < offset_) return true;  // shrunk between the stat and the open: the next poll starts over
  in.seekg(offset_);
  std::string chunk(static_cast<size_t>(size - offset_), '\0');
  in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
  if (head_.size() < kHead) head_ += chunk.substr(0, kHead - head_.size());
  offset_ = size;
  partial_ += chunk;
  size_t start = 0;
  for (size_t end; (end = partial_.find('\n', start)) != std::string::npos; start = end + 1) {
    ++line_;
    const json record = json::parse(partial_.begin() + static_cast<std::ptrdiff_t>(start),
                                    partial_.begin() + static_cast<std::ptrdiff_t>(end), nullptr, false);
    if (!record.is_object() || !record.contains("type")) continue;
    check_record(record, detail::str_cat(path_, ":", line_));
    const std::string type = record["type"].get<std::string>();
    if (type == "plan") last_.clear();  // a new run's plan: the view starts over with it
    last_[type] = record;
  }
  partial_.erase(0, start);
  return true;
}

bool LogTail::head_changed() const {
  if (head_.empty()) return false;
  std::ifstream in(path_, std::ios::binary);
  std::string now(head_.size(), '\0');
  in.read(now.data(), static_cast<std::streamsize>(now.size()));
  return in.gcount() != static_cast<std::streamsize>(now.size()) || now != head_;
}

double LogTail::seconds_since_change() const {
  struct stat st {};
  if (::stat(path_.c_str(), &st) != 0) return 0;
  const double modified = static_cast<double>(st.st_mtim.tv_sec) + 1e-9 * static_cast<double>(st.st_mtim.tv_nsec);
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  return std::max(0.0, now - modified);
}

namespace {

double number(const json& j, const char* key, double otherwise = NAN) {
  return j.is_object() && j.contains(key) && j[key].is_number() ? j[key].get<double>() : otherwise;
}

std::string text(const json& j, const char* key) {
  return j.is_object() && j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string("?");
}

std::string bytes(double b) { return std::isfinite(b) ? format_bytes(static_cast<int64_t>(b)) : std::string("?"); }

}  // namespace

std::string render_job_view(const std::map<std::string, json>& last, double age_s) {
  std::string out;
  char line[512];
  const auto plan = last.find("plan");
  if (plan == last.end()) return "no plan record yet: the job has not started training\n";
  const json& p = plan->second;
  std::snprintf(line, sizeof line,
                "ringtrain job: %s on %s, %d rank(s) on %d node(s), %s, batch %lld x %lld accum = %lld global\n",
                text(p, "arch").c_str(), text(p, "device").c_str(), static_cast<int>(number(p, "world_size", 0)),
                static_cast<int>(number(p, "nodes", 0)), text(p, "backend").c_str(),
                static_cast<long long>(number(p, "batch_size", 0)), static_cast<long long>(number(p, "accum_steps", 1)),
                static_cast<long long>(number(p, "global_batch", 0)));
  out += line;
  if (p.contains("predicted_peak_mem_bytes")) {
    out += "memory: predicted peak " + bytes(number(p, "predicted_peak_mem_bytes")) + " per rank";
    if (p.contains("memory") && p["memory"].contains("budget_bytes_by_rank") &&
        !p["memory"]["budget_bytes_by_rank"].empty())
      out += ", budget " +
             bytes(p["memory"]["budget_bytes_by_rank"][0].is_number()
                       ? p["memory"]["budget_bytes_by_rank"][0].get<double>()
                       : NAN) +
             " (rank 0)";
    out += "\n";
  }
  const double total = number(p, "total_steps", 0);
  if (const auto t = last.find("train"); t != last.end()) {
    const json& r = t->second;
    const double step = number(r, "step", 0);
    std::snprintf(line, sizeof line, "step %.0f", step);
    out += line;
    if (total > 0) {
      std::snprintf(line, sizeof line, "/%.0f (%.0f%%)", total, 100 * step / total);
      out += line;
    }
    std::snprintf(line, sizeof line, ", epoch %.0f: loss %.4f, lr %.4g, %.0f img/s\n", number(r, "epoch", 0) + 1,
                  number(r, "loss"), number(r, "lr"), number(r, "img_per_s"));
    out += line;
    if (r.contains("time") && r["time"].is_object()) {
      const json& tm = r["time"];
      const double parts[5] = {number(tm, "data_wait", 0), number(tm, "forward", 0), number(tm, "backward", 0),
                               number(tm, "exposed_comm", 0), number(tm, "optimizer", 0)};
      std::snprintf(line, sizeof line,
                    "step time %.3f s = data %.3f + forward %.3f + backward %.3f + comm %.3f + optimizer %.3f\n",
                    parts[0] + parts[1] + parts[2] + parts[3] + parts[4], parts[0], parts[1], parts[2], parts[3],
                    parts[4]);
      out += line;
    }
  } else {
    out += "no step reported yet\n";
  }
  if (const auto e = last.find("eval"); e != last.end()) {
    const json& r = e->second;
    std::snprintf(line, sizeof line, "evaluation at step %.0f: top-1 %.2f%%, top-5 %.2f%%, loss %.4f\n",
                  number(r, "step", 0), 100 * number(r, "test_top1"), 100 * number(r, "test_top5"),
                  number(r, "test_loss"));
    out += line;
  }
  if (const auto g = last.find("gpu"); g != last.end() && g->second.contains("samples")) {
    out += "rank   gpu   memory                       temp    power\n";
    for (const json& s : g->second["samples"]) {
      std::snprintf(line, sizeof line, "%4d  %3.0f%%   %-11s of %-11s   %3.0fC  %5.0f W\n",
                    static_cast<int>(number(s, "rank", -1)), number(s, "util_pct"),
                    bytes(number(s, "mem_used_bytes")).c_str(), bytes(number(s, "mem_total_bytes")).c_str(),
                    number(s, "temperature_c"), number(s, "power_w"));
      out += line;
    }
  } else {
    out += "no GPU readings (a CPU run, or no NVML)\n";
  }
  if (const auto s = last.find("summary"); s != last.end()) {
    const json& r = s->second;
    std::snprintf(line, sizeof line, "finished: %.0f steps in %.0f s, %.0f img/s, peak memory %s",
                  number(r, "steps", 0), number(r, "elapsed_s", 0), number(r, "img_per_s", 0),
                  bytes(number(r, "peak_mem_bytes")).c_str());
    out += line;
    if (r.contains("predicted_peak_mem_bytes"))
      out += " (predicted " + bytes(number(r, "predicted_peak_mem_bytes")) + ")";
    out += "\n";
  } else {
    std::snprintf(line, sizeof line, "running; the log last grew %.0f s ago\n", age_s);
    out += line;
  }
  return out;
}

}  // namespace ringtrain::runtime
