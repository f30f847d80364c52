// tile_walk.hpp (private) - the hooked tile scheduler's row orders, as plain
// functions shared by the kernel (device) and the CPU tests (host).
//
// CUTLASS's persistent scheduler hands out tiles in a fixed walk; along N
// (the order hooked plans keep), its row position only grows, band by band.
// HookedScheduler maps that position to the row tile a tile computes:
//   - rotated: start at a chosen row tile and wrap (AllGather+GEMM starts at
//     the local shard; the adding way at the peer's block);
//   - descending blocks: walk whole blocks of rows, from a first block down,
//     wrapping, each block's row tiles ascending. GEMM+ReduceScatter's ring
//     in one launch computes block (r - 1 - s) mod W at step s
//     (schedule::ring_gemm_block), the order its side stream sends the blocks
//     in; the CPU tests check the two orders are the same at 1 to 8 ranks.
// Positions and row tiles are in tiles of the kernel's height; a cluster of
// CTAs along M keeps its rows together where a block holds whole clusters.
#pragma once

#include "weft/device/types.cuh"

namespace weft::gemm_detail {

/// The row tile at position `position` of a walk that starts at row tile
/// `rotate_tiles` and wraps at `tiles_m` (position, rotate_tiles < tiles_m).
WEFT_HD int rotated_row_tile(int position, int rotate_tiles, int tiles_m) {
  return (position + rotate_tiles) % tiles_m;
}

/// The block of rows at position `position` of a walk over `blocks` blocks of
/// `tiles_per_block` row tiles each that goes down from `first_block`:
/// positions [s x tiles_per_block, (s + 1) x tiles_per_block) are block
/// (first_block - s) mod blocks. Needs first_block < blocks and position <
/// blocks x tiles_per_block, so one addition wraps it (no second division in a
/// scheduler that every warp of the kernel runs).
WEFT_HD int descending_walk_block(int position, int first_block, int tiles_per_block, int blocks) {
  const int block = first_block - position / tiles_per_block;
  return block < 0 ? block + blocks : block;
}

/// The row tile at position `position` of that walk: its block's row tiles in
/// ascending order.
WEFT_HD int descending_walk_row_tile(int position, int first_block, int tiles_per_block, int blocks) {
  return descending_walk_block(position, first_block, tiles_per_block, blocks) * tiles_per_block +
         position % tiles_per_block;
}

}  // namespace weft::gemm_detail
