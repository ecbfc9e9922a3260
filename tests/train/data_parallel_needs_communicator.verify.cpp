// DataParallel over something that is not a communicator (here a plain vector, a common slip when the
// data group is confused with a buffer).
// expect: (constraints not satisfied|satisfy|constraint)
// expect: communicator<Comm>
#include <mpar/comm/threads.hpp>
#include <mpar/parallel/data_parallel.hpp>
#include <vector>
using namespace mpar;
#ifdef MPAR_VERIFY_CONTROL
using Group = ThreadsCommunicator;
#else
using Group = std::vector<float>;
#endif
int main() {
  parallel::DataParallel<Group>* ddp = nullptr;
  ddp->finish();
}
