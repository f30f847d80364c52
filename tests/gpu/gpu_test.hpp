// gpu_test.hpp - the shared fixture of weft's GPU tests: one Context per process, all ranks in step.
//
// Every test runs on every rank, in the same order, and is collective: a test
// must reach the same collective calls on every rank, so tests use EXPECT_*
// (never ASSERT_* before a collective) and compare verdicts across ranks.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "weft/runtime/context.hpp"

namespace weft::test {

/// The process's Context (created in main).
Context& ctx();
std::shared_ptr<Context> ctx_ptr();
/// A non-blocking stream for the tests.
cudaStream_t stream();
/// True on every rank iff `mine` is true on every rank (collective).
bool all_ranks(bool mine);
/// Every rank's value of `mine`, by rank (collective).
std::vector<std::string> gather(const std::string& mine);

}  // namespace weft::test

/// Skips the test (on every rank alike) unless the world has at least n ranks.
#define WEFT_NEED_RANKS(n)                                                                 \
  do {                                                                                     \
    if (::weft::test::ctx().world_size() < (n))                                            \
      GTEST_SKIP() << "needs " << (n) << " ranks, this run has " << ::weft::test::ctx().world_size(); \
  } while (0)
