# The CUDA backend and NCCL communicator: included by the top-level CMakeLists.txt when
# MPAR_ENABLE_CUDA is ON (the top level has already found CUDAToolkit and MPAR_NCCL_LIBRARY).
#
# mpar::cuda is an INTERFACE target like mpar::mpar: the headers stay header-only, and code that
# includes mpar/cuda.hpp is compiled by nvcc (its kernels are templates in headers).
find_package(CUDAToolkit REQUIRED)
if(NOT MPAR_NCCL_LIBRARY)
  find_library(MPAR_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
endif()
if(NOT MPAR_NCCL_LIBRARY)
  message(FATAL_ERROR "MPAR_ENABLE_CUDA is ON but libnccl was not found; set MPAR_NCCL_LIBRARY or turn MPAR_ENABLE_CUDA OFF")
endif()
find_path(MPAR_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})

add_library(mpar_cuda INTERFACE)
add_library(mpar::cuda ALIAS mpar_cuda)
set_target_properties(mpar_cuda PROPERTIES EXPORT_NAME cuda)
target_link_libraries(mpar_cuda INTERFACE mpar CUDA::cudart CUDA::cublas CUDA::cublasLt ${MPAR_NCCL_LIBRARY})
if(MPAR_NCCL_INCLUDE_DIR)
  target_include_directories(mpar_cuda INTERFACE $<BUILD_INTERFACE:${MPAR_NCCL_INCLUDE_DIR}>)
