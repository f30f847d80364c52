#include "runtime.hpp"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <vector>

#include "weft/core/error.hpp"
#include "weft/core/log.hpp"

namespace weft_torch {

std::shared_ptr<Runtime> g_runtime;  // set by weft.init (module.cpp)

std::shared_ptr<Runtime> runtime_or_null() { return g_runtime && !g_runtime->closed() ? g_runtime : nullptr; }

void not_initialised(const char* op) {
  TORCH_CHECK(false, "weft.", op,
              ": weft is not initialised in this process: call weft.init() (inside torchrun, or after "
              "torch.distributed.init_process_group) first");
}

void* Runtime::allocate(std::uint64_t bytes, const std::string& type) {
  collect();
  void* p = ctx_->heap().alloc(bytes, type, "torch tensor");
  std::lock_guard<std::mutex> lock(mu_);
  ++live_;
  return p;
}

void Runtime::release(void* p) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!ctx_) return;  // closed: the heap is gone already
  --live_;
  pending_.insert(static_cast<std::uint64_t>(static_cast<char*>(p) - ctx_->heap().base()));
}

std::uint64_t Runtime::pending_frees() {
  std::lock_guard<std::mutex> lock(mu_);
  return pending_.size();
}

void Runtime::collect() {
  std::vector<std::uint64_t> mine;
  {
    std::lock_guard<std::mutex> lock(mu_);
    mine.assign(pending_.begin(), pending_.end());
  }
  std::string blob(mine.size() * sizeof(std::uint64_t), '\0');
  if (!mine.empty()) std::memcpy(blob.data(), mine.data(), blob.size());
  auto all = ctx_->store().all_gather(blob, "symmetric tensors released");
  // Free what every rank has released, in offset order: the same list on every rank.
  std::vector<std::uint64_t> common = mine;
  for (const auto& b : all) {
    std::vector<std::uint64_t> theirs(b.size() / sizeof(std::uint64_t));
    if (!theirs.empty()) std::memcpy(theirs.data(), b.data(), theirs.size() * sizeof(std::uint64_t));
    std::vector<std::uint64_t> both;
    std::set_intersection(common.begin(), common.end(), theirs.begin(), theirs.end(), std::back_inserter(both));
    common.swap(both);
  }
  if (common.empty()) return;
  // Work queued on this GPU may still use the blocks, and peers' work may
  // still write into them: every rank finishes its GPU work before the first
  // free's exchange, which no rank passes before all have reached it.
  WEFT_CUDA(cudaDeviceSynchronize());
  for (std::uint64_t offset : common) {
    ctx_->heap().free(ctx_->heap().base() + offset);
    std::lock_guard<std::mutex> lock(mu_);
    pending_.erase(offset);
  }
}

AnyPlan& Runtime::build(const char* op, const PlanKey& key, cudaStream_t stream,
                        const std::function<std::unique_ptr<AnyPlan>()>& make) {
  TORCH_CHECK(!capturing(stream), "weft.", op, ": the first call for ", key.str(),
              " is being captured into a CUDA graph, but it builds the operator's plan (collectively: it allocates "
              "in the symmetric heap, checks the call across ranks and tunes or times its paths), which cannot be "
              "captured. Call the op once with these shapes before capturing (a warm-up run).");
  // Every rank builds the plan of the same call: each operator's constructor
  // compares it across ranks (Context::verify_same_call: its sizes, dtype and
  // variant) before it allocates, so that ranks passing different shapes get
  // an error naming both, rather than a kernel that waits for data no peer sends.
  auto made = make();
  auto& slot = plans_[key];
  slot = std::move(made);
  return *slot;
}

void Runtime::drop_plans() {
  std::vector<std::pair<PlanKey, std::unique_ptr<AnyPlan>>> ordered;
  ordered.reserve(plans_.size());
  for (auto& [key, plan] : plans_) ordered.emplace_back(key, std::move(plan));
  plans_.clear();
  std::sort(ordered.begin(), ordered.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& entry : ordered) entry.second.reset();
}

Runtime::~Runtime() {
  drop_plans();
  remote_peers_.reset();  // before the Context, whose NVSHMEM it releases its state in
}

void Runtime::close() {
  if (!ctx_) return;
  try {
    WEFT_CUDA(cudaDeviceSynchronize());
    drop_plans();
    remote_peers_.reset();  // collective: its barrier's buffers are freed on every rank
  } catch (const std::exception& e) {
    WEFT_LOG(warn, "weft.shutdown: ", e.what());
  }
  std::shared_ptr<weft::Context> ctx;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.clear();
    ctx.swap(ctx_);  // deleters from now on find no heap and do nothing
  }
  ctx.reset();  // the heap meets its peers, then unmaps
}

}  // namespace weft_torch
