// module.cpp - weft._C: initialisation over torch.distributed's rendezvous, and symmetric tensors.
// The ops themselves are dispatcher ops (ops.cpp); this module holds what is not an op,
// the expert-parallel classes (ep.cpp) and ag_moe_check_errors (moe_tp.cpp).
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <pybind11/stl.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/extension.h>
#include <torch/headeronly/version.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "c10d_store.hpp"
#include "runtime.hpp"
#include "weft/core/env.hpp"
#include "weft/core/error.hpp"
#include "weft/runtime/launch_env.hpp"

namespace py = pybind11;

#define WEFT_STR2(x) #x
#define WEFT_STR(x) WEFT_STR2(x)
#define WEFT_TORCH_VERSION WEFT_STR(TORCH_VERSION_MAJOR) "." WEFT_STR(TORCH_VERSION_MINOR) "." WEFT_STR(TORCH_VERSION_PATCH)

namespace weft_torch {

void bind_ep(py::module_& m);      // ep.cpp: the expert-parallel classes
void bind_moe_tp(py::module_& m);  // moe_tp.cpp: ag_moe_check_errors
/// ops.cpp: `calls` all-reduces of `x` from C++, through the op's CUDA kernel
/// function or through the dispatcher: what tools/bench/host_overhead.py
/// subtracts from the Python call to split its time.
void enqueue_all_reduces(const at::Tensor& x, const std::string& group_name, std::int64_t calls, bool in_place,
                         bool through_dispatcher);

namespace {

/// Collective: meets the other ranks through `store`, checks that they agree,
/// and builds the Context (team, GPU, heap) over that store.
void init(c10::intrusive_ptr<c10d::Store> store, int rank, int world, std::uint64_t heap_bytes,
          const std::string& group_name, double timeout_s, int device, bool nccl) {
  guarded("init", [&] {
    if (auto rt = runtime_or_null())
      throw std::runtime_error(weft::str("weft.init: weft is already initialised in this process (rank ",
                                         rt->ctx().rank(), " of ", rt->ctx().world_size(), ", group \"",
                                         rt->group_name(), "\"); call weft.shutdown() before initialising it again"));
    const weft::EnvMap env = weft::process_env();
    const auto timeout = timeout_s > 0 ? std::chrono::milliseconds(static_cast<std::int64_t>(timeout_s * 1000))
                                       : weft::env_seconds(env, "WEFT_STORE_TIMEOUT", std::chrono::seconds(120));
    if (heap_bytes == 0) heap_bytes = weft::env_bytes(env, "WEFT_HEAP_SIZE", std::uint64_t{1} << 30);
    auto s = make_c10d_store(std::move(store), rank, world, timeout);

    // Every rank must describe the same job: world, group, heap size, weft build.
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    const std::string job = weft::str("world ", world, ", group \"", group_name, "\", heap ", heap_bytes, " bytes (",
                                      weft::format_bytes(heap_bytes), "), weft built against torch ", WEFT_TORCH_VERSION);
    auto jobs = s->all_gather(job, "weft.init: job description");
    std::string differ;
    for (int r = 0; r < world; ++r)
      if (jobs[r] != jobs[0]) differ += weft::str("\n  rank ", r, ": ", jobs[r]);
    if (!differ.empty())
      throw std::runtime_error(weft::str("weft.init: the ranks disagree on the job:\n  rank 0: ", jobs[0], differ,
                                         "\nEvery rank must call weft.init with the same group and heap size "
                                         "(heap_size, else WEFT_HEAP_SIZE)."));
    auto hosts = s->all_gather(host, "weft.init: host names");

    weft::LaunchEnv le;
    le.rank = rank;
    le.world_size = world;
    std::vector<std::string> nodes;
    for (int r = 0; r < world; ++r) {
      if (std::find(nodes.begin(), nodes.end(), hosts[r]) == nodes.end()) nodes.push_back(hosts[r]);
      if (hosts[r] == hosts[rank]) {
        if (r < rank) ++le.local_rank;
      }
    }
    le.local_world_size = static_cast<int>(std::count(hosts.begin(), hosts.end(), hosts[rank]));
    le.node_rank = static_cast<int>(std::find(nodes.begin(), nodes.end(), hosts[rank]) - nodes.begin());
    le.master_addr = "(torch.distributed store)";
    le.master_port = 0;
    le.launcher = "torch.distributed";
    auto it = env.find("WEFT_SHARE_GPU");
    if (it != env.end()) {
      auto sharing = weft::parse_gpu_sharing(it->second);
      if (!sharing)
        throw std::runtime_error("weft.init: WEFT_SHARE_GPU='" + it->second + "' is not one of auto, off, mps, timeslice");
      le.gpu_sharing = *sharing;
    }
    if (device >= 0) ::setenv("WEFT_DEVICE", std::to_string(device).c_str(), 1);

    weft::ContextOptions options;
    options.heap_bytes = heap_bytes;
    options.create_nccl = nccl;
    options.store_timeout = timeout;
    auto ctx = weft::Context::create(le, std::move(s), options);
    g_runtime = std::make_shared<Runtime>(std::move(ctx), group_name);
  });
}

void shutdown() {
  if (g_runtime) {
    auto rt = std::move(g_runtime);
    guarded("shutdown", [&] { rt->close(); });
  }
}

/// Collective: a uint8 tensor of `bytes` in the symmetric heap (the Python side views it as the dtype and shape).
at::Tensor empty_bytes(std::uint64_t bytes, const std::string& type) {
  return guarded("empty", [&] {
    auto rt = runtime_or_null();
    TORCH_CHECK(rt, "weft.empty: weft is not initialised in this process: call weft.init() first");
    c10::cuda::CUDAGuard guard(rt->device());
    TORCH_CHECK(!capturing(at::cuda::getCurrentCUDAStream(rt->device()).stream()),
                "weft.empty: symmetric tensors cannot be allocated during CUDA graph capture (allocation is "
                "collective and synchronises the GPU); allocate them before capturing");
    void* p = rt->allocate(bytes, type);
    return at::from_blob(
        p, {static_cast<std::int64_t>(bytes)}, [rt](void* q) { rt->release(q); },
        at::TensorOptions().dtype(at::kByte).device(at::kCUDA, rt->device()));
  });
}

bool tensor_in_heap(const at::Tensor& t) {
  auto rt = runtime_or_null();
  return rt && t.defined() && t.is_cuda() && in_heap(*rt, t);
}

at::Tensor peer_view(const at::Tensor& t, int64_t peer) {
  return guarded("peer_view", [&] {
    auto rt = runtime_or_null();
    TORCH_CHECK(rt, "weft.peer_view: weft is not initialised in this process: call weft.init() first");
    const int world = rt->ctx().world_size();
    TORCH_CHECK_VALUE(peer >= 0 && peer < world, "weft.peer_view: argument 'rank' must be in [0, ", world, "), got ",
                      peer);
    TORCH_CHECK_VALUE(tensor_in_heap(t), "weft.peer_view: argument 't' must be a tensor in weft's symmetric heap "
                      "(allocate it with weft.empty or weft.zeros), but it is not");
    void* p = rt->ctx().heap().peer_ptr(t.data_ptr(), static_cast<int>(peer));
    at::Tensor keep = t;  // the view keeps this rank's tensor, and so its block, alive
    return at::from_blob(
        p, t.sizes(), t.strides(), [keep](void*) mutable { keep = at::Tensor(); }, t.options());
  });
}

py::dict info() {
  py::dict d;
  auto rt = runtime_or_null();
  d["initialized"] = static_cast<bool>(rt);
  if (!rt) return d;
  auto& ctx = rt->ctx();
  d["rank"] = ctx.rank();
  d["world_size"] = ctx.world_size();
  d["device"] = rt->device();
  d["group_name"] = rt->group_name();
  d["heap_bytes"] = ctx.heap().capacity();
  d["heap_in_use"] = ctx.heap().allocator().bytes_in_use();
  d["live_tensors"] = rt->live_tensors();
  d["pending_frees"] = rt->pending_frees();
  d["plans"] = rt->plan_count();
  d["shares_gpu"] = ctx.team().shares_gpus();
  d["nccl"] = ctx.has_nccl();
  d["nodes"] = ctx.team().num_nodes;
  d["across_nodes"] = !ctx.all_peers_direct();          // some peer is reached only through NVSHMEM
  d["two_level_ready"] = rt->remote_peers();              // weft::RemotePeers alive: the two-level schedules
  d["internode_linked"] = weft_torch::internode_linked();  // this build has weft::internode
  return d;
}

/// weft._C._PlanKey(kind, fields): the key an op's plan is cached under, for the
/// CPU tests (which plans share a key, its hash and its text) where no plan
/// can be built.
PlanKey plan_key_of(const std::string& kind, const std::vector<std::int64_t>& fields) {
  const auto k = plan_kind_named(kind);
  if (!k) throw py::value_error("weft._C._PlanKey: no plan kind \"" + kind + "\"");
  const int want = kind_info(*k).fields;
  if (static_cast<int>(fields.size()) != want)
    throw py::value_error(weft::str("weft._C._PlanKey: a ", kind, " key has ", want, " fields, got ", fields.size()));
  PlanKey key;
  key.kind = *k;
  for (int i = 0; i < want; ++i) key.fields[i] = fields[i];
  return key;
}

}  // namespace
}  // namespace weft_torch

