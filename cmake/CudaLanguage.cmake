# The CUDA language for the device kernels (src/device/*.cu), with CUDAToolkit already found:
# nvcc from the toolkit, C++20, sm_90 (H100 / H200) unless CMAKE_CUDA_ARCHITECTURES says.
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
