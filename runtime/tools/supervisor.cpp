// runtime/tools/supervisor.cpp: hostfiles, mpirun arguments, the relaunch plan and the failure verdict.
#include "runtime/tools/supervisor.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>

#include "comm/world.h"
#include "core/check.h"
#include "core/parse.h"

namespace ringtrain::runtime::supervisor {

using json = nlohmann::json;

namespace {

int parse_slots(const std::string& text, const std::string& where) {
  const std::optional<int> slots = to_number<int>(text);
  RT_CHECK(slots && *slots >= 1 && *slots <= 999999, where, ": slots must be a whole number from 1 to 999999, got '",
           text, "'");
  return *slots;
}

}  // namespace

std::vector<Host> parse_hostfile(const std::string& text, const std::string& file) {
  std::vector<Host> hosts;
  std::istringstream in(text);
  int number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    if (const size_t hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream words(line);
    std::string name, word;
    if (!(words >> name)) continue;
    const std::string where = detail::str_cat("hostfile '", file, "' line ", number);
    Host h{name, 1};
    while (words >> word) {
      const size_t eq = word.find('=');
      const std::string key = word.substr(0, eq);
      RT_CHECK(eq != std::string::npos && (key == "slots" || key == "max_slots" || key == "max-slots"), where,
               ": expected 'HOST [slots=N] [max_slots=M]', got '", word, "'");
      const int n = parse_slots(word.substr(eq + 1), where);
      if (key == "slots") h.slots = n;
    }
    auto same = std::find_if(hosts.begin(), hosts.end(), [&](const Host& o) { return o.name == h.name; });
    if (same != hosts.end())
      same->slots += h.slots;
    else
      hosts.push_back(h);
  }
  RT_CHECK(!hosts.empty(), "hostfile '", file, "' names no host");
  return hosts;
}

std::string hostfile_text(const std::vector<Host>& hosts) {
  std::string out;
  for (const auto& h : hosts) out += detail::str_cat(h.name, " slots=", h.slots, "\n");
  return out;
}

int total_slots(const std::vector<Host>& hosts) {
  int n = 0;
  for (const auto& h : hosts) n += h.slots;
  return n;
}

std::vector<Host> hosts_for(const std::vector<Host>& hosts, int np) {
  std::vector<Host> out;
  for (const auto& h : hosts) {
    if (np <= 0) break;
    out.push_back({h.name, std::min(h.slots, np)});
    np -= out.back().slots;
  }
  RT_CHECK(np <= 0, "hosts_for: not enough slots");
  return out;
}

std::vector<std::string> split_words(const std::string& text) {
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;
  char quote = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quote == '\'') {
      if (c == '\'')
        quote = 0;
      else
        word += c;
    } else if (quote == '"') {
      if (c == '"')
        quote = 0;
      else if (c == '\\' && i + 1 < text.size() && std::string("\"\\$`").find(text[i + 1]) != std::string::npos)
        word += text[++i];
      else
        word += c;
    } else if (c == '\'' || c == '"') {
      quote = c;
      in_word = true;
    } else if (c == '\\' && i + 1 < text.size()) {
      word += text[++i];
      in_word = true;
    } else if (c == ' ' || c == '\t' || c == '\n') {
      if (in_word) words.push_back(word);
      word.clear();
      in_word = false;
    } else {
      word += c;
      in_word = true;
    }
  }
  RT_CHECK(quote == 0, "--mpirun-args: unbalanced ", quote, " quote in '", text, "'");
  if (in_word) words.push_back(word);
  return words;
}

MpirunArgs parse_mpirun_args(const std::vector<std::string>& words) {
  MpirunArgs out;
  for (size_t i = 0; i < words.size(); ++i) {
    const std::string& w = words[i];
    auto value = [&]() -> const std::string& {
      RT_CHECK(i + 1 < words.size(), "--mpirun-args: ", w, " needs a value");
      return words[++i];
    };
    for (const char* own : {"-np", "-n", "--np", "--n", "-c", "--host", "-H", "-host"})
      if (w == own)
        RT_THROW("--mpirun-args: ", w,
                 " is ringtrain_run's to set (it launches --np ranks on the hosts of the "
                 "hostfile that are alive); give --np and --hostfile to ringtrain_run instead");
    if (w == "--hostfile" || w == "-hostfile" || w == "--machinefile" || w == "-machinefile") {
      out.hostfile = value();
      continue;
    }
    if ((w == "--mca" || w == "-mca") && i + 2 < words.size() && words[i + 1] == "plm_rsh_agent")
      out.agent = words[i + 2];
    out.rest.push_back(w);
  }
  return out;
}

