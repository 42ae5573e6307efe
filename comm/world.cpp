// comm/world.cpp: MPI bootstrap, local ranks, device binding, job-wide abort.
#include "comm/world.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <mutex>
#include <new>
#include <set>
#include <span>
#include <thread>

#include "comm/communicator.h"
#include "comm/host_collectives.h"
#include "comm/mpi_check.h"
#include "core/allocator.h"
#include "core/check.h"
#include "core/env.h"
#include "core/parallel.h"

namespace ringtrain::comm {
namespace {

World* g_world = nullptr;
bool g_we_initialized = false;

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && g_we_initialized) MPI_Finalize();
}

// Ranks on this node whose CPU affinity equals ours: they share those cores.
int ranks_sharing_my_cores(MPI_Comm local) {
  cpu_set_t mine;
  CPU_ZERO(&mine);
  if (sched_getaffinity(0, sizeof mine, &mine) != 0) return 1;
  int n = 1;
  MPI_CHECK(MPI_Comm_size(local, &n));
  std::vector<cpu_set_t> all(n);
  MPI_CHECK(MPI_Allgather(&mine, sizeof mine, MPI_BYTE, all.data(), sizeof mine, MPI_BYTE, local));
  int same = 0;
  for (const auto& s : all) same += CPU_EQUAL(&s, &mine) ? 1 : 0;
  return std::max(1, same);
}

int g_sharing = 1;

}  // namespace

bool World::initialized() { return g_world != nullptr; }

World& World::init(int* argc, char*** argv) {
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  if (g_world) return *g_world;
  int already = 0;
  MPI_CHECK(MPI_Initialized(&already));
  int provided = MPI_THREAD_SINGLE;
  if (!already) {
    const int rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS) RT_THROW("MPI_Init_thread failed (code ", rc, "): is the MPI installation usable?");
    g_we_initialized = true;
    std::atexit(finalize_at_exit);
  } else {
    MPI_CHECK(MPI_Query_thread(&provided));
  }
  auto* w = new World();  // lives for the process (communicators and apps hold references)
  w->thread_level_ = provided;
  MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &w->comm_));
  MPI_CHECK(MPI_Comm_set_errhandler(w->comm_, MPI_ERRORS_RETURN));
  MPI_CHECK(MPI_Comm_rank(w->comm_, &w->rank_));
  MPI_CHECK(MPI_Comm_size(w->comm_, &w->size_));

  MPI_Comm local = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split_type(w->comm_, MPI_COMM_TYPE_SHARED, w->rank_, MPI_INFO_NULL, &local));
  MPI_CHECK(MPI_Comm_set_errhandler(local, MPI_ERRORS_RETURN));
  MPI_CHECK(MPI_Comm_rank(local, &w->local_rank_));
  MPI_CHECK(MPI_Comm_size(local, &w->local_size_));
  g_sharing = ranks_sharing_my_cores(local);
  // Node count: the ranks that are local rank 0.
  int leader = w->local_rank_ == 0 ? 1 : 0;
  MPI_CHECK(MPI_Allreduce(&leader, &w->num_nodes_, 1, MPI_INT, MPI_SUM, w->comm_));
  const int64_t local_size = w->local_size_;
  w->nodes_uniform_ = same_on_every_rank(w->comm_, std::span<const int64_t>(&local_size, 1));
  MPI_CHECK(MPI_Comm_free(&local));

  char name[MPI_MAX_PROCESSOR_NAME] = {0};
  int length = 0;
  MPI_CHECK(MPI_Get_processor_name(name, &length));
  std::vector<char> all(static_cast<size_t>(MPI_MAX_PROCESSOR_NAME) * w->size_);
  MPI_CHECK(
      MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, w->comm_));
  w->hosts_.clear();
  for (int r = 0; r < w->size_; ++r)
    w->hosts_.emplace_back(all.data() + static_cast<size_t>(r) * MPI_MAX_PROCESSOR_NAME);
  g_world = w;
  return *w;
}

std::string World::describe() const {
  return detail::str_cat("rank ", rank_, " of ", size_, " (local ", local_rank_, " of ", local_size_, ") on ", host());
}

