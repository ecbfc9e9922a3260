#pragma once
/**
 * @file `MPAR_HOST_DEVICE`: marks a function that host code and CUDA kernels both call, so that a value a
 * kernel computes (a parameter's initial value) has one definition shared with the host. Outside nvcc it
 * expands to nothing and the function is ordinary C++.
 */
#if defined(__CUDACC__)
#define MPAR_HOST_DEVICE __host__ __device__
#else
#define MPAR_HOST_DEVICE
#endif
