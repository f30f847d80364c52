#include "c10d_store.hpp"

#include <exception>
#include <thread>
#include <utility>
#include <vector>

#include "weft/core/error.hpp"

namespace weft_torch {
namespace {

class C10dStore final : public weft::Store {
 public:
  C10dStore(c10::intrusive_ptr<c10d::Store> store, int rank, int world, std::chrono::milliseconds timeout)
      : store_(std::move(store)), rank_(rank), world_(world), timeout_(timeout) {
    WEFT_REQUIRE(store_, "weft: no torch.distributed store to meet the other ranks through");
    WEFT_REQUIRE(world_ >= 1 && rank_ >= 0 && rank_ < world_, "weft: rank ", rank_, " is outside a world of ", world_);
  }

  /// Rank 0 may hold the store's server (init_process_group without torchrun):
  /// it waits, up to 2 s, until every rank has read the last exchange.
  ~C10dStore() override {
    if (rank_ != 0 || next_ == 0 || !failed_.empty()) return;
    const std::string done = "weft/op/" + std::to_string(next_ - 1) + "/done";
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    try {
      while (store_->check({done}) && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    } catch (...) {
    }
  }

  std::vector<std::string> all_gather(std::string_view blob, std::string_view what) override {
    return exchange("all_gather", blob, what);
  }

  std::string broadcast(int root, std::string_view blob, std::string_view what) override {
    WEFT_REQUIRE(root >= 0 && root < world_, "broadcast '", what, "': root ", root, " is outside the world of ", world_);
    auto all = exchange("broadcast from " + std::to_string(root), rank_ == root ? blob : std::string_view(), what);
    return all[root];
  }

  void barrier(std::string_view what) override { exchange("barrier", {}, what); }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::chrono::milliseconds timeout() const override { return timeout_; }

 private:
  std::vector<std::string> exchange(const std::string& kind, std::string_view payload, std::string_view what) {
    WEFT_REQUIRE(failed_.empty(), "the rendezvous store is unusable after an earlier error: ", failed_);
    const std::uint64_t n = next_++;
    const std::string prefix = "weft/op/" + std::to_string(n) + "/";
    try {
      std::string mine = kind + "\n" + std::string(payload);
      store_->set(prefix + std::to_string(rank_), std::vector<std::uint8_t>(mine.begin(), mine.end()));
      std::vector<std::string> keys;
      for (int r = 0; r < world_; ++r) keys.push_back(prefix + std::to_string(r));
      try {
        store_->wait(keys, timeout_);
      } catch (const std::exception& e) {
        std::string missing;
        for (int r = 0; r < world_; ++r) {
          bool there = false;
          try {
            there = store_->check({keys[r]});
          } catch (...) {
          }
          if (!there) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        }
        fail(weft::str("rendezvous '", what, "' (store op #", n, ") timed out after ", timeout_.count() / 1000.0,
                       " s waiting for rank(s) ", missing.empty() ? std::string("?") : missing,
                       " (through torch.distributed's store: ", e.what(), ")"));
      }
      std::vector<std::string> kinds(world_), blobs(world_);
      for (int r = 0; r < world_; ++r) {
        auto v = store_->get(keys[r]);
        std::string s(v.begin(), v.end());
        auto nl = s.find('\n');
        WEFT_REQUIRE(nl != std::string::npos, "corrupt rendezvous entry from rank ", r, " for '", what, "'");
        kinds[r] = s.substr(0, nl);
        blobs[r] = s.substr(nl + 1);
      }
      std::string differ;
      for (int r = 0; r < world_; ++r)
        if (kinds[r] != kinds[rank_]) differ += weft::str("\n  rank ", r, ": ", kinds[r]);
      if (!differ.empty())
        fail(weft::str("ranks called different rendezvous operations as store op #", n, ": rank ", rank_, " (", what,
                       "): ", kinds[rank_], differ));
      if (store_->add(prefix + "done", 1) == world_) {  // every rank has read op n: drop its keys
        for (auto& k : keys) store_->deleteKey(k);
        store_->deleteKey(prefix + "done");
      }
      return blobs;
    } catch (const weft::Error&) {
      throw;
    } catch (const std::exception& e) {
      fail(weft::str("rendezvous '", what, "' (store op #", n, ") failed in torch.distributed's store: ", e.what()));
    }
  }

  [[noreturn]] void fail(const std::string& message) {
    failed_ = message;
    WEFT_FAIL(message);
  }

  c10::intrusive_ptr<c10d::Store> store_;
  int rank_, world_;
  std::chrono::milliseconds timeout_;
  std::uint64_t next_ = 0;
  std::string failed_;
};

}  // namespace

std::unique_ptr<weft::Store> make_c10d_store(c10::intrusive_ptr<c10d::Store> store, int rank, int world,
                                             std::chrono::milliseconds timeout) {
  return std::make_unique<C10dStore>(std::move(store), rank, world, timeout);
}

}  // namespace weft_torch
