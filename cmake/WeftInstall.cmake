# Install rules and the CMake package: `cmake --install <build> --prefix P` puts
#   P/lib/libweft.a                       the library
#   P/include/weft/...                    its public headers
#   P/bin/weftrun                         the launcher
#   P/lib/cmake/weft/weftConfig.cmake     find_package(weft): weft::weft, weft::weftrun
# so that another project builds against weft with
#   find_package(weft REQUIRED)  and  target_link_libraries(app PRIVATE weft::weft).
# examples/consumer is such a project; scripts/check_install.sh builds it.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(WEFT_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/weft" CACHE STRING
    "where the CMake package goes, relative to the install prefix")

# What a program built against the installed package needs and weft's own
# targets get from CMAKE_CXX_FLAGS / CMAKE_CUDA_FLAGS: C++20 and Hopper code.
# $<INSTALL_INTERFACE:...> keeps them out of the build tree, whose flags stay as set above.
# CMake 3.25 knows no C++20 flag for nvcc (no cuda_std_20), so CUDA sources get
# -std=c++20 by hand, unless the consuming target sets a CUDA_STANDARD itself.
target_compile_features(weft INTERFACE $<INSTALL_INTERFACE:cxx_std_20>)
target_compile_options(weft INTERFACE
  "$<INSTALL_INTERFACE:$<$<AND:$<COMPILE_LANGUAGE:CUDA>,$<STREQUAL:$<TARGET_PROPERTY:CUDA_STANDARD>,>>:-std=c++20>>")
separate_arguments(_weft_gencode UNIX_COMMAND "${WEFT_CUDA_GENCODE}")
foreach(_flag IN LISTS _weft_gencode)
  target_compile_options(weft INTERFACE "$<INSTALL_INTERFACE:$<$<COMPILE_LANGUAGE:CUDA>:${_flag}>>")
endforeach()

install(TARGETS weft weftrun EXPORT weftTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/include/weft DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.hpp" PATTERN "*.cuh" PATTERN "*.h")
# weft::weft links weft::nccl, an imported target: weftConfig.cmake defines it
# again on the consumer's machine (cmake/WeftFindNccl.cmake), first looking
# where this build found NCCL.
install(EXPORT weftTargets NAMESPACE weft:: DESTINATION ${WEFT_INSTALL_CMAKEDIR} FILE weftTargets.cmake)

get_filename_component(WEFT_NCCL_LIBRARY_DIR "${WEFT_NCCL_LIBRARY}" DIRECTORY)
string(REGEX MATCH "^[0-9]+" WEFT_CUDA_VERSION_MAJOR "${CUDAToolkit_VERSION}")
configure_package_config_file(${CMAKE_CURRENT_SOURCE_DIR}/cmake/weftConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/weftConfig.cmake INSTALL_DESTINATION ${WEFT_INSTALL_CMAKEDIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/weftConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/weftConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/weftConfigVersion.cmake
              ${CMAKE_CURRENT_SOURCE_DIR}/cmake/WeftFindNccl.cmake
        DESTINATION ${WEFT_INSTALL_CMAKEDIR})
