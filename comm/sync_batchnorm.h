// comm/sync_batchnorm.h: SyncBatchNorm. convert_sync_batchnorm turns every BatchNorm2d of a model into a
// synchronised one: in training each rank's per-channel (count, mean, M2) is all-gathered and merged
// exactly (core/ops.h sync_batch_norm), and in backward the sums of dy and dy * xhat are all-reduced, so N
// ranks with batch B normalise (and backpropagate) as 1 rank with batch N*B would, to float noise.
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

// The exchange over `comm` (all-gather forward, all-reduce backward).
std::shared_ptr<CrossReplicaSum> make_cross_replica_sum(CommunicatorPtr comm);

// Returns how many BatchNorm2d layers were converted.
int convert_sync_batchnorm(Module& model, CommunicatorPtr comm);
// Back to local statistics (e.g. before the communicator is closed); returns how many were synchronised.
int revert_sync_batchnorm(Module& model);

}  // namespace ringtrain::comm
