# Generates weft's GEMM kernels from src/gemm/kernel_table.cmake:
#   ${CMAKE_BINARY_DIR}/gemm_configs/<id>.cu   one translation unit per kernel (src/gemm/config_unit.cu.in,
#                                               or src/gemm/grouped_config_unit.cu.in for grouped rows)
#   ${CMAKE_BINARY_DIR}/gemm_configs/gemm_configs.inc
#                                               WEFT_GEMM_KERNEL(<id>) per dense kernel, in table order
#                                               (src/gemm/gemm.cpp declares and lists them from it)
#   ${CMAKE_BINARY_DIR}/gemm_configs/grouped_gemm_configs.inc
#                                               WEFT_GROUPED_GEMM_KERNEL(<id>) per grouped kernel
#                                               (src/gemm/grouped_gemm.cpp lists them)
# and sets WEFT_GEMM_KERNEL_SOURCES (both kinds), WEFT_GEMM_KERNEL_COUNT (dense)
# and WEFT_GROUPED_GEMM_KERNEL_COUNT.
#
# WEFT_GEMM_KERNELS=all (the default) compiles every row; =subset only the rows
# marked SUBSET, for CI on machines without a GPU, where the build is most of
# the run's time. GPU builds (scripts/gpu_tests.sh's machines) compile all.
set(WEFT_GEMM_KERNELS "all" CACHE STRING "GEMM kernels to compile: all, or subset (CI without a GPU)")
set_property(CACHE WEFT_GEMM_KERNELS PROPERTY STRINGS all subset)
# WEFT_GROUPED_KERNELS (all or subset; empty, the default: as WEFT_GEMM_KERNELS,
# on every configure) chooses the grouped rows apart, so a run that measures
# the grouped engine builds all of its tiles beside the dense subset, in about
# half the time of a full build.
set(WEFT_GROUPED_KERNELS "" CACHE STRING
    "grouped GEMM kernels to compile: all, or subset (empty: as WEFT_GEMM_KERNELS)")
set_property(CACHE WEFT_GROUPED_KERNELS PROPERTY STRINGS "" all subset)
set(_weft_grouped_kernels "${WEFT_GROUPED_KERNELS}")
if(_weft_grouped_kernels STREQUAL "")
  set(_weft_grouped_kernels "${WEFT_GEMM_KERNELS}")
endif()
foreach(_weft_setting WEFT_GEMM_KERNELS _weft_grouped_kernels)
  if(NOT ${_weft_setting} MATCHES "^(all|subset)$")
    message(FATAL_ERROR "WEFT_GEMM_KERNELS and WEFT_GROUPED_KERNELS must be 'all' or 'subset' (got "
                        "'${WEFT_GEMM_KERNELS}' and '${WEFT_GROUPED_KERNELS}')")
  endif()
endforeach()

set(_weft_kernel_dir "${CMAKE_BINARY_DIR}/gemm_configs")
set(_weft_kernel_table "${CMAKE_CURRENT_SOURCE_DIR}/src/gemm/kernel_table.cmake")
set(_weft_kernel_template "${CMAKE_CURRENT_SOURCE_DIR}/src/gemm/config_unit.cu.in")
set(_weft_grouped_kernel_template "${CMAKE_CURRENT_SOURCE_DIR}/src/gemm/grouped_config_unit.cu.in")
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${_weft_kernel_table}" "${_weft_kernel_template}"
             "${_weft_grouped_kernel_template}")
file(MAKE_DIRECTORY "${_weft_kernel_dir}")
set(WEFT_GEMM_KERNEL_SOURCES "")
set(WEFT_GEMM_KERNEL_COUNT 0)
set(_weft_kernel_list "")
set(WEFT_GROUPED_GEMM_KERNEL_COUNT 0)
set(_weft_grouped_kernel_list "")

function(_weft_kernel_fail row why)
  message(FATAL_ERROR "src/gemm/kernel_table.cmake: weft_gemm_kernel(${row}): ${why}")
endfunction()

# The fields every row has, dense or grouped, in the caller's scope: row, n,
# input, output, layout, tile, cluster, schedule, hook, in_subset (macros, so
# that they set the calling function's variables).
macro(_weft_kernel_row_fields)
  set(row ${ARGV})
  list(LENGTH row n)
  if(n LESS 7 OR n GREATER 8)
    _weft_kernel_fail("${row}" "expected INPUT OUTPUT B_LAYOUT TILE CLUSTER SCHEDULE HOOK [SUBSET]")
  endif()
  list(GET row 0 input)
  list(GET row 1 output)
  list(GET row 2 layout)
  list(GET row 3 tile)
  list(GET row 4 cluster)
  list(GET row 5 schedule)
  list(GET row 6 hook)
  set(in_subset FALSE)
  if(n EQUAL 8)
    list(GET row 7 flag)
    if(NOT flag STREQUAL "SUBSET")
      _weft_kernel_fail("${row}" "the eighth field can only be SUBSET (got '${flag}')")
    endif()
    set(in_subset TRUE)
  endif()
endmacro()

