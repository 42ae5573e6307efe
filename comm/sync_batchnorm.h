// comm/sync_batchnorm.h: SyncBatchNorm. convert_sync_batchnorm turns every BatchNorm2d of a model into a
// synchronised one: in training its batch statistics (and, in backward, their gradients) are summed over
// every rank of `comm`, so N ranks with batch B normalise exactly as 1 rank with batch N*B would.
// Use a communicator of its own (not GradSync's): its all-reduces then do not queue behind gradient
// buckets during backward.
#pragma once

#include <memory>

#include "comm/communicator.h"
#include "layers/batchnorm.h"

namespace ringtrain::comm {

// A differentiable sum over the ranks of `comm`: forward all-reduces the tensor, backward all-reduces
// the incoming gradient.
Tensor all_reduce_sum(const CommunicatorPtr& comm, const Tensor& x);

std::shared_ptr<CrossReplicaSum> make_cross_replica_sum(CommunicatorPtr comm);

// Returns how many BatchNorm2d layers were converted.
int convert_sync_batchnorm(Module& model, CommunicatorPtr comm);

}  // namespace ringtrain::comm