DeviceBinding World::bind(Device want, int threads, bool allow_shared_gpu, int chosen) const {
  DeviceBinding b;
  const int cores = available_cores(), share = std::max(1, cores / g_sharing);
  // No --threads: RINGTRAIN_THREADS where it is set (README), checked as --threads is.
  const char* source = "--threads";
  if (threads <= 0)
    if (const std::optional<int> n = threads_from_env()) threads = *n, source = "RINGTRAIN_THREADS";
  // Far more threads than cores only thrash (4096 on 2 cores ran no step in minutes): refused, naming why.
  RT_CHECK(threads <= kMaxThreadsPerCore * cores, source, " ", threads, ": rank ", rank_, " on ", host(), " has ",
           cores, " core(s) available; more than ", kMaxThreadsPerCore,
           " threads per core only slows a step down (0 gives each of the ", g_sharing, " rank(s) sharing them ", share,
           ")");
  if (threads > share && local_rank_ == 0)
    std::fprintf(stderr,
                 "warning: %s %d is more than the %d core(s) available to each of the %d rank(s) on %s: "
                 "threads will wait for cores (0 chooses %d)\n",
                 source, threads, share, g_sharing, host().c_str(), share);
  if (threads <= 0) threads = share;
  b.threads = threads;
  set_num_threads(threads);
  if (want.is_cpu()) {
    b.device = Device::cpu();
    b.description = detail::str_cat("rank ", rank_, " -> cpu, ", threads, " threads (local rank ", local_rank_, " of ",
                                    local_size_, ")");
    return b;
  }
  const int count = cuda_device_count();
  if (count == 0)
    RT_THROW("rank ", rank_, " on ", host(), ": asked for a CUDA device but none is usable (", cuda_status().reason,
             "); use --device cpu");
  if (local_size_ > count && !allow_shared_gpu)
    RT_THROW("rank ", rank_, " on ", host(), ": ", local_size_, " ranks on this node but only ", count,
             " GPU(s); start at most ", count, " ranks per node, or allow ranks to share GPUs (train_resnet ",
             "--allow-shared-gpu; World::bind(..., allow_shared_gpu = true))");
  RT_CHECK(chosen < count, "rank ", rank_, " on ", host(), ": cuda:", chosen, " was chosen but CUDA sees ", count,
           " GPU(s)");
  b.device = Device::cuda(chosen >= 0 ? chosen : local_rank_ % count);
  set_current_device(b.device);
  b.description = detail::str_cat("rank ", rank_, " -> ", b.device.str(), " (local rank ", local_rank_, " of ",
                                  local_size_, ", ", count, " GPUs), ", threads, " CPU threads");
  return b;
}

bool supervised() {
  const std::optional<std::string> v = env_text("RINGTRAIN_SUPERVISOR");  // ringtrain_run's identity, or 0
  return v && *v != "0";
}

std::string json_quote(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buffer[8];
          std::snprintf(buffer, sizeof buffer, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
          out += buffer;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

void supervisor_event(const std::string& json_object, bool to_stderr) {
  if (!supervised()) return;
  std::FILE* out = to_stderr ? stderr : stdout;
  std::fprintf(out, "%s%s\n", kEventPrefix, json_object.c_str());
  std::fflush(out);
}

void World::abort(const std::string& message, int code, bool permanent) const {
  if (permanent) code = kExitPermanent;
  std::fprintf(stderr, "ringtrain: rank %d (%s): %s\n", rank_, host().c_str(), message.c_str());
  std::fflush(stderr);
  supervisor_event(
      detail::str_cat("{\"event\":\"error\",\"rank\":", rank_, ",\"host\":", json_quote(host()),
                      ",\"permanent\":", permanent ? "true" : "false", ",\"message\":", json_quote(message), "}"),
      true);
  if (size_ == 1) std::_Exit(code);
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

int run_main(int argc, char** argv, const std::function<int(World&)>& fn) { return run_main(argc, argv, nullptr, fn); }

int run_main(int argc, char** argv, const char* memory_hint, const std::function<int(World&)>& fn) {
  World* world = nullptr;
  auto with_hint = [memory_hint](std::string message) {
    if (memory_hint && out_of_memory_message(message)) message += std::string("; to use less memory: ") + memory_hint;
    return message;
  };
  auto permanent = [](const std::exception& e) {
    const auto* error = dynamic_cast<const Error*>(&e);
    return error && error->permanent();
  };
  try {
    world = &World::init(&argc, &argv);
    return fn(*world);
  } catch (const CollectiveError& e) {
    // Every rank has the same message: rank 0 prints it and ends the job; the others give it a moment.
    if (world && world->rank() != 0 && world->size() > 1) std::this_thread::sleep_for(std::chrono::seconds(5));
    if (world) world->abort(e.what(), 1, e.permanent());
    std::fprintf(stderr, "ringtrain: %s\n", e.what());
    return e.permanent() ? kExitPermanent : 1;
  } catch (const std::bad_alloc&) {
    const std::string text = with_hint("out of host memory (an allocation failed)");
    if (world) world->abort(text);
    std::fprintf(stderr, "ringtrain: %s\n", text.c_str());
    return 1;
  } catch (const std::exception& e) {
    const std::string text = with_hint(e.what());
    if (world) world->abort(text, 1, permanent(e));
    std::fprintf(stderr, "ringtrain: %s\n", text.c_str());
    return permanent(e) ? kExitPermanent : 1;
  } catch (...) {
    if (world) world->abort("an unknown exception (not derived from std::exception) escaped");
    std::fprintf(stderr, "ringtrain: an unknown exception escaped\n");
    return 1;
  }
}

}  // namespace ringtrain::comm
