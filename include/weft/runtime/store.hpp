// weft/runtime/store.hpp - the rendezvous store: a TCP meeting point for all ranks of a job.
//
// Rank 0 serves; every rank (rank 0 too) is a client. Three collective
// operations, each called by every rank in the same order, each with a timeout:
// all_gather of byte blobs, broadcast from a root, and barrier. They are for
// set-up (exchanging IDs, handles, sizes), not for data paths.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace weft {

/// Settings for Store::connect.
struct StoreOptions {
  std::string master_addr = "127.0.0.1";  ///< host name or IPv4/IPv6 address of rank 0
  int master_port = 29517;                ///< TCP port rank 0 listens on
  int rank = 0;
  int world_size = 1;
  /// How long connect waits for the master to appear and for every rank to
  /// join, and how long each collective waits for the slowest rank.
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
};

/// A connected rendezvous store. Not thread-safe: one thread per process uses it.
class Store {
 public:
  /// Joins the job's store. Rank 0 starts the server (binding master_port on all
  /// interfaces) before connecting to it. Blocks until all world_size ranks have
  /// joined. Throws weft::Error naming the address and rank when the master is
  /// unreachable, when a rank reports a different world size (naming both sizes),
  /// or when some ranks never arrive within the timeout (naming them).
  static std::unique_ptr<Store> connect(const StoreOptions& options);

  virtual ~Store() = default;

  /// Every rank contributes a blob; every rank receives all blobs, indexed by rank.
  /// `what` names the exchange in errors ("heap handles"). Throws on timeout,
  /// naming the ranks that have not arrived, and when a peer's connection drops.
  virtual std::vector<std::string> all_gather(std::string_view blob, std::string_view what) = 0;

  /// Returns root's blob on every rank (other ranks' `blob` is ignored).
  virtual std::string broadcast(int root, std::string_view blob, std::string_view what) = 0;

  /// Returns once every rank has called barrier (same order on every rank).
  virtual void barrier(std::string_view what) = 0;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  /// The timeout each collective waits before it fails.
  virtual std::chrono::milliseconds timeout() const = 0;
};

}  // namespace weft
