# The CUDA backend (src/backend/cuda). With nvcc, its kernels are compiled ahead of time for each
# target in ANVIL_CUDA_TARGETS and the CUDA runtime is linked statically, so the one binary runs
# on machines with or without an NVIDIA driver. Without nvcc, unavailable.cpp stands in and every
# CUDA entry point reports that this build has no CUDA.
set(anvil_cuda_enabled OFF)
if(NOT ANVIL_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(anvil_cuda_enabled ON)
  elseif(ANVIL_CUDA STREQUAL "ON")
    message(FATAL_ERROR "ANVIL_CUDA=ON but no CUDA compiler was found (set CMAKE_CUDA_COMPILER)")
  endif()
endif()

if(anvil_cuda_enabled)
  # Targets are passed as explicit -gencode flags: the arch-specific "a" targets (sm_90a for
  # wgmma, sm_100a, sm_120a) are spelled exactly, and CMake adds nothing of its own.
  set(CMAKE_CUDA_ARCHITECTURES OFF)
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  # CMake 3.25 knows no C++20 flag for nvcc; the .cu files need only C++17.
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  set(gencode_flags)
  set(target_names)
  foreach(target IN LISTS ANVIL_CUDA_TARGETS)
    if(target MATCHES "^sm_([0-9]+a?)$")
      list(APPEND gencode_flags "-gencode=arch=compute_${CMAKE_MATCH_1},code=sm_${CMAKE_MATCH_1}")
    elseif(target MATCHES "^compute_([0-9]+a?)$")
      list(APPEND gencode_flags "-gencode=arch=compute_${CMAKE_MATCH_1},code=compute_${CMAKE_MATCH_1}")
    else()
      message(FATAL_ERROR "ANVIL_CUDA_TARGETS: '${target}' is neither sm_XX nor compute_XX")
    endif()
    list(APPEND target_names "\"${target}\"")
  endforeach()
  list(JOIN target_names "," target_list)
  file(GLOB cuda_sources CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/backend/cuda/*.cu
       ${CMAKE_SOURCE_DIR}/src/backend/cuda/*.cpp)
  list(FILTER cuda_sources EXCLUDE REGEX "unavailable\\.cpp$")
  add_library(anvil_cuda STATIC ${cuda_sources})
  target_include_directories(anvil_cuda PUBLIC ${CMAKE_SOURCE_DIR}/src)
  target_compile_definitions(anvil_cuda PUBLIC ANVIL_WITH_CUDA=1)
  # Only runtime.cpp (host C++) reports the targets; nvcc's command line mangles quoted values.
  set_source_files_properties(${CMAKE_SOURCE_DIR}/src/backend/cuda/runtime.cpp PROPERTIES
      COMPILE_DEFINITIONS "ANVIL_CUDA_TARGET_LIST=${target_list}")
  target_compile_options(anvil_cuda PRIVATE
      $<$<COMPILE_LANGUAGE:CUDA>:${gencode_flags} --expt-relaxed-constexpr -Xcompiler=-Wall,-Wextra,-Wno-unused-parameter -Werror=all-warnings>
      $<$<COMPILE_LANGUAGE:CXX>:${ANVIL_WARNINGS}>)
  target_link_libraries(anvil_cuda PUBLIC anvil_core CUDA::cudart_static ${CMAKE_DL_LIBS})
  # Measurement builds only: timestamps inside batch 1's MoE kernels (backend/cuda/phase_probe.cuh).
  option(ANVIL_PHASE_PROBE "Stamp and print the phases of batch 1's MoE kernels (measurement only)" OFF)
  if(ANVIL_PHASE_PROBE)
    target_compile_definitions(anvil_cuda PRIVATE ANVIL_PHASE_PROBE=1)
  endif()
  # cuBLASLt is opened at run time (backend/cuda/cublaslt.cpp); only its header is needed here.
  find_file(anvil_cublaslt_header cublasLt.h PATHS ${CUDAToolkit_INCLUDE_DIRS} NO_DEFAULT_PATH)
  if(anvil_cublaslt_header)
    set_property(SOURCE ${CMAKE_SOURCE_DIR}/src/backend/cuda/cublaslt.cpp APPEND PROPERTY
        COMPILE_DEFINITIONS ANVIL_HAVE_CUBLASLT_H=1)
  else()
    message(STATUS "anvil: no cublasLt.h in the CUDA toolkit; dense GEMMs use anvil's own kernels only")
  endif()
  message(STATUS "anvil: CUDA backend ON, targets: ${ANVIL_CUDA_TARGETS}")
else()
  add_library(anvil_cuda STATIC ${CMAKE_SOURCE_DIR}/src/backend/cuda/unavailable.cpp)
  target_include_directories(anvil_cuda PUBLIC ${CMAKE_SOURCE_DIR}/src)
  target_compile_options(anvil_cuda PRIVATE ${ANVIL_WARNINGS})
  target_link_libraries(anvil_cuda PUBLIC anvil_core)
  message(STATUS "anvil: CUDA backend OFF (CPU only)")
endif()
