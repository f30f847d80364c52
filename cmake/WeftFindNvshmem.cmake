# weft_find_nvshmem(<error_var> [hint_dir ...]) finds NVSHMEM 3.x for the NVSHMEM
# heap backend (docs/decisions/0057): the host headers (nvshmem.h,
# host/nvshmemx_api.h) and the host library libnvshmem_host.so.3, which weft
# opens at run time, so nothing is linked. Places searched, in this order:
#   1. NVSHMEM_HOME (CMake or environment variable) and the hint directories;
#   2. WEFT_NVSHMEM_DEPS_DIR (.deps-nvshmem), where scripts/setup.sh unpacks the pip wheel
#      nvidia-nvshmem-cu13 (beside .deps/, not in it: .deps/ travels to GPU machines, whose
#      torch brings its own NVSHMEM, and 48 MB more would not fit what travels);
#   3. the pip wheel nvidia-nvshmem-cu13 installed for python3 (.../nvidia/nvshmem/{include,lib},
#      as torch installs it);
#   4. the system (Debian/Ubuntu libnvshmem3-dev-cuda-13: /usr/include/nvshmem_13,
#      /usr/lib/<arch>/nvshmem/13).
# Sets WEFT_NVSHMEM_INCLUDE_DIR, WEFT_NVSHMEM_HOST_LIBRARY, WEFT_NVSHMEM_VERSION
# and <error_var> "" when found; else <error_var> says where it looked and how to install it.
# Also WEFT_NVSHMEM_DEVICE_LIBRARY: libnvshmem_device.a beside the host library
# (NVSHMEM's device API, device-linked into weft::internode's consumers only,
# docs/decisions/0061), or "" where that install has none.
function(weft_find_nvshmem error_var)
  set(${error_var} "" PARENT_SCOPE)
  set(roots ${NVSHMEM_HOME} $ENV{NVSHMEM_HOME} ${ARGN})
  if(WEFT_NVSHMEM_DEPS_DIR)
    list(APPEND roots ${WEFT_NVSHMEM_DEPS_DIR})
  endif()
  find_program(WEFT_PYTHON3 NAMES python3 python DOC "python3, asked where pip wheels of NVIDIA libraries live")
  set(wheel_note " python3 not found.")
  if(WEFT_PYTHON3)
    execute_process(COMMAND ${WEFT_PYTHON3} -c "import nvidia.nvshmem as m; print(list(m.__path__)[0])"
                    OUTPUT_VARIABLE wheel_dir OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc ERROR_QUIET)
    if(rc EQUAL 0 AND IS_DIRECTORY "${wheel_dir}")
      list(APPEND roots ${wheel_dir})
      set(wheel_note "")
    else()
      set(wheel_note " ${WEFT_PYTHON3} has no nvidia-nvshmem-cu13 wheel.")
    endif()
  endif()
  list(APPEND roots /usr/include/nvshmem_13 /usr/lib/x86_64-linux-gnu/nvshmem/13 /usr/lib/aarch64-linux-gnu/nvshmem/13)

  # Header and library from one root, the first that has both.
  foreach(root IN LISTS roots)
    if(EXISTS "${root}/include/host/nvshmemx_api.h")
      set(inc "${root}/include")
    elseif(EXISTS "${root}/host/nvshmemx_api.h")
      set(inc "${root}")
    else()
      continue()
    endif()
    foreach(libdir ${root}/lib ${root}/lib64 ${root} ${inc}/../lib
            /usr/lib/x86_64-linux-gnu/nvshmem/13 /usr/lib/aarch64-linux-gnu/nvshmem/13)
      if(EXISTS "${libdir}/libnvshmem_host.so.3")
        get_filename_component(lib "${libdir}/libnvshmem_host.so.3" ABSOLUTE)
        break()
      endif()
    endforeach()
    if(lib)
      break()
    endif()
    unset(inc)
  endforeach()

  if(NOT inc OR NOT lib)
    list(REMOVE_DUPLICATES roots)
    string(REPLACE ";" ", " looked "${roots}")
    string(CONCAT message
      "NVSHMEM not found: the NVSHMEM heap backend needs NVSHMEM 3.x's host headers (host/nvshmemx_api.h) "
      "and libnvshmem_host.so.3. Looked in NVSHMEM_HOME (${NVSHMEM_HOME}$ENV{NVSHMEM_HOME}), ${looked}.${wheel_note} "
      "Get it one of three ways: bash scripts/setup.sh (unpacks the pip wheel nvidia-nvshmem-cu13 into .deps-nvshmem/); "
      "python3 -m pip install nvidia-nvshmem-cu13 (torch installs it too); or set NVSHMEM_HOME to an "
      "NVSHMEM install (include/, lib/). Or configure with -DWEFT_NVSHMEM=OFF to build without it.")
    set(${error_var} "${message}" PARENT_SCOPE)
    return()
  endif()

  file(STRINGS "${inc}/non_abi/nvshmem_version.h" lines REGEX "define NVSHMEM_VENDOR_(MAJOR|MINOR|PATCH)_VERSION")
  set(version "")
  foreach(part MAJOR MINOR PATCH)
    string(REGEX MATCH "NVSHMEM_VENDOR_${part}_VERSION ([0-9]+)" m "${lines}")
    list(APPEND version "${CMAKE_MATCH_1}")
  endforeach()
  string(REPLACE ";" "." version "${version}")
  if(version VERSION_LESS 3.0)
    set(${error_var} "NVSHMEM ${version} in ${inc} is too old: the NVSHMEM heap backend needs 3.x (host-library \
initialisation by unique id). python3 -m pip install nvidia-nvshmem-cu13, or set NVSHMEM_HOME." PARENT_SCOPE)
    return()
  endif()
  set(WEFT_NVSHMEM_INCLUDE_DIR "${inc}" CACHE PATH "directory holding nvshmem.h" FORCE)
  set(WEFT_NVSHMEM_HOST_LIBRARY "${lib}" CACHE FILEPATH "NVSHMEM's host library, opened at run time" FORCE)
  set(WEFT_NVSHMEM_VERSION "${version}" CACHE STRING "NVSHMEM version found" FORCE)
  get_filename_component(libdir "${lib}" DIRECTORY)
  set(device_lib "")
  if(EXISTS "${libdir}/libnvshmem_device.a")
    set(device_lib "${libdir}/libnvshmem_device.a")
  endif()
  set(WEFT_NVSHMEM_DEVICE_LIBRARY "${device_lib}" CACHE FILEPATH
      "NVSHMEM's device library (libnvshmem_device.a), device-linked by weft::internode's consumers" FORCE)
endfunction()
