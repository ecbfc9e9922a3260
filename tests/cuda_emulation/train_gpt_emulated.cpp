// train_gpt's CUDA part compiled by g++ against the emulated CUDA runtime (MPAR_CUDA_EMULATION): the same source as
// the nvcc build's, so `train_gpt --backend cuda` (thread ranks over gpu::DeviceCommunicator) runs on the CPU in CI.
// A test program only, built by the cuda-emulation preset; never a backend offered to users.
#include "../../examples/train_gpt/train_cuda.cu"
