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
    include(${CMAKE_CURRENT_LIST_DIR}/CudaLanguage.cmake)
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
