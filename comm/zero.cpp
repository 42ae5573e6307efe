// comm/zero.cpp: the sharded optimizer over GradSync's ZeRO-1 shards, and its canonical state.
#include "comm/zero.h"

#include <algorithm>
#include <map>
#include <set>
#include <span>
#include <sstream>

#include "comm/mpi_check.h"
#include "core/autograd.h"
#include "core/check.h"

namespace ringtrain::comm {

using State = std::vector<std::pair<std::string, Tensor>>;

ZeroOptimizer::ZeroOptimizer(GradSync& sync, const Factory& make)
    : Optimizer(as_named(sync.parameters()), 0.0, DecayPolicy::All), sync_(sync) {
  RT_CHECK(sync.zero_stage() == 1, "ZeroOptimizer needs a GradSync with zero_stage 1");
  const auto params = sync.parameters();
  std::vector<NamedParameter> pieces;
  NoGradGuard no_grad;
  for (const ShardPiece& p : sync.shard_pieces()) {
    // A view of the piece, so the update lands in the parameter itself: no copy of the shard to keep (on
    // one rank it would be a second model), and weights loaded into the model are what the next step sees.
    const Tensor& full = params[static_cast<size_t>(p.param)].second;
    Tensor v = full.detach().flatten().slice(p.begin, p.end);
    v.set_requires_grad(true);
    v.set_grad(p.grad);
    values_.push_back(v);
    pieces.push_back({p.name, v});
  }
  inner_ = make(std::move(pieces));
  RT_CHECK(inner_, "ZeroOptimizer: the factory made no optimizer");
  MPI_CHECK(MPI_Comm_dup(sync.communicator().mpi_comm(), &comm_));
  MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
}

ZeroOptimizer::~ZeroOptimizer() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
}

void ZeroOptimizer::step(double lr) {
  sync_.wait_parameters();  // the pieces are views of the parameters (a no-op after a forward: its layers waited)
  inner_->step(lr);
  ++steps_;
  sync_.gather_parameters(values_);
}

void ZeroOptimizer::max(std::span<uint64_t> values) const { all_reduce(comm_, values, HostOp::Max); }
void ZeroOptimizer::sum(std::span<uint64_t> values) const { all_reduce(comm_, values, HostOp::Sum); }

int64_t ZeroOptimizer::state_bytes() const { return inner_->state_bytes(); }

namespace {

// The slots of a piece's state: "<name>.<slot>" entries of the inner state, by parameter name.
std::map<std::string, std::map<std::string, Tensor>> by_parameter(const State& state,
                                                                  const std::vector<ShardPiece>& pieces) {
  std::map<std::string, std::map<std::string, Tensor>> out;
  for (const ShardPiece& p : pieces) out[p.name];
  for (const auto& [key, t] : state)
    for (const ShardPiece& p : pieces)
      if (key.size() > p.name.size() + 1 && key.compare(0, p.name.size(), p.name) == 0 && key[p.name.size()] == '.')
        out[p.name][key.substr(p.name.size() + 1)] = t;
  return out;
}

}  // namespace

