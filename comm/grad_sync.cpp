// comm/grad_sync.cpp: bucket planning, gradient-ready hooks, ordered launches, startup model check.
#include "comm/grad_sync.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <sstream>

#include "comm/mpi_check.h"
#include "core/autograd.h"
#include "core/check.h"
#include "core/device.h"
#include "core/hash.h"
#include "layers/module.h"

namespace ringtrain::comm {

Compression parse_compression(const std::string& text) {
  if (text == "none") return Compression::None;
  if (text == "bf16") return Compression::BF16;
  if (text == "fp16" || text == "f16") return Compression::F16;
  RT_THROW("unknown gradient compression '", text, "' (expected none, bf16 or fp16)");
}

uint64_t fingerprint(const Tensor& t) {
  Tensor host = t.device().is_cpu() ? t : t.to(Device::cpu());
  return Fnv1a().add_words(host.data_ptr(), host.nbytes()).value();
}

namespace {

struct Param {
  std::string name;
  Tensor tensor;
  int bucket = -1;
  Tensor view;  // the .grad view into the bucket
  bool ready = false;
  bool used = false;  // ZeRO-1: reached through a layer's use hook since the last gather
};

struct Bucket {
  BucketInfo info;
  Tensor flat, wire;  // wire: compressed copy (undefined without compression)

  std::vector<int> params;
  int pending = 0;
  WorkPtr work;
  Work::TimePoint launched;
  WorkPtr gather;                  // ZeRO-1: the parameters' all-gather, until finish_gather
  bool zero_after_gather = false;  // zero_grad() came while it was on the wire
};

// A bucket's average over one rank: the gradient itself, nothing launched (so a step of one rank waits
// for no communicator and can be captured as a CUDA graph).
class DoneWork final : public Work {
 public:
  void wait() override {}
  bool test() override { return true; }
};

std::string structure_line(const std::string& kind, const std::string& name, const Tensor& t) {
  std::ostringstream os;
  os << kind << " '" << name << "' " << t.dtype() << t.shape();
  return os.str();
}

}  // namespace

struct GradSync::State {
  CommunicatorPtr comm;
  GradSyncOptions options;
  std::vector<Param> params;
  GradSync::Named buffers;
  std::vector<Bucket> buckets;
  std::vector<BucketInfo> infos;
  int next_launch = 0;
  bool no_sync = false;
  double last_wait = 0;
  int launched_early = 0;
  std::vector<GradSync::BucketTiming> timings;
  std::vector<ShardPiece> pieces;                                 // ZeRO-1
  std::vector<std::shared_ptr<const Module::UseHook>> use_hooks;  // ZeRO-1, one per module with parameters
  bool overlap_allowed = false;  // hooks installed, and no forward has reached a parameter without one yet
  bool gather_overlapped = false;
  std::mutex mutex;  // hooks and finish() may come from different threads

