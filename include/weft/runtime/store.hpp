// weft/runtime/store.hpp - the rendezvous store: a TCP meeting point for all ranks of a job.
//
// Rank 0 serves; every rank (rank 0 too) is a client. Three collective
// operations, each called by every rank in the same order, each with a timeout:
// all_gather of byte blobs, broadcast from a root, and barrier. They are for
// set-up (exchanging IDs, handles, sizes), not for data paths.
//
// Failures are job-wide and loud: the server checks that every rank's n-th call
// is the same operation (and the same broadcast root), notices a rank whose
// connection drops, and tells every waiting rank, naming the rank at fault. A
// timeout names the ranks that had not arrived. After any error a Store is
// unusable: every later call throws, quoting the first error.
//
// Blocking socket calls are bounded by the timeout (poll with deadlines); the
// one exception is host name resolution (getaddrinfo), which follows the
// system resolver's own limits. Numeric addresses never touch the resolver.
//
// Wire protocol: see src/runtime/store.cpp.
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
  /// join, and how long each collective waits for the slowest rank. Rank 0's
  /// destructor also waits up to this long for the other ranks to close.
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
};

/// A connected rendezvous store. Not thread-safe: one thread per process uses it.
class Store {
 public:
  /// Joins the job's store. Rank 0 starts the server (a background thread,
  /// listening on master_port on all interfaces, IPv4 and IPv6) before
  /// connecting to it; every rank connects to master_addr (a host name or an
  /// IPv4/IPv6 address; each address it resolves to is tried), retrying until
  /// the master appears. Blocks until all world_size ranks have joined.
  ///
  /// Scope: host. Blocking: yes, at most options.timeout (plus at most
  /// min(timeout, 2 s) to ask the server who is missing). Throws
  /// weft::Error for invalid options; when the master stays unreachable
  /// (naming address:port, the rank, the time waited and the last error);
  /// when rank 0 cannot listen on the port; when a rank reports a different
  /// world size (on that rank and on rank 0, naming both sizes) or a rank
  /// number joins twice; and when some ranks have not joined within the
  /// timeout (naming them, the address and the timeout).
  static std::unique_ptr<Store> connect(const StoreOptions& options);

  /// Closes this rank's connection in an orderly way (other ranks that still
  /// call collectives then learn that this rank closed its store). On rank 0 it
  /// also stops the server after the other ranks have closed their stores or
  /// the timeout has passed, so results already sent still reach them.
  /// Scope: host. Blocking: up to about 2 s (rank 0: up to the timeout). Never throws.
  virtual ~Store() = default;

  /// Every rank contributes a blob; every rank receives all blobs, indexed by rank.
  /// `what` names the exchange in errors ("heap handles"). Blobs are arbitrary
  /// bytes (zeros included) of any size, though meant for set-up data (KB to tens of MB).
  ///
  /// Scope: host; every rank must call it, in the same order relative to the
  /// other collectives. Blocking: yes, at most timeout(), plus at most
  /// min(timeout(), 2 s) after a timeout to ask the server who is missing. Throws weft::Error on
  /// timeout (naming `what`, the op number, the address, the time waited and
  /// the ranks that had not arrived); when a rank's connection drops or it
  /// closes its store before calling this op (naming it); when ranks called
  /// different operations as this op (naming each rank's call); and when the
  /// store is unusable after an earlier error.
  virtual std::vector<std::string> all_gather(std::string_view blob, std::string_view what) = 0;

  /// Returns root's blob on every rank (other ranks' `blob` is ignored and not sent).
  /// Scope: host; every rank calls it with the same root. Blocking: as
  /// all_gather. Throws as all_gather does; also when root is outside
  /// [0, world_size) or when ranks disagree on the root.
  virtual std::string broadcast(int root, std::string_view blob, std::string_view what) = 0;

  /// Returns once every rank has called barrier (same order on every rank).
  /// Scope: host. Blocking: as all_gather. Throws as all_gather does.
  virtual void barrier(std::string_view what) = 0;

  /// This process's rank. Scope: host. Blocking: no.
  virtual int rank() const = 0;
  /// The number of ranks in the job. Scope: host. Blocking: no.
  virtual int world_size() const = 0;
  /// The timeout each collective waits before it fails. Scope: host. Blocking: no.
  virtual std::chrono::milliseconds timeout() const = 0;
};

}  // namespace weft