JobFlags read_job_flags(const std::vector<std::string>& command) {
  JobFlags f;
  for (size_t i = 0; i < command.size(); ++i) {
    std::string flag = command[i], value;
    bool has_value = false;
    if (const size_t eq = flag.find('='); flag.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag.resize(eq);
      has_value = true;
    }
    if (flag == "--global-batch") f.global_batch = true;
    const bool file = flag == "--data" || flag == "--trace" || flag == "--link-calibration" || flag == "--save-link" ||
                      flag == "--profile-jsonl";
    if (!file && flag != "--checkpoint-dir" && flag != "--log-jsonl" && flag != "--accum-steps" && flag != "--resume" &&
        flag != "--pipeline-stages" && flag != "--pipeline-split")
      continue;
    if (!has_value) {
      RT_CHECK(i + 1 < command.size(), "the training command's ", flag, " has no value");
      value = command[++i];
    }
    if (file) {
      std::erase_if(f.files, [&](const auto& e) { return e.first == flag; });  // the last one given counts
      f.files.emplace_back(flag, value);
    } else if (flag == "--checkpoint-dir")
      f.checkpoint_dir = value;
    else if (flag == "--log-jsonl")
      f.log_jsonl = value;
    else if (flag == "--resume")
      f.resume = value;
    else if (flag == "--pipeline-split")
      f.split_given = true;
    else {
      const std::optional<int64_t> n = to_number<int64_t>(value);
      RT_CHECK(n && *n >= 1 && *n <= 999999999, "the training command's ", flag, " must be a positive number, got '",
               value, "'");
      if (flag == "--accum-steps")
        f.accum = *n;
      else
        f.stages = static_cast<int>(*n);
    }
  }
  return f;
}

std::optional<World> plan_world(int base_np, int64_t base_accum, int slots, int min_np, int max_np,
                                bool allow_batch_change, std::string& why_not, int stages) {
  stages = std::max(stages, 1);
  // Micro-batches of the per-rank batch per step.
  const int64_t micro = static_cast<int64_t>(std::max(base_np / stages, 1)) * base_accum;
  const int top = std::min(slots, max_np);
  if (top < min_np || top < 1) {
    why_not = detail::str_cat("only ", std::max(top, 0),
                              " rank slot(s) are left on the hosts that answer, fewer than "
                              "--min-np ",
                              min_np);
    return std::nullopt;
  }
  for (int s = stages; s >= 1; --s)  // the stages kept if any world keeps the batch with them
    for (int np = top - top % s; np >= std::max(min_np, 1) && np >= s; np -= s)
      if (micro % (np / s) == 0) return World{np, micro / (np / s), false, s};
  if (allow_batch_change) {
    const int s = std::min(stages, top);
    const int np = top - top % s;
    const auto accum = std::max<int64_t>(1, std::llround(static_cast<double>(micro) / (np / s)));
    return World{np, accum, true, s};
  }
  why_not = detail::str_cat("the global batch (",
                            stages > 1 ? detail::str_cat(micro / base_accum, " replicas of ", stages, " stages")
                                       : detail::str_cat(base_np, " ranks"),
                            " x --accum-steps ", base_accum, " = ", micro, " per-rank batches) cannot be kept on ",
                            std::max(min_np, 1), " to ", top, stages > 1 ? " ranks at any stage count" : " ranks",
                            " (none divides ", micro,
                            "); pass --allow-batch-change to train on with another "
                            "global batch, or make more slots available");
  return std::nullopt;
}

ResumePoint newest_resume_point(const ResumePoint& known, const std::string& resumed_from, int64_t resumed_step,
                                const std::vector<std::pair<int64_t, std::string>>& written) {
  ResumePoint best = known;
  auto consider = [&](int64_t step, const std::string& path) {
    if (!path.empty() && step >= 0 && step >= best.step) best = {path, step};
  };
  consider(resumed_step, resumed_from);
  for (const auto& [step, path] : written) consider(step, path);
  return best;
}

std::string describe_resume(const ResumePoint& p, const JobFlags& flags) {
  if (!p.path.empty()) return detail::str_cat("step ", p.step, " from ", p.path);
  if (!flags.resume.empty() && flags.resume != "auto") return detail::str_cat("the command's --resume ", flags.resume);
  if (flags.resume == "auto") return "the command's --resume auto (no checkpoint of this run reported yet)";
  return "the start (no checkpoint yet)";
}

