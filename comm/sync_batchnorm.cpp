// comm/sync_batchnorm.cpp: the differentiable cross-rank sum and the model conversion.
#include "comm/sync_batchnorm.h"

#include "core/autograd.h"
#include "core/check.h"

namespace ringtrain::comm {

Tensor all_reduce_sum(const CommunicatorPtr& comm, const Tensor& x) {
  Tensor out = x.detach().clone();
  comm->all_reduce(out, ReduceOp::Sum);
  if (!needs_grad({&x})) return out;
  return record("all_reduce_sum", {&x}, out, [comm](const Tensor& grad) {
    Tensor g = grad.detach().clone();
    comm->all_reduce(g, ReduceOp::Sum);
    return std::vector<Tensor>{g};
  });
}

namespace {
class CommExchange final : public CrossReplicaSum {
 public:
  explicit CommExchange(CommunicatorPtr comm) : comm_(std::move(comm)) {}
  Tensor all_gather(const Tensor& local) override {
    Tensor all = Tensor::empty(Shape{local.numel() * comm_->size()}, local.dtype(), local.device());
    comm_->all_gather(local, all);
    return all;
  }
  void all_reduce_sum(Tensor& t) override { comm_->all_reduce(t, ReduceOp::Sum); }

 private:
  CommunicatorPtr comm_;
};

int convert(Module& m, const std::shared_ptr<CrossReplicaSum>& sum) {
  int n = 0;
  if (auto* bn = dynamic_cast<BatchNorm2d*>(&m)) {
    bn->set_cross_replica(sum);
    ++n;
  }
  for (auto& [name, child] : m.named_children()) n += convert(*child, sum);
  return n;
}
}  // namespace

std::shared_ptr<CrossReplicaSum> make_cross_replica_sum(CommunicatorPtr comm) {
  RT_CHECK(comm, "make_cross_replica_sum: no communicator");
  return std::make_shared<CommExchange>(std::move(comm));
}

int convert_sync_batchnorm(Module& model, CommunicatorPtr comm) {
  return convert(model, make_cross_replica_sum(std::move(comm)));
}

int revert_sync_batchnorm(Module& model) {
  int n = 0;
  if (auto* bn = dynamic_cast<BatchNorm2d*>(&model)) {
    n += bn->synchronized() ? 1 : 0;
    bn->set_cross_replica(nullptr);
  }
  for (auto& [name, child] : model.named_children()) n += revert_sync_batchnorm(*child);
  return n;
}

}  // namespace ringtrain::comm
