# weft_find_nccl(<error_var> [hint_dir ...]) finds NCCL (nccl.h and libnccl)
# and defines the imported target weft::nccl with its include directory and
# library. weft's own build (cmake/WeftDeps.cmake) and the installed package
# (weftConfig.cmake) both use it, so a program that links weft::weft finds
# NCCL the way weft's build does. Places searched, in this order:
#   1. NCCL_ROOT (CMake or environment variable) and the hint directories;
#   2. the CUDA toolkit's directories (CUDAToolkit_INCLUDE_DIRS, CUDAToolkit_LIBRARY_DIR);
#   3. the system directories (Debian/Ubuntu package libnccl-dev);
#   4. the pip wheel nvidia-nccl-cu13 installed for python3 (.../nvidia/nccl/{include,lib}).
# The library is looked for next to the header first, so both come from one NCCL.
# Sets <error_var> to "" when found, else to a message saying where it looked
# and the three ways to install NCCL.
function(weft_find_nccl error_var)
  set(${error_var} "" PARENT_SCOPE)
  if(TARGET weft::nccl)
    return()
  endif()

  set(roots ${NCCL_ROOT} $ENV{NCCL_ROOT} ${ARGN})
  set(include_hints)
  set(library_hints)
  foreach(root IN LISTS roots)
    list(APPEND include_hints ${root} ${root}/include)
    list(APPEND library_hints ${root} ${root}/lib ${root}/lib64)
  endforeach()
  list(APPEND include_hints ${CUDAToolkit_INCLUDE_DIRS})
  list(APPEND library_hints ${CUDAToolkit_LIBRARY_DIR})
  if(WEFT_DEPS_DIR)
    list(APPEND include_hints ${WEFT_DEPS_DIR}/nccl/include)
    list(APPEND library_hints ${WEFT_DEPS_DIR}/nccl/lib)
  endif()

  find_path(WEFT_NCCL_INCLUDE_DIR nccl.h HINTS ${include_hints} PATHS /usr/include /usr/local/include
            DOC "directory holding nccl.h")
  if(WEFT_NCCL_INCLUDE_DIR AND NOT WEFT_NCCL_LIBRARY)
    find_library(WEFT_NCCL_LIBRARY NAMES nccl libnccl.so.2
                 HINTS ${WEFT_NCCL_INCLUDE_DIR}/../lib ${WEFT_NCCL_INCLUDE_DIR}/../lib64 ${library_hints}
                 PATHS /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu /usr/local/lib
                 DOC "NCCL's shared library")
  endif()

  # Not in the usual places: the pip wheel nvidia-nccl-cu13, header and library together.
  set(wheel_note "")
  if(NOT WEFT_NCCL_INCLUDE_DIR OR NOT WEFT_NCCL_LIBRARY)
    find_program(WEFT_PYTHON3 NAMES python3 python DOC "python3, asked where the pip wheel nvidia-nccl-cu13 lives")
    if(WEFT_PYTHON3)
      execute_process(COMMAND ${WEFT_PYTHON3} -c "import nvidia.nccl as m; print(list(m.__path__)[0])"
                      OUTPUT_VARIABLE wheel_dir OUTPUT_STRIP_TRAILING_WHITESPACE
                      RESULT_VARIABLE rc ERROR_QUIET)
      if(rc EQUAL 0 AND EXISTS "${wheel_dir}/include/nccl.h")
        unset(WEFT_NCCL_INCLUDE_DIR CACHE)
        unset(WEFT_NCCL_LIBRARY CACHE)
        find_path(WEFT_NCCL_INCLUDE_DIR nccl.h HINTS ${wheel_dir}/include NO_DEFAULT_PATH
                  DOC "directory holding nccl.h")
        find_library(WEFT_NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${wheel_dir}/lib NO_DEFAULT_PATH
                     DOC "NCCL's shared library")
        set(wheel_note " The pip wheel at ${wheel_dir} lacks a usable library.")
      else()
        set(wheel_note " ${WEFT_PYTHON3} has no nvidia-nccl-cu13 wheel.")
      endif()
    endif()
  endif()

  if(NOT WEFT_NCCL_INCLUDE_DIR OR NOT WEFT_NCCL_LIBRARY)
    set(looked "NCCL_ROOT (unset)")
    if(NCCL_ROOT OR DEFINED ENV{NCCL_ROOT})
      set(looked "NCCL_ROOT (${NCCL_ROOT}$ENV{NCCL_ROOT})")
    endif()
    list(REMOVE_DUPLICATES include_hints)
    foreach(dir IN LISTS include_hints)
      if(IS_DIRECTORY "${dir}")
        string(APPEND looked ", ${dir}")
      endif()
    endforeach()
    set(found "neither")
    if(WEFT_NCCL_INCLUDE_DIR)
      set(found "only the header, in ${WEFT_NCCL_INCLUDE_DIR}")
    endif()
    string(CONCAT message
      "NCCL not found: weft needs nccl.h and libnccl.so (or libnccl.so.2); "
      "found ${found}. "
      "Looked in ${looked}, the system directories and python3's packages.${wheel_note} "
      "Install NCCL for CUDA 13 one of three ways: "
      "(1) the CUDA toolkit's packages from NVIDIA's CUDA repository (apt-get install libnccl2 libnccl-dev; "
      "https://developer.nvidia.com/nccl); "
      "(2) on Debian/Ubuntu, the distribution's package: apt-get install libnccl-dev; "
      "(3) pip: python3 -m pip install nvidia-nccl-cu13 (found through python3). "
      "Or set NCCL_ROOT to a directory holding include/nccl.h and lib/libnccl.so.")
    set(${error_var} "${message}" PARENT_SCOPE)
    return()
  endif()

  add_library(weft::nccl INTERFACE IMPORTED)
  target_include_directories(weft::nccl INTERFACE ${WEFT_NCCL_INCLUDE_DIR})
  target_link_libraries(weft::nccl INTERFACE ${WEFT_NCCL_LIBRARY})
endfunction()