  void check_same_model();
  void plan();
  void on_ready(int index);
  void launch(int b);
  void ensure_view(Param& p);
  void reset_step();
  void wait_all() noexcept;
  void install_use_hooks(const Module& model, const std::weak_ptr<State>& self);
  void on_use(const std::vector<int>& bucket_list, const std::vector<int>& param_list);
  void finish_gather(int b);
  void finish_gathers();
};

// Collective: every rank compares its structure (and, without a broadcast, its values) with rank 0's.
void GradSync::State::check_same_model() {
  // On a private duplicate: the communicator's own thread may be running operations on its MPI
  // communicator, and MPI forbids two threads using one communicator for collectives at once.
  struct PrivateComm {
    MPI_Comm c = MPI_COMM_NULL;
    ~PrivateComm() {
      if (c != MPI_COMM_NULL) MPI_Comm_free(&c);
    }
  } priv;
  MPI_CHECK(MPI_Comm_dup(comm->mpi_comm(), &priv.c));
  MPI_CHECK(MPI_Comm_set_errhandler(priv.c, MPI_ERRORS_RETURN));
  const MPI_Comm check = priv.c;
  std::vector<std::string> lines;
  for (const auto& p : params) lines.push_back(structure_line("parameter", p.name, p.tensor));
  for (const auto& [name, t] : buffers) lines.push_back(structure_line("buffer", name, t));
  std::string mine;
  for (const auto& l : lines) mine += l + "\n";
  // Rank 0's structure text to everyone.
  int64_t length = static_cast<int64_t>(mine.size());
  MPI_CHECK(MPI_Bcast(&length, 1, MPI_INT64_T, 0, check));
  std::string root(static_cast<size_t>(length), '\0');
  if (comm->rank() == 0) root = mine;
  MPI_CHECK(MPI_Bcast(root.data(), static_cast<int>(length), MPI_CHAR, 0, check));
  std::string error;
  if (root != mine) {
    std::vector<std::string> theirs;
    std::istringstream is(root);
    for (std::string l; std::getline(is, l);) theirs.push_back(l);
    size_t i = 0;
    while (i < lines.size() && i < theirs.size() && lines[i] == theirs[i]) ++i;
    if (i < lines.size() && i < theirs.size())
      error = detail::str_cat("entry ", i, " is ", lines[i], " here but ", theirs[i], " on rank 0");
    else
      error = detail::str_cat("the model has ", lines.size(), " parameters and buffers here but ", theirs.size(),
                              " on rank 0", i < lines.size() ? "; first extra: " + lines[i] : std::string());
  }
  agree_or_throw(check, error, "GradSync: the model check (every rank must build the same model)", true);

  if (options.broadcast_parameters) {
    NoGradGuard no_grad;
    std::vector<WorkPtr> work;
    for (auto& p : params) work.push_back(comm->broadcast_async(p.tensor.detach(), 0));
    for (auto& [name, t] : buffers) work.push_back(comm->broadcast_async(t, 0));
    for (auto& w : work) w->wait();
  }
  // Values: every rank's fingerprints against rank 0's.
  std::vector<uint64_t> prints;
  std::vector<std::string> names;
  for (const auto& p : params) {
    prints.push_back(fingerprint(p.tensor));
    names.push_back("parameter '" + p.name + "'");
  }
  for (const auto& [name, t] : buffers) {
    prints.push_back(fingerprint(t));
    names.push_back("buffer '" + name + "'");
  }
  std::vector<uint64_t> root_prints = prints;
  MPI_CHECK(MPI_Bcast(root_prints.data(), static_cast<int>(root_prints.size()), MPI_UINT64_T, 0, check));
  error.clear();
  for (size_t i = 0; i < prints.size(); ++i)
    if (prints[i] != root_prints[i]) {
      error = detail::str_cat(names[i], " holds different values than on rank 0 (start every rank from the same ",
                              "seed or checkpoint, or keep broadcast_parameters on)");
      break;
    }
  agree_or_throw(check, error, "GradSync: the weight check (every rank must start from rank 0's weights)", true);
}

int64_t bucket_capacity(const GradSyncOptions& options, size_t index) {
  return static_cast<int64_t>((index == 0 ? options.first_bucket_mb : options.bucket_mb) * 1024 * 1024);
}

void GradSync::State::plan() {
  const auto cap = [&](size_t bucket_index) { return bucket_capacity(options, bucket_index); };
  // Reverse registration order: the order backward tends to produce gradients in.
  for (int i = static_cast<int>(params.size()) - 1; i >= 0; --i) {
    Param& p = params[i];
    const Tensor& t = p.tensor;
    bool fits = false;
    if (!buckets.empty()) {
      Bucket& b = buckets.back();
      fits = b.info.dtype == t.dtype() && b.info.device == t.device() &&
             (b.info.bytes + t.nbytes() <= cap(buckets.size() - 1) || b.params.empty());
    }
    if (!fits) {
      buckets.emplace_back();
      buckets.back().info.dtype = t.dtype();
      buckets.back().info.device = t.device();
    }
    Bucket& b = buckets.back();
    p.bucket = static_cast<int>(buckets.size()) - 1;
    b.params.push_back(i);
    b.info.parameters.push_back(p.name);
    b.info.numel += t.numel();
    b.info.bytes += t.nbytes();
  }
  RT_CHECK(options.zero_stage == 0 || options.zero_stage == 1, "GradSync: zero_stage must be 0 or 1, got ",
           options.zero_stage);
  RT_CHECK(options.zero_stage == 0 || options.compression == Compression::None,
           "GradSync: ZeRO-1 (zero_stage 1) does not combine with gradient compression");
  for (Bucket& b : buckets) {
    b.flat = Tensor::zeros(Shape{b.info.numel}, b.info.dtype, b.info.device);
    if (options.compression != Compression::None) {
      const DType wire = options.compression == Compression::BF16 ? DType::BF16 : DType::F16;
      RT_CHECK(is_floating(b.info.dtype), "GradSync: compression needs floating gradients; bucket of ",
               b.info.parameters.front(), " is ", b.info.dtype);
      b.wire = Tensor::zeros(Shape{b.info.numel}, wire, b.info.device);
    }
    int64_t offset = 0;
    for (int i : b.params) {
      Param& p = params[i];
      p.view = b.flat.slice(offset, offset + p.tensor.numel()).view(p.tensor.shape());
      offset += p.tensor.numel();
      // Keep what the parameter had accumulated so far (usually nothing).
      if (p.tensor.grad().defined()) p.view.copy_(p.tensor.grad());
      p.tensor.set_grad(p.view);
    }
    b.pending = static_cast<int>(b.params.size());
    infos.push_back(b.info);
  }
  if (options.zero_stage != 1) return;
  for (int k = 0; k < static_cast<int>(buckets.size()); ++k) {
    Bucket& b = buckets[k];
    const auto [lo, hi] = comm->shard(b.info.numel);
    int64_t offset = 0;
    for (int i : b.params) {
      const int64_t n = params[i].tensor.numel(), a = std::max(lo, offset), e = std::min(hi, offset + n);
      if (a < e) pieces.push_back({params[i].name, i, k, a - offset, e - offset, a, b.flat.slice(a, e)});
      offset += n;
    }
  }
}

void GradSync::State::ensure_view(Param& p) {
  Tensor g = p.tensor.grad();
  if (g.defined() && g.data_ptr() == p.view.data_ptr()) return;
  // zero_grad(set_to_none) replaced the view by a fresh tensor: bring its values home.
  if (g.defined())
    p.view.copy_(g);
  else
    p.view.zero_();
  p.tensor.set_grad(p.view);
}

// ZeRO-1: one hook per module with parameters, waiting for the buckets that hold them.
void GradSync::State::install_use_hooks(const Module& model, const std::weak_ptr<State>& self) {
  std::map<const TensorImpl*, int> index;
  for (int i = 0; i < static_cast<int>(params.size()); ++i) index[params[i].tensor.impl()] = i;
  model.for_each_module([&](const Module& m) {
    std::vector<int> mine, held;
    for (const auto& [name, t] : m.own_parameters())
      if (auto it = index.find(t.impl()); it != index.end()) {
        mine.push_back(it->second);
        const int b = params[it->second].bucket;
        if (std::find(held.begin(), held.end(), b) == held.end()) held.push_back(b);
      }
    if (mine.empty()) return;
    auto hook = std::make_shared<const Module::UseHook>([self, held, mine](const Module&) {
      if (auto st = self.lock()) st->on_use(held, mine);
    });
    m.set_use_hook(hook);
    use_hooks.push_back(std::move(hook));
  });
  overlap_allowed = !use_hooks.empty();
}

void GradSync::State::on_use(const std::vector<int>& bucket_list, const std::vector<int>& param_list) {
  std::lock_guard<std::mutex> lock(mutex);
  for (int i : param_list) params[i].used = true;
  for (int b : bucket_list) finish_gather(b);
}

// Waits for bucket b's all-gather and copies the parameters out of it (then zeroes it, when zero_grad() came
// in the meantime).
void GradSync::State::finish_gather(int index) {
  Bucket& b = buckets[index];
  if (!b.gather) return;
  const WorkPtr work = std::move(b.gather);
  b.gather.reset();
  work->wait();
  NoGradGuard no_grad;
  int64_t offset = 0;
  for (int i : b.params) {
    Param& p = params[i];
    const int64_t n = p.tensor.numel();
    p.tensor.detach().copy_(b.flat.slice(offset, offset + n).view(p.tensor.shape()));
    offset += n;
  }
  if (b.zero_after_gather) b.flat.zero_();
  b.zero_after_gather = false;
}

// Every bucket's, in the order they were launched (the last bucket first).
void GradSync::State::finish_gathers() {
  for (int k = static_cast<int>(buckets.size()) - 1; k >= 0; --k) finish_gather(k);
}

void GradSync::State::launch(int index) {
  Bucket& b = buckets[index];
  finish_gather(index);  // a bucket whose parameters no layer waited for (unused this step)
  b.launched = std::chrono::steady_clock::now();
  if (comm->size() == 1 && !b.wire.defined() && options.zero_stage != 1) {
    b.work = std::make_shared<DoneWork>();  // x / 1 == x: the backends' result, bit for bit
  } else if (b.wire.defined()) {
    b.wire.copy_(b.flat);
    b.work = comm->all_reduce_async(b.wire, ReduceOp::Average);
  } else if (options.zero_stage == 1) {
    b.work = comm->reduce_scatter_shard_async(b.flat, ReduceOp::Average);
  } else {
    b.work = comm->all_reduce_async(b.flat, ReduceOp::Average);
  }
}

void GradSync::State::on_ready(int index) {
  std::lock_guard<std::mutex> lock(mutex);
  Param& p = params[index];
  // With the gather left to the forward, every parameter read must have come through its layer's hook: one
  // that did not may have been read before its all-gather arrived (its old value), and its bucket may still
  // be on the wire while this gradient lands in it.
  if (gather_overlapped && !p.used)
    RT_THROW("GradSync (ZeRO-1): parameter '", p.name, "' got a gradient but its layer did not call ",
             "use_parameters() (layers/module.h) in this forward, after earlier forwards did: it may have been read ",
             "before its all-gather arrived; call use_parameters() in that layer's forward on every path");
  ensure_view(p);
  if (no_sync) return;  // accumulate locally
  if (p.ready)
    RT_THROW("GradSync: parameter '", p.name, "' received its gradient twice in one step (backward ran again ",
             "before finish(); accumulate micro-batches under no_sync(), or call finish() between steps)");
  p.ready = true;
  --buckets[p.bucket].pending;
  if (!options.overlap) return;
  while (next_launch < static_cast<int>(buckets.size()) && buckets[next_launch].pending == 0) launch(next_launch++);
}

void GradSync::State::reset_step() {
  for (Param& p : params) p.ready = false;
  for (Bucket& b : buckets) {
    b.pending = static_cast<int>(b.params.size());
    b.work.reset();
  }
  next_launch = 0;
}

void GradSync::State::wait_all() noexcept {
  for (Bucket& b : buckets) {
    if (!b.work) continue;
    try {
      b.work->wait();
    } catch (...) {
    }
    b.work.reset();
  }
}

GradSync::GradSync(const Module& model, CommunicatorPtr comm, GradSyncOptions options)
    : GradSync(model.named_parameters(), model.named_buffers(), std::move(comm), options, &model) {}

GradSync::GradSync(Named parameters, Named buffers, CommunicatorPtr comm, GradSyncOptions options)
    : GradSync(std::move(parameters), std::move(buffers), std::move(comm), options, nullptr) {}

GradSync::GradSync(Named parameters, Named buffers, CommunicatorPtr comm, GradSyncOptions options, const Module* model)
    : state_(std::make_shared<State>()) {
  RT_CHECK(comm, "GradSync: no communicator");
  RT_CHECK(options.first_bucket_mb > 0 && options.bucket_mb > 0, "GradSync: bucket sizes must be positive, got ",
           options.first_bucket_mb, " and ", options.bucket_mb, " MB");
  State& s = *state_;
  s.comm = std::move(comm);
  s.options = options;
  for (auto& [name, t] : parameters) {
    RT_CHECK(t.defined() && t.is_leaf() && t.requires_grad(), "GradSync: parameter '", name,
             "' must be a leaf that requires grad");
    Param p;
    p.name = name;
    p.tensor = t;
    s.params.push_back(std::move(p));
  }
  s.buffers = std::move(buffers);
  s.check_same_model();
  s.plan();
  std::weak_ptr<State> weak = state_;
  if (model && s.options.zero_stage == 1 && s.options.overlap_gather) s.install_use_hooks(*model, weak);
  for (int i = 0; i < static_cast<int>(s.params.size()); ++i)
    s.params[i].tensor.register_ready_hook([weak, i](Tensor&) {
      if (auto st = weak.lock()) st->on_ready(i);
    });
}

// Never waits: a bucket still on the wire finishes (or is cancelled) inside its communicator, which keeps
// the bucket's memory alive until then.
GradSync::~GradSync() = default;

void GradSync::finish() {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.no_sync) return;
  std::vector<std::string> missing;
  for (Param& p : s.params) {
    if (p.ready) continue;
    s.ensure_view(p);
    missing.push_back(p.name);
  }
  if (!missing.empty() && !s.options.allow_unused) {
    s.wait_all();
    s.reset_step();
    std::string list;
    for (size_t i = 0; i < missing.size() && i < 5; ++i) list += detail::str_cat(i ? ", '" : "'", missing[i], "'");
    if (missing.size() > 5) list += detail::str_cat(" and ", missing.size() - 5, " more");
    RT_THROW("GradSync: parameter ", list, " received no gradient this step (not used by the forward pass?); ",
             "set GradSyncOptions.allow_unused if the model has parameters a step may skip");
  }
  s.launched_early = s.next_launch;
  // Unused parameters (allowed) contribute what their view holds: zeros after zero_grad().
  for (Param& p : s.params) {
    if (p.ready) continue;
    p.ready = true;
    --s.buckets[p.bucket].pending;
  }
  const auto t0 = std::chrono::steady_clock::now();
  while (s.next_launch < static_cast<int>(s.buckets.size())) s.launch(s.next_launch++);
  std::exception_ptr error;
  s.timings.clear();
  for (int i = 0; i < static_cast<int>(s.buckets.size()); ++i) {
    Bucket& b = s.buckets[i];
    try {
      b.work->wait();
      BucketTiming t{i, b.launched, b.launched, std::chrono::steady_clock::now()};
      b.work->ran(t.begin, t.end);
      s.timings.push_back(t);
      if (b.wire.defined()) b.flat.copy_(b.wire);
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  }
  s.last_wait = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  s.reset_step();
  if (error) std::rethrow_exception(error);
}

void GradSync::zero_grad() {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mutex);
  for (Bucket& b : s.buckets) {
    if (b.gather)
      b.zero_after_gather = true;  // zeroed once its parameters are out
    else
      b.flat.zero_();
  }
  for (Param& p : s.params) s.ensure_view(p);
}

