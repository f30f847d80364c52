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

# ---- NVSHMEM (optional): the heap backend for many nodes, docs/decisions/0057 ----
# WEFT_NVSHMEM=AUTO builds the backend where NVSHMEM is found, ON demands it
# (CI), OFF leaves it out. Found by cmake/WeftFindNvshmem.cmake (NVSHMEM_HOME,
# .deps-nvshmem/ from scripts/setup.sh, python3's nvidia-nvshmem-cu13 wheel, the system).
set(WEFT_NVSHMEM AUTO CACHE STRING "Build the NVSHMEM heap backend: AUTO (where NVSHMEM is found), ON or OFF")
set_property(CACHE WEFT_NVSHMEM PROPERTY STRINGS AUTO ON OFF)
set(WEFT_NVSHMEM_DEPS_DIR "${CMAKE_CURRENT_SOURCE_DIR}/.deps-nvshmem" CACHE PATH
    "where scripts/setup.sh unpacks NVSHMEM (outside .deps/, which travels to GPU machines)")
string(TOUPPER "${WEFT_NVSHMEM}" _weft_nvshmem)
if(NOT _weft_nvshmem MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "WEFT_NVSHMEM=${WEFT_NVSHMEM}: use AUTO, ON or OFF")
endif()
set(WEFT_HAVE_NVSHMEM OFF)
if(NOT _weft_nvshmem STREQUAL "OFF")
  include(WeftFindNvshmem)
  weft_find_nvshmem(WEFT_NVSHMEM_ERROR)
  if(NOT WEFT_NVSHMEM_ERROR)
    set(WEFT_HAVE_NVSHMEM ON)
    message(STATUS "weft: NVSHMEM ${WEFT_NVSHMEM_VERSION} heap backend (headers ${WEFT_NVSHMEM_INCLUDE_DIR}, "
                   "library ${WEFT_NVSHMEM_HOST_LIBRARY}, opened at run time)")
    if(WEFT_NVSHMEM_DEVICE_LIBRARY)
      message(STATUS "weft: weft::internode, NVSHMEM's device path (${WEFT_NVSHMEM_DEVICE_LIBRARY}, relocatable "
                     "device code in that target and its consumers only)")
    else()
      message(STATUS "weft: no weft::internode: ${WEFT_NVSHMEM_HOST_LIBRARY}'s directory holds no libnvshmem_device.a")
    endif()
  elseif(_weft_nvshmem STREQUAL "ON")
    message(FATAL_ERROR "WEFT_NVSHMEM=ON: ${WEFT_NVSHMEM_ERROR}")
  else()
    message(STATUS "weft: no NVSHMEM heap backend (WEFT_NVSHMEM=AUTO and NVSHMEM not found; "
                   "bash scripts/setup.sh fetches it)")
  endif()
else()
  message(STATUS "weft: no NVSHMEM heap backend (WEFT_NVSHMEM=OFF)")
endif()
# For scripts (scripts/gpu_tests.sh runs the suite on the NVSHMEM heap too where it is built in).
set(WEFT_NVSHMEM_BUILT ${WEFT_HAVE_NVSHMEM} CACHE INTERNAL "the NVSHMEM heap backend is compiled in")

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