# B_LAYOUT, TILE and CLUSTER checked, and TILE's and CLUSTER's numbers as tm,
# tn, tk, cm, cn.
macro(_weft_kernel_row_shape)
  if(NOT layout MATCHES "^(nk|kn)$")
    _weft_kernel_fail("${row}" "B_LAYOUT is nk or kn (got '${layout}')")
  endif()
  if(NOT tile MATCHES "^([0-9]+)x([0-9]+)x([0-9]+)$")
    _weft_kernel_fail("${row}" "TILE is MxNxK (got '${tile}')")
  endif()
  set(tm ${CMAKE_MATCH_1})
  set(tn ${CMAKE_MATCH_2})
  set(tk ${CMAKE_MATCH_3})
  if(NOT cluster MATCHES "^([0-9]+)x([0-9]+)$")
    _weft_kernel_fail("${row}" "CLUSTER is MxN (got '${cluster}')")
  endif()
  set(cm ${CMAKE_MATCH_1})
  set(cn ${CMAKE_MATCH_2})
endmacro()

# weft_gemm_kernel(INPUT OUTPUT B_LAYOUT TILE_MxNxK CLUSTER_MxN SCHEDULE HOOK [SUBSET])
function(weft_gemm_kernel)
  _weft_kernel_row_fields(${ARGN})
  foreach(t IN ITEMS ${input} ${output})
    if(NOT t MATCHES "^(bf16|fp16|fp32)$")
      _weft_kernel_fail("${row}" "types are bf16, fp16 or fp32 (got '${t}')")
    endif()
  endforeach()
  _weft_kernel_row_shape()
  # The schedule's and the hook's C++ names (KernelSpec) and their words in the kernel's name.
  if(schedule STREQUAL "cooperative")
    set(spec_schedule "Schedule::cooperative")
    set(words "cooperative")
  elseif(schedule STREQUAL "pingpong")
    set(spec_schedule "Schedule::pingpong")
    set(words "pingpong")
  elseif(schedule STREQUAL "cooperative_streamK")
    set(spec_schedule "Schedule::cooperative_stream_k")
    set(words "cooperative stream-K")
  elseif(schedule STREQUAL "cooperative_swapped")
    set(spec_schedule "Schedule::cooperative_swapped")
    set(words "cooperative swapped")
  else()
    _weft_kernel_fail("${row}" "SCHEDULE is cooperative, pingpong, cooperative_streamK or cooperative_swapped (got '${schedule}')")
  endif()
  set(extra_include "")
  if(hook STREQUAL "none")
    set(spec_hook "Hook::none")
    set(id_hook "")
  elseif(hook STREQUAL "hooked")
    set(spec_hook "Hook::waits")
    set(words "${words} hooked")
    set(id_hook "_hooked")
  elseif(hook STREQUAL "hooked_source")
    set(spec_hook "Hook::waits_source")
    set(words "${words} hooked+source")
    set(id_hook "_hooked_source")
  elseif(hook STREQUAL "hooked_add")
    set(spec_hook "Hook::waits_add")
    set(words "${words} hooked+add")
    set(id_hook "_hooked_add")
    set(extra_include "#include \"add_rows.cuh\"  // StoreOrAddEpilogue, before cutlass_kernel.cuh")
  else()
    _weft_kernel_fail("${row}" "HOOK is none, hooked, hooked_source or hooked_add (got '${hook}')")
  endif()

  set(id "config_${input}_${output}_${layout}_${tile}_c${cluster}_${schedule}${id_hook}")
  set(name "${tile} c${cluster} ${words}")
  # In the generated unit: KernelSpec's fields in order.
  set(spec "DType::${input}, DType::${output}, BLayout::${layout}, ${tm}, ${tn}, ${tk}, ${cm}, ${cn}, ${spec_schedule}, ${spec_hook}")

  list(FIND _weft_kernel_ids "${id}" dup)
  if(NOT dup EQUAL -1)
    _weft_kernel_fail("${row}" "a second row for ${id}")
  endif()
  set(_weft_kernel_ids ${_weft_kernel_ids} "${id}" PARENT_SCOPE)

  if(WEFT_GEMM_KERNELS STREQUAL "subset" AND NOT in_subset)
    return()
  endif()
  set(WEFT_KERNEL_ID "${id}")
  set(WEFT_KERNEL_NAME "${name}")
  set(WEFT_KERNEL_SPEC "${spec}")
  set(WEFT_KERNEL_EXTRA_INCLUDE "${extra_include}")
  configure_file("${_weft_kernel_template}" "${_weft_kernel_dir}/${id}.cu" @ONLY)
  set(WEFT_GEMM_KERNEL_SOURCES ${WEFT_GEMM_KERNEL_SOURCES} "${_weft_kernel_dir}/${id}.cu" PARENT_SCOPE)
  set(_weft_kernel_list "${_weft_kernel_list}WEFT_GEMM_KERNEL(${id})\n" PARENT_SCOPE)
  math(EXPR count "${WEFT_GEMM_KERNEL_COUNT} + 1")
  set(WEFT_GEMM_KERNEL_COUNT ${count} PARENT_SCOPE)
endfunction()

