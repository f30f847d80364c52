// internode_test.hpp - what the tests of weft_internode_tests share: the skip
// for runs without the NVSHMEM heap and virtual nodes.
#pragma once

#include "gpu_test.hpp"
#include "weft/runtime/context.hpp"

/// Skips (on every rank alike: the settings were agreed) unless the NVSHMEM heap runs with virtual nodes.
#define NEED_VIRTUAL_NODES()                                                                                     \
  do {                                                                                                           \
    if (::weft::test::ctx().heap().backend() != ::weft::HeapBackend::nvshmem)                                    \
      GTEST_SKIP() << "needs the NVSHMEM heap (WEFT_HEAP_BACKEND=nvshmem) and virtual nodes "                    \
                      "(WEFT_VIRTUAL_NODES=N); this run has the "                                                \
                   << ::weft::to_string(::weft::test::ctx().heap().backend()) << " heap";                        \
    if (::weft::test::ctx().team().virtual_nodes < 2)                                                            \
      GTEST_SKIP() << "needs virtual nodes (WEFT_VIRTUAL_NODES=N, N >= 2 dividing the world size) on the "       \
                      "NVSHMEM heap; this run has one node of "                                                  \
                   << ::weft::test::ctx().world_size() << " ranks";                                              \
  } while (0)

/// Skips (on every rank alike) unless the NVSHMEM heap runs with the ranks on
/// more than one node: virtual nodes on one machine, or real ones (launched by
/// torchrun, mpirun or Slurm across machines).
#define NEED_NODES()                                                                                             \
  do {                                                                                                           \
    if (::weft::test::ctx().heap().backend() != ::weft::HeapBackend::nvshmem)                                    \
      GTEST_SKIP() << "needs the NVSHMEM heap (WEFT_HEAP_BACKEND=nvshmem) and ranks on several nodes (or "       \
                      "virtual nodes: WEFT_VIRTUAL_NODES=N); this run has the "                                  \
                   << ::weft::to_string(::weft::test::ctx().heap().backend()) << " heap";                        \
    if (::weft::test::ctx().team().num_nodes < 2)                                                                \
      GTEST_SKIP() << "needs ranks on several nodes (or virtual nodes: WEFT_VIRTUAL_NODES=N, N >= 2 dividing "   \
                      "the world size) on the NVSHMEM heap; this run has one node of "                           \
                   << ::weft::test::ctx().world_size() << " ranks";                                              \
  } while (0)
