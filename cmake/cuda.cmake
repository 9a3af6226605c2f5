# The optional CUDA backend (model/ops/cuda) and NCCL communicator (parallel/comm/nccl_communicator.*).
# GPT_CUDA=AUTO builds them whenever nvcc is found (on PATH or under /usr/local/cuda/bin), ON insists on
# it, OFF leaves them out. The kernels go into a static library gptcuda that gpt_model links, and gpt_model
# gets GPT_HAVE_CUDA (make_backend("cuda") then creates a CudaBackend) and, when nccl.h and libnccl are
# found next to the toolkit, gpt_comm gets GPT_HAVE_NCCL (the NCCL communicator is compiled in). The binary stays usable
# without a GPU: the CPU backend is untouched and `backend: cuda` fails with a clear message at start-up.
# Included from the top-level CMakeLists.txt after the folders' libraries are defined.

set(GPT_HAVE_CUDA OFF)
set(GPT_HAVE_NCCL OFF)
string(TOUPPER "${GPT_CUDA}" _gpt_cuda_mode)
if(NOT _gpt_cuda_mode MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "GPT_CUDA must be AUTO, ON or OFF (got '${GPT_CUDA}')")
endif()

if(NOT _gpt_cuda_mode STREQUAL "OFF")
  # nvcc is often not on PATH; the toolkit's standard location is the fallback.
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
    find_program(GPT_NVCC nvcc HINTS ENV CUDA_HOME ENV CUDA_PATH PATH_SUFFIXES bin PATHS /usr/local/cuda/bin)
    if(GPT_NVCC)
      set(CMAKE_CUDA_COMPILER "${GPT_NVCC}" CACHE FILEPATH "CUDA compiler")
    endif()
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(GPT_HAVE_CUDA ON)
  elseif(_gpt_cuda_mode STREQUAL "ON")
    message(FATAL_ERROR "GPT_CUDA=ON but no CUDA compiler (nvcc) was found; install the CUDA toolkit, put nvcc "
                        "on PATH or pass -DCMAKE_CUDA_COMPILER=/path/to/nvcc")
  else()
    message(STATUS "gpt-train: nvcc not found, building without the CUDA backend")
  endif()
endif()

if(GPT_HAVE_CUDA)
  # Ampere (A100) and Hopper (H100/H200); each gets real machine code.
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES "80;90")
  endif()
  enable_language(CUDA)
  set(CMAKE_CUDA_STANDARD 17)  # the kernels need no C++20; CMake 3.25 knows no nvcc flag for it
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  find_package(CUDAToolkit REQUIRED)

  file(GLOB GPT_CUDA_SOURCES CONFIGURE_DEPENDS
    ${CMAKE_SOURCE_DIR}/model/ops/cuda/*.cu
    ${CMAKE_SOURCE_DIR}/model/ops/cuda/*.cpp)
  add_library(gptcuda STATIC ${GPT_CUDA_SOURCES})
  target_include_directories(gptcuda PUBLIC ${CMAKE_SOURCE_DIR})
  target_compile_options(gptcuda PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:${GPT_WARNINGS}>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall>)
  target_link_libraries(gptcuda PUBLIC CUDA::cudart CUDA::cublas CUDA::cublasLt)
  target_link_libraries(gptcuda PRIVATE spdlog::spdlog)
  # cuDNN 9's graph API (cudnn_graph.h) for the fused attention (model/ops/cuda/cudnn_attention.cpp);
  # without it the CUDA backend runs its unfused attention only.
  find_path(GPT_CUDNN_INCLUDE_DIR cudnn_graph.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ENV CUDNN_HOME PATH_SUFFIXES include)
  find_library(GPT_CUDNN_LIBRARY cudnn HINTS ${CUDAToolkit_LIBRARY_DIR} ENV CUDNN_HOME PATH_SUFFIXES lib lib64)
  if(GPT_CUDNN_INCLUDE_DIR AND GPT_CUDNN_LIBRARY)
    target_include_directories(gptcuda PRIVATE ${GPT_CUDNN_INCLUDE_DIR})
    target_link_libraries(gptcuda PUBLIC ${GPT_CUDNN_LIBRARY})
    target_compile_definitions(gptcuda PRIVATE GPT_HAVE_CUDNN)
    message(STATUS "gpt-train: cuDNN fused attention (${GPT_CUDNN_LIBRARY})")
  elseif(_gpt_cuda_mode STREQUAL "ON")
    message(WARNING "gpt-train: cuDNN 9 (cudnn_graph.h, libcudnn) not found next to the CUDA toolkit: the CUDA "
                    "backend will run its unfused attention only (set CUDNN_HOME to point at cuDNN)")
  else()
    message(STATUS "gpt-train: cuDNN not found: CUDA attention runs unfused")
  endif()
  # gptcuda uses Tensor and Backend from gpt_model and gpt_model's factory uses gptcuda: a cycle of static
  # libraries, which CMake resolves by repeating them on the link line. LINK_ONLY keeps gpt_model's compile
  # flags (OpenMP) away from nvcc.
  target_link_libraries(gptcuda PRIVATE $<LINK_ONLY:gpt_model>)
  target_link_libraries(gpt_model PUBLIC gptcuda)
  target_compile_definitions(gpt_model PUBLIC GPT_HAVE_CUDA)

  find_path(GPT_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ENV NCCL_HOME PATH_SUFFIXES include)
  find_library(GPT_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} ENV NCCL_HOME PATH_SUFFIXES lib lib64)
  if(GPT_NCCL_INCLUDE_DIR AND GPT_NCCL_LIBRARY)
    set(GPT_HAVE_NCCL ON)
    target_include_directories(gpt_comm PUBLIC ${GPT_NCCL_INCLUDE_DIR})
    target_link_libraries(gpt_comm PUBLIC ${GPT_NCCL_LIBRARY})
    target_compile_definitions(gpt_comm PUBLIC GPT_HAVE_NCCL)
    message(STATUS "gpt-train: CUDA backend for ${CMAKE_CUDA_ARCHITECTURES} with NCCL (${GPT_NCCL_LIBRARY})")
  else()
    message(STATUS "gpt-train: CUDA backend for ${CMAKE_CUDA_ARCHITECTURES}, NCCL not found (multi-GPU off)")
  endif()
endif()
