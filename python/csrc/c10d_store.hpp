// c10d_store.hpp - weft's rendezvous store (weft::Store) over a torch.distributed c10d store.
//
// weft.init(group) meets the other ranks through the store the job already
// has (torchrun's, or the one init_process_group made), so weft opens no port
// of its own and reads no variable of its own. The three collectives of
// weft::Store map onto c10d's set / wait / get:
//   op n, rank r: set "<n>/<r>" = "<kind>\n<payload>"; wait for "<n>/0".."<n>/<W-1>"
//   (bounded by the timeout; on expiry the keys still missing name the ranks
//   that had not arrived); get them all; compare the kinds (the same operation,
//   the same broadcast root, on every rank, as weft's TCP store checks); then
//   add 1 to "<n>/done", and the rank that brings it to W deletes op n's keys.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <memory>
#include <string>

#include "weft/runtime/store.hpp"

namespace weft_torch {

/// A weft::Store of `world` ranks over `store` (a c10d store every rank of the
/// job reaches; keys are written under it as they are: pass a PrefixStore).
std::unique_ptr<weft::Store> make_c10d_store(c10::intrusive_ptr<c10d::Store> store, int rank, int world,
                                             std::chrono::milliseconds timeout);

}  // namespace weft_torch
