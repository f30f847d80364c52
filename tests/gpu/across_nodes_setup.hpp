// across_nodes_setup.hpp - a suite's cases run again between nodes: the GPU test
// files that weft_internode_tests compiles a second time (WEFT_TESTS_ACROSS_NODES)
// open each case with ACROSS_NODES_SETUP(). There it skips unless the ranks span
// nodes (virtual ones on one machine, WEFT_VIRTUAL_NODES, or real ones) on the
// NVSHMEM heap, and keeps a weft::RemotePeers alive for the case (the two-level
// schedules and Context::barrier across nodes); in the one-node suite it does nothing.
#pragma once

#if defined(WEFT_TESTS_ACROSS_NODES)
#include "internode/internode_test.hpp"
#include "weft/internode/remote_peers.hpp"
#define ACROSS_NODES_SETUP() \
  NEED_NODES();              \
  ::weft::RemotePeers remote_peers(::weft::test::ctx_ptr())
#else
#define ACROSS_NODES_SETUP() \
  do {                       \
  } while (0)
#endif