endif()
target_compile_definitions(mpar_cuda INTERFACE MPAR_HAVE_CUDA)
# cuDNN >= 9.13 (the SDPA backend operations): gpu::sdpa_forward/backward use its fused attention and
# fall back to mpar's flash kernel without it. Detected, not required; MPAR_ENABLE_CUDNN=OFF skips it.
option(MPAR_ENABLE_CUDNN "Use cuDNN's fused attention when cuDNN >= 9.13 is found" ON)
if(MPAR_ENABLE_CUDNN)
  find_path(MPAR_CUDNN_INCLUDE_DIR cudnn_version.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  find_library(MPAR_CUDNN_LIBRARY cudnn HINTS ${CUDAToolkit_LIBRARY_DIR})
  set(_mpar_cudnn_version "")
  if(MPAR_CUDNN_INCLUDE_DIR AND EXISTS ${MPAR_CUDNN_INCLUDE_DIR}/cudnn_version.h)
    file(STRINGS ${MPAR_CUDNN_INCLUDE_DIR}/cudnn_version.h _mpar_cudnn_defs REGEX "^#define CUDNN_(MAJOR|MINOR) ")
    string(REGEX REPLACE ".*CUDNN_MAJOR ([0-9]+).*" "\\1" _mpar_cudnn_major "${_mpar_cudnn_defs}")
    string(REGEX REPLACE ".*CUDNN_MINOR ([0-9]+).*" "\\1" _mpar_cudnn_minor "${_mpar_cudnn_defs}")
    set(_mpar_cudnn_version "${_mpar_cudnn_major}.${_mpar_cudnn_minor}")
  endif()
  if(MPAR_CUDNN_LIBRARY AND _mpar_cudnn_version VERSION_GREATER_EQUAL 9.13)
    target_include_directories(mpar_cuda INTERFACE $<BUILD_INTERFACE:${MPAR_CUDNN_INCLUDE_DIR}>)
    target_link_libraries(mpar_cuda INTERFACE ${MPAR_CUDNN_LIBRARY})
    target_compile_definitions(mpar_cuda INTERFACE MPAR_HAVE_CUDNN)
    message(STATUS "mpar: cuDNN ${_mpar_cudnn_version} found: fused attention through cuDNN's SDPA")
  else()
    message(STATUS "mpar: cuDNN >= 9.13 not found (found: '${_mpar_cudnn_version}'); attention uses mpar's flash kernel")
  endif()
endif()
# The kernels call constexpr host helpers (CounterRng, bf16 conversions) from device code.
target_compile_options(mpar_cuda INTERFACE $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr>)
install(TARGETS mpar_cuda EXPORT mparTargets)

# nvcc is needed only for our own programs (tests, examples, benchmarks); a consumer of the
# installed package enables CUDA in its own project.
if(MPAR_BUILD_TESTS OR MPAR_BUILD_EXAMPLES OR MPAR_BUILD_BENCHMARKS)
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES AND MPAR_CUDA_LOCAL_ARCHITECTURES)
    # The test suite's tree (preset default): its programs run here or nowhere. Without a GPU the build only
    # checks that every .cu compiles, which one architecture does (no code depends on __CUDA_ARCH__): each
    # more costs nvcc a device pass per file (tests/cuda/graph_test.cu: 49.9 s user for 80;90, 35.7 s for 90).
    find_program(MPAR_NVIDIA_SMI nvidia-smi)
    set(_mpar_caps "")
    if(MPAR_NVIDIA_SMI)
      execute_process(COMMAND ${MPAR_NVIDIA_SMI} --query-gpu=compute_cap --format=csv,noheader
                      OUTPUT_VARIABLE _mpar_caps RESULT_VARIABLE _mpar_smi_rc ERROR_QUIET)
      if(NOT _mpar_smi_rc EQUAL 0)
        set(_mpar_caps "")
      endif()
    endif()
    string(REGEX MATCHALL "[0-9]+\\.[0-9]+" _mpar_caps "${_mpar_caps}")
    list(TRANSFORM _mpar_caps REPLACE "\\." "")
    list(REMOVE_DUPLICATES _mpar_caps)
    if(_mpar_caps)
      set(CMAKE_CUDA_ARCHITECTURES ${_mpar_caps})
    else()
      set(CMAKE_CUDA_ARCHITECTURES 90)  # the GPU bundle's (scripts/gpu-check.sh --bundle)
    endif()
    message(STATUS "mpar: CUDA architectures ${CMAKE_CUDA_ARCHITECTURES} (MPAR_CUDA_LOCAL_ARCHITECTURES)")
  endif()
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    # A100 and H100/H200: SASS for both plus PTX for newer devices.
    set(CMAKE_CUDA_ARCHITECTURES 80 90)
  endif()
  if(NOT DEFINED CMAKE_CUDA_COMPILER AND EXISTS ${CUDAToolkit_BIN_DIR}/nvcc)
    set(CMAKE_CUDA_COMPILER ${CUDAToolkit_BIN_DIR}/nvcc)
  endif()
  if(NOT DEFINED CMAKE_CUDA_HOST_COMPILER)
    set(CMAKE_CUDA_HOST_COMPILER ${CMAKE_CXX_COMPILER})
  endif()
  enable_language(CUDA)
  # CMake before 3.26 does not know nvcc's C++20 flag, though nvcc >= 12 supports it.
  if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION AND CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.0)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_COMPILE_FEATURES cuda_std_20)
    list(APPEND CMAKE_CUDA_COMPILE_FEATURES cuda_std_20)
  endif()
  set(CMAKE_CUDA_STANDARD 20)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  set(CMAKE_CUDA_EXTENSIONS OFF)
  # nvcc-compiled programs get the same warnings as the C++ ones, passed to the host compiler.
  add_library(mpar_cuda_warnings INTERFACE)
  # nvcc's own front end warns (#186) about `k < I` loops instantiated with I = 0 in generic
  # templates; g++ accepts them silently and they are correct, so that one diagnostic is off.
  target_compile_options(mpar_cuda_warnings INTERFACE
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra,-Wno-missing-field-initializers --diag-suppress=186>
    # The host compiler's false -Wrestrict positives in std::string (GCC PR 105329), as for C++.
    "$<$<AND:$<COMPILE_LANGUAGE:CUDA>,$<CXX_COMPILER_ID:GNU>,$<VERSION_LESS:$<CXX_COMPILER_VERSION>,13>>:-Xcompiler=-Wno-restrict>")
endif()
