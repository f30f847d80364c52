// weft/device/ll.cuh - the low-latency (LL) protocol: data and flag in one 8-byte store.
//
// A line is 8 bytes: 4 bytes of payload and a 4-byte flag. The writer stores
// both with one 8-byte store, which the hardware makes visible all at once, so
// a reader that sees the flag also sees the payload - no fence, no separate
// signal, one trip across NVLink. The price: twice the bytes on the wire, so
// LL is for small messages. Flags carry the operation's epoch (mod 2^32);
// buffers are double-buffered by epoch parity so a line is never overwritten
// before its reader has moved on.
#pragma once

#include <cstdint>

#include "weft/device/signal.cuh"
#include "weft/device/world.cuh"

#if defined(__CUDACC__)
namespace weft::dev {

/// Stores payload and flag as one 8-byte line (volatile: straight to memory,
/// visible system-wide, unordered with other stores). Does not block.
WEFT_DEVICE void ll_store(std::uint64_t* line, std::uint32_t payload, std::uint32_t flag) {
  asm volatile("st.volatile.global.v2.u32 [%0], {%1, %2};" ::"l"(line), "r"(payload), "r"(flag) : "memory");
}

/// Spins until the line's flag equals `flag`, then returns its payload. Reads
/// memory every time (volatile). Blocks, bounded by the World's wait timeout
/// (then reports the line's heap offset and `from`, the writer, and traps).
WEFT_DEVICE std::uint32_t ll_wait(const World& w, const std::uint64_t* line, std::uint32_t flag, int from = -1) {
  std::uint32_t payload, seen;
  std::uint64_t start = 0;
  std::uint32_t spins = 0;
  while (true) {
    asm volatile("ld.volatile.global.v2.u32 {%0, %1}, [%2];" : "=r"(payload), "=r"(seen) : "l"(line) : "memory");
    if (seen == flag) return payload;
    if (w.wait_timeout_ns != 0 && (++spins & 1023u) == 0) {
      std::uint64_t now = globaltimer_ns();
      if (start == 0) start = now;
      else if (now - start > w.wait_timeout_ns) detail::report_wait_timeout(w, line, Cmp::eq, flag, seen, now - start, from);
    }
  }
}

}  // namespace weft::dev
#endif  // __CUDACC__
