// A training loop in which one rank fails mid-training (tests/comm/expect_abort.sh runs it under mpirun
// with a deadline): `fault_rank throw` makes rank 1 throw at step 3 while the others are waiting for it
// in the gradient all-reduce; `fault_rank exit` makes it vanish (_Exit) as a crash would. Either way the
// whole job must end promptly with a non-zero status, and `throw` must print the reason once, naming
// the rank.
#include <cstdlib>
#include <string>

#include "comm/grad_sync.h"
#include "comm/world.h"
#include "core/check.h"
#include "core/ops.h"
#include "layers/linear.h"
#include "optim/optimizer.h"

using namespace ringtrain;

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "throw";
  return comm::run_main(argc, argv, [&](comm::World& world) {
    manual_seed(1);
    Linear model(64, 64);
    comm::GradSync sync(model, comm::make_communicator(comm::Backend::Ring, world.comm()));
    Sgd opt(as_named(model.named_parameters()), SgdOptions{});
    const Tensor x = Tensor::normal(Shape{32, 64}, 0, 1, 2);
    for (int step = 0; step < 1000000; ++step) {
      sync.zero_grad();
      sum(model(x)).backward();
      if (world.rank() == 1 && step == 3) {
        if (mode == "exit") std::_Exit(3);
        RT_THROW("injected failure at step ", step);
      }
      sync.finish();
      opt.step(1e-6);
    }
    return 0;
  });
}