# weft_grouped_gemm_kernel(INPUT OUTPUT B_LAYOUT TILE_MxNxK CLUSTER_MxN SCHEDULE HOOK [SUBSET])
# A grouped GEMM kernel (weft::GroupedGemm): the same fields as a dense row, one
# KernelSpec, instantiated as CUTLASS's ptr-array grouped kernel
# (src/gemm/grouped_kernel.cuh): OUTPUT the input type, B as the experts'
# weights [E, N, K] (nk) or [E, K, N] (kn), the cooperative schedule, and HOOK
# none: every grouped kernel carries its seams (wait for rows, report stored
# rows), taken at run time where a run asks for them.
function(weft_grouped_gemm_kernel)
  _weft_kernel_row_fields(${ARGN})
  if(NOT input MATCHES "^(bf16|fp16)$")
    _weft_kernel_fail("${row}" "a grouped kernel's INPUT is bf16 or fp16 (got '${input}')")
  endif()
  if(NOT output STREQUAL input)
    _weft_kernel_fail("${row}" "a grouped kernel's OUTPUT is its input type (got '${output}' for '${input}')")
  endif()
  _weft_kernel_row_shape()
  if(NOT schedule STREQUAL "cooperative")
    _weft_kernel_fail("${row}" "a grouped kernel's SCHEDULE is cooperative (got '${schedule}')")
  endif()
  if(NOT hook STREQUAL "none")
    _weft_kernel_fail("${row}" "a grouped kernel's HOOK is none: its seams are in every grouped kernel (got '${hook}')")
  endif()

  set(id "grouped_config_${input}_${layout}_${tile}_c${cluster}_${schedule}")
  set(name "${tile} c${cluster} ${schedule}")
  set(spec "DType::${input}, DType::${output}, BLayout::${layout}, ${tm}, ${tn}, ${tk}, ${cm}, ${cn}, Schedule::cooperative, Hook::none")

  list(FIND _weft_kernel_ids "${id}" dup)
  if(NOT dup EQUAL -1)
    _weft_kernel_fail("${row}" "a second row for ${id}")
  endif()
  set(_weft_kernel_ids ${_weft_kernel_ids} "${id}" PARENT_SCOPE)

  if(_weft_grouped_kernels STREQUAL "subset" AND NOT in_subset)
    return()
  endif()
  set(WEFT_KERNEL_ID "${id}")
  set(WEFT_KERNEL_NAME "${name}")
  set(WEFT_KERNEL_SPEC "${spec}")
  configure_file("${_weft_grouped_kernel_template}" "${_weft_kernel_dir}/${id}.cu" @ONLY)
  set(WEFT_GEMM_KERNEL_SOURCES ${WEFT_GEMM_KERNEL_SOURCES} "${_weft_kernel_dir}/${id}.cu" PARENT_SCOPE)
  set(_weft_grouped_kernel_list "${_weft_grouped_kernel_list}WEFT_GROUPED_GEMM_KERNEL(${id})\n" PARENT_SCOPE)
  math(EXPR count "${WEFT_GROUPED_GEMM_KERNEL_COUNT} + 1")
  set(WEFT_GROUPED_GEMM_KERNEL_COUNT ${count} PARENT_SCOPE)
endfunction()

set(_weft_kernel_ids "")
include("${_weft_kernel_table}")

# Written only when it changes, so that a reconfigure with the same table does not recompile gemm.cpp.
set(_weft_kernel_inc "// Generated by cmake/WeftGemmKernels.cmake from src/gemm/kernel_table.cmake\n")
string(APPEND _weft_kernel_inc "// (WEFT_GEMM_KERNELS=${WEFT_GEMM_KERNELS}): one WEFT_GEMM_KERNEL(id) per compiled kernel, in the table's order.\n")
string(APPEND _weft_kernel_inc "${_weft_kernel_list}")
file(CONFIGURE OUTPUT "${_weft_kernel_dir}/gemm_configs.inc" CONTENT "${_weft_kernel_inc}")
set(_weft_grouped_kernel_inc "// Generated by cmake/WeftGemmKernels.cmake from src/gemm/kernel_table.cmake\n")
string(APPEND _weft_grouped_kernel_inc "// (WEFT_GROUPED_KERNELS=${_weft_grouped_kernels}): one WEFT_GROUPED_GEMM_KERNEL(id) per compiled grouped kernel, in the table's order.\n")
string(APPEND _weft_grouped_kernel_inc "${_weft_grouped_kernel_list}")
file(CONFIGURE OUTPUT "${_weft_kernel_dir}/grouped_gemm_configs.inc" CONTENT "${_weft_grouped_kernel_inc}")

# Units of rows not compiled under this setting stay in the folder unused, so
# that switching WEFT_GEMM_KERNELS back recompiles nothing.
message(STATUS "weft: ${WEFT_GEMM_KERNEL_COUNT} GEMM kernels and ${WEFT_GROUPED_GEMM_KERNEL_COUNT} grouped GEMM kernels "
               "(WEFT_GEMM_KERNELS=${WEFT_GEMM_KERNELS}, WEFT_GROUPED_KERNELS=${_weft_grouped_kernels}, src/gemm/kernel_table.cmake)")