State ZeroOptimizer::state() const {
  const State mine = inner_->state();
  const auto& pieces = sync_.shard_pieces();
  const auto slots = by_parameter(mine, pieces);
  int rank = 0, size = 1;
  MPI_CHECK(MPI_Comm_rank(comm_, &rank));
  MPI_CHECK(MPI_Comm_size(comm_, &size));
  // Every slot name any rank has, with whether it is a tensor (piece-shaped) or a scalar.
  std::set<std::string> names;
  for (const auto& [param, s] : slots)
    for (const auto& [slot, t] : s) names.insert(slot + (t.ndim() == 0 ? ":s" : ":t"));
  std::string text;
  for (const auto& n : names) text += n + "\n";
  const std::vector<std::string> all = all_gather_strings(comm_, text);
  std::set<std::string> every;
  for (const auto& t : all) {
    std::istringstream in(t);
    for (std::string line; std::getline(in, line);) every.insert(line);
  }
  State out;
  for (const auto& [key, t] : mine)
    if (key == "step") out.emplace_back(key, t);
  std::vector<const ShardPiece*> piece_of(params_.size(), nullptr);  // at most one piece per parameter
  for (const ShardPiece& p : pieces) piece_of[static_cast<size_t>(p.param)] = &p;
  for (size_t i = 0; i < params_.size(); ++i) {
    const std::string& name = params_[i].name;
    const Tensor& full = params_[i].tensor;
    const ShardPiece* piece = piece_of[i];
    // Where this rank's piece lies in the parameter: the same for every slot.
    const int64_t es = dtype_size(full.dtype());
    const int count = static_cast<int>(piece ? (piece->end - piece->begin) * es : 0);
    const int offset = static_cast<int>(piece ? piece->begin * es : 0);
    std::vector<int> counts(static_cast<size_t>(size)), offsets(static_cast<size_t>(size));
    MPI_CHECK(MPI_Gather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, comm_));
    MPI_CHECK(MPI_Gather(&offset, 1, MPI_INT, offsets.data(), 1, MPI_INT, 0, comm_));
    for (const std::string& entry : every) {
      const std::string slot = entry.substr(0, entry.size() - 2);
      const bool scalar = entry.back() == 's';
      Tensor here;
      if (piece) {
        auto s = slots.find(name);
        if (s != slots.end()) {
          auto it = s->second.find(slot);
          if (it != s->second.end()) here = it->second;
        }
      }
      // A slot is kept when every rank holding a piece of the parameter has it (momentum appears at the
      // first step, on every piece at once).
      int64_t tally[2] = {piece && !here.defined() ? 1 : 0, piece ? 1 : 0};  // ranks missing it, ranks with a piece
      all_reduce(comm_, std::span<int64_t>(tally, 2));
      if (tally[0] > 0 || tally[1] == 0) continue;
      if (scalar) {
        const double value = all_reduce(comm_, here.defined() ? here.item() : -1e300, HostOp::Max);
        if (rank == 0) out.emplace_back(name + "." + slot, Tensor::scalar(value, DType::I64));
        continue;
      }
      // The pieces of a parameter partition it: gather them into place on rank 0.
      Tensor whole;
      if (rank == 0) whole = Tensor::zeros(full.shape(), full.dtype());
      Tensor send = here.defined() ? (here.device().is_cpu() ? here : here.to(Device::cpu())) : Tensor();
      MPI_CHECK(MPI_Gatherv(send.defined() ? send.data_ptr() : nullptr, count, MPI_BYTE,
                            rank == 0 ? whole.data_ptr() : nullptr, counts.data(), offsets.data(), MPI_BYTE, 0, comm_));
      if (rank == 0) out.emplace_back(name + "." + slot, full.device().is_cpu() ? whole : whole.to(full.device()));
    }
  }
  return out;
}

void ZeroOptimizer::load_state(const State& state) {
  std::map<std::string, Tensor> index;
  for (const auto& [key, t] : state) index[key] = t;
  State mine;
  if (auto it = index.find("step"); it != index.end()) mine.emplace_back("step", it->second);
  for (const ShardPiece& p : sync_.shard_pieces()) {
    const std::string prefix = p.name + ".";
    for (auto it = index.lower_bound(prefix); it != index.end() && it->first.compare(0, prefix.size(), prefix) == 0;
         ++it) {
      const Tensor& t = it->second;
      if (t.ndim() == 0) {
        mine.emplace_back(it->first, t);
        continue;
      }
      RT_CHECK(t.numel() >= p.end, "optimizer state: entry '", it->first, "' has ", t.numel(),
               " elements, the parameter's shard needs ", p.end);
      mine.emplace_back(it->first, t.flatten().slice(p.begin, p.end).clone());
    }
  }
  inner_->load_state(mine);
  steps_ = inner_->steps();
}

}  // namespace ringtrain::comm