void GradSync::discard_step() {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mutex);
  s.wait_all();
  s.reset_step();
}

GradSync::NoSync::NoSync(GradSync& owner) : owner_(owner) {
  std::lock_guard<std::mutex> lock(owner_.state_->mutex);
  previous_ = owner_.state_->no_sync;
  owner_.state_->no_sync = true;
}

GradSync::NoSync::~NoSync() {
  std::lock_guard<std::mutex> lock(owner_.state_->mutex);
  owner_.state_->no_sync = previous_;
}

void GradSync::average_buffers() {
  State& s = *state_;
  NoGradGuard no_grad;
  std::vector<WorkPtr> work;
  for (auto& [name, t] : s.buffers)
    work.push_back(is_floating(t.dtype()) ? s.comm->all_reduce_async(t, ReduceOp::Average)
                                          : s.comm->broadcast_async(t, 0));
  for (auto& w : work) w->wait();
}

const std::vector<ShardPiece>& GradSync::shard_pieces() const { return state_->pieces; }
int GradSync::zero_stage() const { return state_->options.zero_stage; }

std::vector<std::pair<std::string, Tensor>> GradSync::parameters() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& p : state_->params) out.emplace_back(p.name, p.tensor);
  return out;
}

void GradSync::gather_parameters(const std::vector<Tensor>& values) {
  State& s = *state_;
  RT_CHECK(s.options.zero_stage == 1, "GradSync::gather_parameters needs zero_stage 1");
  RT_CHECK(values.size() == s.pieces.size(), "GradSync::gather_parameters: ", values.size(), " values for ",
           s.pieces.size(), " shard pieces");
  std::lock_guard<std::mutex> lock(s.mutex);
  s.finish_gathers();
  // Overlap with the next forward only when the last one reached every parameter through a layer's hook.
  for (Param& p : s.params) {
    if (!p.used) s.overlap_allowed = false;
    p.used = false;
  }
  s.gather_overlapped = s.overlap_allowed;
  // The gradient buckets carry the all-gather: the gradients are spent once the shards are updated, and a
  // buffer of its own would cost another copy of the model (the optimizer state ZeRO saves is 1-2 copies).
  NoGradGuard no_grad;
  for (size_t i = 0; i < s.pieces.size(); ++i) {
    const ShardPiece& p = s.pieces[i];
    s.buckets[p.bucket].flat.slice(p.bucket_offset, p.bucket_offset + (p.end - p.begin)).copy_(values[i].flatten());
  }
  // Buckets hold parameters in reverse registration order: the last bucket holds the first layers, which
  // the forward needs first. Every rank launches in this same order.
  for (int k = static_cast<int>(s.buckets.size()) - 1; k >= 0; --k)
    s.buckets[k].gather = s.comm->all_gather_shard_async(s.buckets[k].flat);
  if (!s.gather_overlapped) s.finish_gathers();
}

void GradSync::wait_parameters() {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mutex);
  s.finish_gathers();
}

bool GradSync::gather_overlapped() const { return state_->gather_overlapped; }

const std::vector<BucketInfo>& GradSync::buckets() const { return state_->infos; }
const Communicator& GradSync::communicator() const { return *state_->comm; }
double GradSync::last_wait_seconds() const { return state_->last_wait; }
int GradSync::last_buckets_launched_early() const { return state_->launched_early; }
const std::vector<GradSync::BucketTiming>& GradSync::last_bucket_timings() const { return state_->timings; }

}  // namespace ringtrain::comm