PYBIND11_MODULE(_C, m) {
  using namespace weft_torch;
  m.doc() = "weft's C++ core for the weft Python package (the ops are under torch.ops.weft)";
  m.def("init", &init, py::arg("store"), py::arg("rank"), py::arg("world_size"), py::arg("heap_bytes"),
        py::arg("group_name"), py::arg("timeout_s"), py::arg("device"), py::arg("nccl"));
  m.def("shutdown", &shutdown);
  m.def("empty_bytes", &empty_bytes, py::arg("bytes"), py::arg("type"));
  m.def("collect", [] { if (auto rt = runtime_or_null()) guarded("collect", [&] { rt->collect(); }); });
  m.def("in_heap", &tensor_in_heap);
  m.def("peer_view", &peer_view);
  m.def("info", &info);
  m.def("_enqueue_all_reduces", &enqueue_all_reduces, py::arg("x"), py::arg("group_name"), py::arg("calls"),
        py::arg("in_place"), py::arg("through_dispatcher"),
        "Enqueues `calls` sum all-reduces of x from C++ (host-overhead measurement): through the op's CUDA kernel "
        "function, or through the dispatcher's typed call");
  bind_ep(m);
  bind_moe_tp(m);
  py::class_<PlanKey>(m, "_PlanKey", "The key an op's plan is cached under (for tests): its kind and integers")
      .def(py::init(&plan_key_of), py::arg("kind"), py::arg("fields"))
      .def("__eq__", [](const PlanKey& a, const PlanKey& b) { return a == b; }, py::is_operator())
      .def("__hash__", [](const PlanKey& k) { return k.hash(); })
      .def_property_readonly("hash", [](const PlanKey& k) { return k.hash(); })
      .def("__str__", &PlanKey::str)
      .def("__repr__", [](const PlanKey& k) { return "_PlanKey(" + k.str() + ")"; });
  m.attr("torch_version") = WEFT_TORCH_VERSION;
}
