#pragma once
/** @file The error the emulated CUDA runtime throws where a GPU would misbehave silently, fault or hang. */
#include <stdexcept>

namespace mpar::gpu::emulation {

/**
 * @brief A kernel or launch broke a rule of the CUDA execution model: a barrier or warp collective not reached
 * by every thread it names, a bad launch configuration, a host pointer handed to a kernel, a write past the
 * end of a device allocation.
 */
class emulation_error : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

}  // namespace mpar::gpu::emulation
