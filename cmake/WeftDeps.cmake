# Locates weft's few dependencies: the CUDA toolkit and NCCL must be installed;
# nvml.h and the CUTLASS headers are found where they are installed, else in
# .deps/, where scripts/setup.sh unpacks them from pip wheels.
find_package(Threads REQUIRED)

set(WEFT_DEPS_DIR "${CMAKE_CURRENT_SOURCE_DIR}/.deps" CACHE PATH "where scripts/setup.sh puts fetched dependencies")

# ---- NCCL: NCCL_ROOT, the CUDA toolkit, the system (libnccl-dev), or the pip wheel nvidia-nccl-cu13 ----
include(WeftFindNccl)
weft_find_nccl(WEFT_NCCL_ERROR)
if(WEFT_NCCL_ERROR)
  message(FATAL_ERROR "${WEFT_NCCL_ERROR}")
endif()
message(STATUS "weft: NCCL ${WEFT_NCCL_LIBRARY} (headers ${WEFT_NCCL_INCLUDE_DIR})")

# ---- nvml.h (header only: libnvidia-ml is opened at run time) ----
# NVML_INCLUDE_DIR (CMake or environment variable), the CUDA toolkit (CUDA_HOME,
# CUDA_PATH, the toolkit CMake found), the system, then .deps/ (pip nvidia-nvml-dev).
find_path(WEFT_NVML_INCLUDE_DIR nvml.h
  HINTS ${NVML_INCLUDE_DIR} $ENV{NVML_INCLUDE_DIR} $ENV{CUDA_HOME}/include $ENV{CUDA_PATH}/include
        ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include /usr/include /usr/local/include
        ${WEFT_DEPS_DIR}/nvml/include ${WEFT_DEPS_DIR}/nvidia/cu13/include
  DOC "directory holding nvml.h")
if(NOT WEFT_NVML_INCLUDE_DIR)
  message(FATAL_ERROR "nvml.h not found (in NVML_INCLUDE_DIR, CUDA_HOME/include, the CUDA toolkit, "
    "/usr/include or ${WEFT_DEPS_DIR}). Run scripts/setup.sh (it unpacks the pip wheel nvidia-nvml-dev "
    "into .deps/), or set NVML_INCLUDE_DIR to the directory holding nvml.h.")
endif()

if(NOT SKBUILD)  # pip builds compile no tests
# ---- GoogleTest: installed package, else the Debian source tree, else .deps ----
find_package(GTest QUIET)
if(NOT GTest_FOUND)
  foreach(dir ${WEFT_DEPS_DIR}/googletest /usr/src/googletest)
    if(EXISTS ${dir}/CMakeLists.txt)
      set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
      set(BUILD_GMOCK OFF CACHE BOOL "" FORCE)
      add_subdirectory(${dir} ${CMAKE_BINARY_DIR}/googletest EXCLUDE_FROM_ALL)
      add_library(GTest::gtest ALIAS gtest)
      set(GTest_FOUND TRUE)
      break()
    endif()
  endforeach()
endif()
if(NOT GTest_FOUND)
  message(FATAL_ERROR "GoogleTest not found: apt install googletest (or run scripts/setup.sh).")
endif()
endif()

# ---- CUTLASS / CuTe headers: CUTLASS_ROOT, an installed CUTLASS, else .deps/ (pip nvidia-cutlass) ----
# CUTLASS_ROOT (CMake or environment variable) is a source checkout
# (include/, tools/util/include/) or an installed CUTLASS (include/ holds both).
# scripts/setup.sh looks in the same places before it fetches anything.
find_path(WEFT_CUTLASS_INCLUDE_DIR cutlass/gemm/collective/collective_builder.hpp
  HINTS ${CUTLASS_ROOT}/include $ENV{CUTLASS_ROOT}/include ${WEFT_DEPS_DIR}/cutlass/include
  DOC "directory holding cutlass/ and cute/")
find_path(WEFT_CUTLASS_UTIL_INCLUDE_DIR cutlass/util/packed_stride.hpp
  HINTS ${CUTLASS_ROOT}/tools/util/include $ENV{CUTLASS_ROOT}/tools/util/include
        ${CUTLASS_ROOT}/include $ENV{CUTLASS_ROOT}/include ${WEFT_DEPS_DIR}/cutlass/util/include
  DOC "directory holding cutlass/util/")
if(NOT WEFT_CUTLASS_INCLUDE_DIR OR NOT WEFT_CUTLASS_UTIL_INCLUDE_DIR)
  message(FATAL_ERROR "CUTLASS headers not found (cutlass/gemm/collective/collective_builder.hpp and "
    "cutlass/util/packed_stride.hpp). Run scripts/setup.sh (it unpacks the pip wheel nvidia-cutlass into .deps/), "
    "or set CUTLASS_ROOT to a CUTLASS 4.2 checkout or install.")
endif()
message(STATUS "weft: CUTLASS ${WEFT_CUTLASS_INCLUDE_DIR}")
