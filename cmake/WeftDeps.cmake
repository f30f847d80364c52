# Locates weft's few dependencies. Everything here comes from the CUDA toolkit,
# Debian packages or pip wheels that scripts/setup.sh installs into .deps/.
find_package(Threads REQUIRED)

set(WEFT_DEPS_DIR "${CMAKE_CURRENT_SOURCE_DIR}/.deps" CACHE PATH "where scripts/setup.sh puts fetched dependencies")

# ---- NCCL (system package, CUDA toolkit, or the pip wheel nvidia-nccl-cu13) ----
find_path(WEFT_NCCL_INCLUDE_DIR nccl.h
  HINTS ${NCCL_ROOT}/include $ENV{NCCL_ROOT}/include ${CUDAToolkit_INCLUDE_DIRS}
        ${WEFT_DEPS_DIR}/nccl/include /usr/include /usr/local/include)
find_library(WEFT_NCCL_LIBRARY NAMES nccl libnccl.so.2
  HINTS ${NCCL_ROOT}/lib $ENV{NCCL_ROOT}/lib ${CUDAToolkit_LIBRARY_DIR} ${WEFT_DEPS_DIR}/nccl/lib
        /usr/lib/x86_64-linux-gnu /usr/local/lib)
if(NOT WEFT_NCCL_INCLUDE_DIR OR NOT WEFT_NCCL_LIBRARY)
  message(FATAL_ERROR "NCCL not found (need nccl.h and libnccl.so). Set NCCL_ROOT, or run scripts/setup.sh.")
endif()
add_library(weft::nccl INTERFACE IMPORTED)
target_include_directories(weft::nccl INTERFACE ${WEFT_NCCL_INCLUDE_DIR})
target_link_libraries(weft::nccl INTERFACE ${WEFT_NCCL_LIBRARY})
message(STATUS "weft: NCCL ${WEFT_NCCL_LIBRARY} (headers ${WEFT_NCCL_INCLUDE_DIR})")

# ---- nvml.h (header only: libnvidia-ml is opened at run time) ----
find_path(WEFT_NVML_INCLUDE_DIR nvml.h
  HINTS ${CUDAToolkit_INCLUDE_DIRS} ${WEFT_DEPS_DIR}/nvml/include ${WEFT_DEPS_DIR}/nvidia/cu13/include)
if(NOT WEFT_NVML_INCLUDE_DIR)
  message(FATAL_ERROR "nvml.h not found. Run scripts/setup.sh (it installs pip nvidia-nvml-dev into .deps/).")
endif()

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

# ---- CUTLASS / CuTe headers (pip nvidia-cutlass, unpacked by scripts/setup.sh) ----
find_path(WEFT_CUTLASS_INCLUDE_DIR cutlass/gemm/collective/collective_builder.hpp
  HINTS ${CUTLASS_ROOT}/include $ENV{CUTLASS_ROOT}/include ${WEFT_DEPS_DIR}/cutlass/include)
find_path(WEFT_CUTLASS_UTIL_INCLUDE_DIR cutlass/util/packed_stride.hpp
  HINTS ${CUTLASS_ROOT}/tools/util/include ${WEFT_DEPS_DIR}/cutlass/util/include)
if(NOT WEFT_CUTLASS_INCLUDE_DIR OR NOT WEFT_CUTLASS_UTIL_INCLUDE_DIR)
  message(FATAL_ERROR "CUTLASS headers not found. Run scripts/setup.sh (it unpacks pip nvidia-cutlass into .deps/).")
endif()
message(STATUS "weft: CUTLASS ${WEFT_CUTLASS_INCLUDE_DIR}")
