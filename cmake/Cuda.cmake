# MILES_CUDA=AUTO|ON|OFF: detect nvcc, cuBLAS and NCCL so that a CUDA backend can stand beside the CPU
# one. The CPU build never needs them. Sets MILES_HAVE_CUDA.
set(MILES_HAVE_CUDA OFF)
if(NOT MILES_CUDA STREQUAL "OFF")
  find_package(CUDAToolkit QUIET)
  find_library(MILES_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/lib/x86_64-linux-gnu)
  find_path(MILES_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/include)
  if(CUDAToolkit_FOUND AND CUDAToolkit_NVCC_EXECUTABLE AND TARGET CUDA::cublas
     AND MILES_NCCL_LIBRARY AND MILES_NCCL_INCLUDE_DIR)
    set(MILES_HAVE_CUDA ON)
    # The device kernels (src/device/*.cu). H100/H200 (sm_90) unless CMAKE_CUDA_ARCHITECTURES says.
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90)
    endif()
    set(CMAKE_CUDA_COMPILER ${CUDAToolkit_NVCC_EXECUTABLE})
    enable_language(CUDA)
    # CMake 3.25 predates nvcc's C++20 mode: name its flag so that the sources get -std=c++20.
    if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
      list(APPEND CMAKE_CUDA_COMPILE_FEATURES cuda_std_20)
    endif()
    set(CMAKE_CUDA_STANDARD 20)
    # /usr/include as -isystem breaks the C++ headers' #include_next <math.h> under nvcc.
    list(APPEND CMAKE_CUDA_IMPLICIT_INCLUDE_DIRECTORIES /usr/include)
    message(STATUS "miles: CUDA ${CUDAToolkit_VERSION} (nvcc ${CUDAToolkit_NVCC_EXECUTABLE}), "
                   "cuBLAS, NCCL ${MILES_NCCL_LIBRARY}")
  elseif(MILES_CUDA STREQUAL "ON")
    message(FATAL_ERROR "MILES_CUDA=ON but nvcc, cuBLAS or NCCL was not found "
                        "(CUDAToolkit_FOUND=${CUDAToolkit_FOUND}, NCCL=${MILES_NCCL_LIBRARY})")
  else()
    message(STATUS "miles: CUDA not found; CPU only")
  endif()
else()
  message(STATUS "miles: CUDA disabled (MILES_CUDA=OFF)")
endif()