std::vector<std::string> relaunch_command(const std::vector<std::string>& command, const JobFlags& flags, int64_t accum,
                                          const ResumePoint& resume, bool batch_changed, int stages) {
  std::vector<std::string> out;
  const bool restage = stages > 0 && stages != flags.stages;
  for (size_t i = 0; i < command.size(); ++i) {
    if (restage && command[i] == "--pipeline-split") {  // its split is of the old stage count
      ++i;
      continue;
    }
    if (restage && command[i].rfind("--pipeline-split=", 0) == 0) continue;
    out.push_back(command[i]);
  }
  if (restage) {
    out.push_back("--pipeline-stages");
    out.push_back(std::to_string(stages));
  }
  if (accum != flags.accum && !flags.global_batch) {
    out.push_back("--accum-steps");
    out.push_back(std::to_string(accum));
  }
  if (!resume.path.empty()) {
    out.push_back("--resume");
    out.push_back(resume.path);
  }
  if (batch_changed) out.push_back("--allow-batch-change");
  return out;
}

std::string check_resumed(const ResumePoint& announced, const JobFlags& flags, const std::string& resumed_from,
                          int64_t resumed_step) {
  // The path the relaunch was told, and the step it must then be at (when known).
  std::string want = announced.path;
  if (want.empty() && flags.resume != "auto") want = flags.resume;
  const auto same_file = [](const std::string& a, const std::string& b) {
    std::error_code ec;
    return a == b || (!a.empty() && !b.empty() && std::filesystem::equivalent(a, b, ec));
  };
  const std::string got = resumed_from.empty() ? std::string("the start") : resumed_from;
  if (flags.resume == "auto" && announced.path.empty()) return "";  // the command's own choice, nothing announced
  if (!same_file(want, resumed_from))
    return detail::str_cat("the relaunch resumed from ", got, " but ", want.empty() ? std::string("the start") : want,
                           " was announced; it would train on from somewhere else than announced");
  if (announced.step >= 0 && resumed_step != announced.step)
    return detail::str_cat("the relaunch resumed ", got, " at step ", resumed_step, " but step ", announced.step,
                           " was announced");
  return "";
}

std::optional<json> parse_event(const std::string& line) {
  const std::string prefix = comm::kEventPrefix;
  // mpirun may tag forwarded lines ("[1,0]<stdout>:") when asked to; the event is wherever the prefix is.
  const size_t at = line.find(prefix);
  if (at == std::string::npos) return std::nullopt;
  json j = json::parse(line.substr(at + prefix.size()), nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("event") || !j["event"].is_string()) return std::nullopt;
  return j;
}

std::string describe(const Failure& f) {
  auto error_text = [](const json& e) {
    return detail::str_cat("rank ", e.value("rank", -1), " (", e.value("host", std::string("?")),
                           "): ", e.value("message", std::string("?")));
  };
  for (const auto& e : f.errors)
    if (e.value("permanent", false)) return error_text(e);
  std::string lost;
  for (const auto& h : f.lost_hosts) lost += detail::str_cat(lost.empty() ? "" : ", ", h);
  if (!lost.empty() && !f.errors.empty()) return detail::str_cat("host(s) lost: ", lost, "; ", error_text(f.errors[0]));
  if (!lost.empty()) return detail::str_cat("host(s) lost: ", lost);
  if (!f.errors.empty()) return error_text(f.errors[0]);
  if (!f.mpirun_says.empty()) return f.mpirun_says;
  return detail::str_cat("the job exited with status ", f.exit_status, " and no rank said why");
}

Verdict judge(const Failure& f, const Failure* previous) {
  for (const auto& e : f.errors)
    if (e.value("permanent", false)) return Verdict::Permanent;
  if (f.lost_hosts.empty()) {
    if (f.errors.empty() && !f.trained) return Verdict::NoReason;
    if (previous && previous->lost_hosts.empty() && !f.errors.empty() && !previous->errors.empty() &&
        f.errors[0].value("message", std::string()) == previous->errors[0].value("message", std::string()) &&
        f.last_step <= previous->last_step)
      return Verdict::Repeated;
  }
  return Verdict::Restart;
}

}  // namespace ringtrain::runtime::supervisor
