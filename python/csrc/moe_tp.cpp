// moe_tp.cpp - torch.ops.weft.ag_moe and moe_rs: MoE under tensor parallelism
// (weft/ops/moe_tp.hpp), the AllGather + up-projection grouped GEMM and the
// down-projection grouped GEMM + top-k weighted sum + ReduceScatter.
//
// Dispatcher ops with fake kernels rather than classes [0060]: every output's
// shape follows from the inputs' shapes and the plan's constants (ag_moe's h
// has world x max_tokens_per_rank x top_k rows, however many pairs the
// routing makes; moe_rs's out has num_tokens rows), and nothing is read on
// the host, so torch.compile traces them and a warmed-up call captures into a
// CUDA graph. The state that passes from AgMoe to MoeRs (the routing's device
// maps, MoeRouting) is returned as tensors - copies of the plan's maps, made
// on the stream - and handed back to moe_rs, which rebuilds a MoeRouting over
// them: the ops are functions of their arguments, and a routing stays valid
// however many runs follow. The plans live in the Runtime's plan cache, keyed
// on the options every rank shares (building a plan is collective; the slice
// of F, which may differ by rank, picks a grouped GEMM locally). `mode` picks
// each plan's path as AgMoeOptions / MoeRsOptions::mode do: sequential (the
// default), fused (overlapped), or automatic (timed on the first call);
// moe_rs's overlapped path needs the routing's expert_offset and row_token,
// which ag_moe returns. The fake kernels are in weft/_moe_tp.py.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <tuple>

#include "runtime.hpp"
#include "weft/core/error.hpp"
#include "weft/ops/moe_tp.hpp"

namespace py = pybind11;

namespace weft_torch {
namespace {

// A plan is keyed on what every rank agrees on (building one is collective); the slice of F,
// which may differ by rank, selects one of its grouped GEMMs locally (use_slice), and
// `slices` records the widths already set up, so a new one under graph capture is refused.
struct AgMoePlan : AnyPlan {
  std::unique_ptr<weft::AgMoe> op;
  std::set<int64_t> slices;
};
struct MoeRsPlan : AnyPlan {
  std::unique_ptr<weft::MoeRs> op;
  std::set<int64_t> slices;
};

// Selects the plan's grouped GEMM for a slice of `width` (building it on first use, not while
// `stream` is being captured: it allocates).
template <class Plan>
void use_slice(const char* op, const char* arg, Plan& plan, int64_t width, cudaStream_t stream) {
  if (!plan.slices.count(width))
    TORCH_CHECK(!capturing(stream), "weft.", op, ": the first call with ", arg, " = ", width,
                " is being captured into a CUDA graph; it sets up a grouped GEMM (it allocates): call once "
                "outside the capture first");
  plan.op->use_slice(width);
  plan.slices.insert(width);
}

/// bf16 or fp16, the grouped GEMMs' types.
weft::DType half_type(const char* op, const char* arg, const at::Tensor& t) {
  TORCH_CHECK_TYPE(t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf, "weft.", op, ": argument '", arg,
                   "' must be torch.bfloat16 or torch.float16, got ", dtype_name(t.scalar_type()));
  return t.scalar_type() == at::kHalf ? weft::DType::fp16 : weft::DType::bf16;
}

void check_aligned(const char* op, const char* arg, const at::Tensor& t) {
  TORCH_CHECK_VALUE(reinterpret_cast<std::uintptr_t>(t.data_ptr()) % 16 == 0, "weft.", op, ": argument '", arg,
                    "' must start at a 16-byte aligned address (rows move as 16-byte vectors); it is a view at an "
                    "offset: pass a copy (.clone())");
}

void check_rank(const char* op, const char* arg, const at::Tensor& t, int dims, const char* shape) {
  TORCH_CHECK_VALUE(t.dim() == dims, "weft.", op, ": argument '", arg, "' must have shape ", shape, ", got ",
                    shape_of(t));
}

/// A device tensor of this rank's GPU, contiguous.
void check_dense(const char* op, const char* arg, const at::Tensor& t, Runtime& rt) {
  check_device(op, arg, t, rt);
  check_contiguous(op, arg, t);
}

/// The path a plan takes: "sequential", "fused" or "automatic" (weft::OverlapMode).
weft::OverlapMode overlap_mode(const char* op, c10::string_view mode) {
  TORCH_CHECK_VALUE(mode == "sequential" || mode == "fused" || mode == "automatic", "weft.", op,
                    ": argument 'mode' must be 'sequential', 'fused' or 'automatic', got '", std::string(mode), "'");
  return mode == "fused" ? weft::OverlapMode::fused
         : mode == "automatic" ? weft::OverlapMode::automatic
                               : weft::OverlapMode::sequential;
}

/// A fresh tensor of `shape` holding a copy of a plan's device map, copied on the stream.
at::Tensor copy_of(const void* src, at::IntArrayRef shape, at::TensorOptions options, cudaStream_t stream) {
  auto t = at::empty(shape, options);
  if (t.numel() > 0)
    WEFT_CUDA(cudaMemcpyAsync(t.data_ptr(), src, t.nbytes(), cudaMemcpyDeviceToDevice, stream));
  return t;
}

// ---- ag_moe --------------------------------------------------------------------------------

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> ag_moe(
    const at::Tensor& x, const at::Tensor& topk_idx, const at::Tensor& topk_weights, const at::Tensor& w_up,
    int64_t max_tokens_per_rank, c10::string_view group_name, int64_t max_sms, c10::string_view mode) {
  const char* op = "ag_moe";
  return guarded(op, [&] {
    Runtime& rt = runtime(op);
    check_group(op, group_name, rt);
    const weft::OverlapMode path = overlap_mode(op, mode);
    // Every check comes before the plan is built or run: a bad call raises on its rank before any collective.
    check_dense(op, "x", x, rt);
    const weft::DType dtype = half_type(op, "x", x);
    check_rank(op, "x", x, 2, "[T, hidden]");
    if (x.size(0) > 0) check_aligned(op, "x", x);  // an empty view may sit anywhere: nothing is read
    const int64_t T = x.size(0), H = x.size(1);
    check_dense(op, "topk_idx", topk_idx, rt);
    check_dtype(op, "topk_idx", topk_idx, at::kLong);
    TORCH_CHECK_VALUE(topk_idx.dim() == 2 && topk_idx.size(0) == T, "weft.", op,
                      ": argument 'topk_idx' must have shape [T, top_k] with T = ", T, " (x's tokens), got ",
                      shape_of(topk_idx));
    const int64_t k = topk_idx.size(1);
    check_dense(op, "topk_weights", topk_weights, rt);
    check_dtype(op, "topk_weights", topk_weights, at::kFloat);
    TORCH_CHECK_VALUE(topk_weights.sizes() == topk_idx.sizes(), "weft.", op,
                      ": argument 'topk_weights' must have topk_idx's shape ", shape_of(topk_idx), ", got ",
                      shape_of(topk_weights));
    check_dense(op, "w_up", w_up, rt);
    TORCH_CHECK_TYPE(w_up.scalar_type() == x.scalar_type(), "weft.", op, ": argument 'w_up' must have x's dtype ",
                     dtype_name(x.scalar_type()), ", got ", dtype_name(w_up.scalar_type()));
    TORCH_CHECK_VALUE(w_up.dim() == 3 && w_up.size(2) == H, "weft.", op,
                      ": argument 'w_up' must have shape [experts, n_local, hidden] with hidden = ", H,
                      " (x's channels), got ", shape_of(w_up));
    check_aligned(op, "w_up", w_up);
    TORCH_CHECK_VALUE(max_tokens_per_rank >= 1, "weft.", op,
                      ": argument 'max_tokens_per_rank' must be positive, got ", max_tokens_per_rank);
    TORCH_CHECK_VALUE(T <= max_tokens_per_rank, "weft.", op, ": argument 'x' has ", T,
                      " tokens, over max_tokens_per_rank = ", max_tokens_per_rank,
                      " (the most tokens a rank passes: the gathered shards' capacity)");
    const int W = rt.ctx().world_size();
    const weft::AgMoeOptions o{.experts = static_cast<int>(w_up.size(0)),
                               .hidden = H,
                               .n_local = w_up.size(1),
                               .top_k = static_cast<int>(k),
                               .max_tokens_per_rank = max_tokens_per_rank,
                               .dtype = dtype,
                               .max_sms = static_cast<int>(max_sms),
                               .mode = path};
    // The plan's limits, said in its terms (experts, hidden, n_local, top_k, ...), before any collective.
    const std::string why = weft::AgMoe::can_implement(o, W);
    TORCH_CHECK_VALUE(why.empty(), "weft.", op, ": ", why, " (x ", shape_of(x), ", topk_idx ", shape_of(topk_idx),
                      ", w_up ", shape_of(w_up), ")");

    c10::cuda::CUDAGuard guard(rt.device());
    cudaStream_t stream = current_stream(rt);
    // n_local may differ by rank: not in the key (see AgMoePlan).
    const PlanKey key = PlanKey::make<PlanKind::ag_moe>(o.experts, o.hidden, o.top_k, o.max_tokens_per_rank, dtype,
                                                         o.max_sms, o.mode);
    auto& plan = static_cast<AgMoePlan&>(rt.plan(op, key, stream, [&] {
      auto p = std::make_unique<AgMoePlan>();
      p->op = std::make_unique<weft::AgMoe>(rt.ctx_ptr(), o);
      p->slices.insert(o.n_local);
      return p;
    }));
    use_slice(op, "n_local", plan, o.n_local, stream);
    weft::AgMoe& up = *plan.op;
    const int64_t G = static_cast<int64_t>(W) * max_tokens_per_rank;  // gathered tokens
    auto h = at::empty({up.max_rows(), o.n_local}, x.options());
    up.run(x.data_ptr(), topk_idx.data_ptr<std::int64_t>(), topk_weights.data_ptr<float>(), T, w_up.data_ptr(),
           h.data_ptr(), stream);
    // The routing's maps, copied out of the plan on the stream: moe_rs takes them back.
    const weft::MoeRouting& r = up.routing();
    const auto i32 = x.options().dtype(at::kInt);
    auto expert_rows = copy_of(r.expert_rows, {o.experts}, i32, stream);
    auto expert_offset = copy_of(r.expert_offset, {o.experts + 1}, i32, stream);
    auto token_row = copy_of(r.token_row, {G, k}, i32, stream);
    auto token_weight = copy_of(r.token_weight, {G, k}, x.options().dtype(at::kFloat), stream);
    auto row_token = copy_of(r.row_token, {up.max_rows()}, i32, stream);
    return std::make_tuple(h, expert_rows, expert_offset, token_row, token_weight, row_token);
  });
}

// ---- moe_rs --------------------------------------------------------------------------------

at::Tensor moe_rs(const at::Tensor& h, const at::Tensor& expert_rows, const at::Tensor& token_row,
                  const at::Tensor& token_weight, const at::Tensor& w_down, int64_t num_tokens,
                  c10::string_view group_name, int64_t max_sms, c10::string_view mode,
                  const std::optional<at::Tensor>& expert_offset, const std::optional<at::Tensor>& row_token) {
  const char* op = "moe_rs";
  return guarded(op, [&] {
    Runtime& rt = runtime(op);
    check_group(op, group_name, rt);
    const weft::OverlapMode path = overlap_mode(op, mode);
    const int W = rt.ctx().world_size();
    check_dense(op, "h", h, rt);
    const weft::DType dtype = half_type(op, "h", h);
    check_rank(op, "h", h, 2, "[rows, k_local]");
    check_aligned(op, "h", h);
    check_dense(op, "token_row", token_row, rt);
    check_dtype(op, "token_row", token_row, at::kInt);
    TORCH_CHECK_VALUE(token_row.dim() == 2 && token_row.size(0) >= W && token_row.size(0) % W == 0, "weft.", op,
                      ": argument 'token_row' must have shape [world x max_tokens_per_rank, top_k] (world = ", W,
                      "), as ag_moe returned it, got ", shape_of(token_row));
    const int64_t G = token_row.size(0), k = token_row.size(1), cap = G / W;
    check_dense(op, "token_weight", token_weight, rt);
    check_dtype(op, "token_weight", token_weight, at::kFloat);
    TORCH_CHECK_VALUE(token_weight.sizes() == token_row.sizes(), "weft.", op,
                      ": argument 'token_weight' must have token_row's shape ", shape_of(token_row), ", got ",
                      shape_of(token_weight));
    TORCH_CHECK_VALUE(h.size(0) == G * k, "weft.", op, ": argument 'h' must have ", G * k,
                      " rows (world x max_tokens_per_rank x top_k: ag_moe's rows, of which the routing's pairs are "
                      "read), got shape ", shape_of(h));
    check_dense(op, "w_down", w_down, rt);
    TORCH_CHECK_TYPE(w_down.scalar_type() == h.scalar_type(), "weft.", op, ": argument 'w_down' must have h's dtype ",
                     dtype_name(h.scalar_type()), ", got ", dtype_name(w_down.scalar_type()));
    TORCH_CHECK_VALUE(w_down.dim() == 3 && w_down.size(2) == h.size(1), "weft.", op,
                      ": argument 'w_down' must have shape [experts, hidden, k_local] with k_local = ", h.size(1),
                      " (h's columns), got ", shape_of(w_down));
    check_aligned(op, "w_down", w_down);
    const int64_t E = w_down.size(0), H = w_down.size(1);
    check_dense(op, "expert_rows", expert_rows, rt);
    check_dtype(op, "expert_rows", expert_rows, at::kInt);
    TORCH_CHECK_VALUE(expert_rows.dim() == 1 && expert_rows.size(0) == E, "weft.", op,
                      ": argument 'expert_rows' must have shape [experts] = [", E, "] (w_down's experts), got ",
                      shape_of(expert_rows));
    TORCH_CHECK_VALUE(num_tokens >= 0 && num_tokens <= cap, "weft.", op, ": argument 'num_tokens' must be in [0, ",
                      cap, "] (max_tokens_per_rank, from token_row's ", G, " gathered tokens over ", W,
                      " ranks), got ", num_tokens);
    // The overlapped path finds each destination's rows by bisection over the sorted rows' tokens.
    if (path != weft::OverlapMode::sequential) {
      TORCH_CHECK_VALUE(expert_offset.has_value() && row_token.has_value(), "weft.", op, ": mode '",
                        std::string(mode), "' needs the routing's expert_offset and row_token (pass the MoeTpRouting "
                        "that weft.ag_moe returned)");
      check_dense(op, "expert_offset", *expert_offset, rt);
      check_dtype(op, "expert_offset", *expert_offset, at::kInt);
      TORCH_CHECK_VALUE(expert_offset->dim() == 1 && expert_offset->size(0) == E + 1, "weft.", op,
                        ": argument 'expert_offset' must have shape [experts + 1] = [", E + 1, "], got ",
                        shape_of(*expert_offset));
      check_dense(op, "row_token", *row_token, rt);
      check_dtype(op, "row_token", *row_token, at::kInt);
      TORCH_CHECK_VALUE(row_token->dim() == 1 && row_token->size(0) == G * k, "weft.", op,
                        ": argument 'row_token' must have shape [world x max_tokens_per_rank x top_k] = [", G * k,
                        "], got ", shape_of(*row_token));
    }
    const weft::MoeRsOptions o{.experts = static_cast<int>(E),
                               .hidden = H,
                               .k_local = h.size(1),
                               .top_k = static_cast<int>(k),
                               .max_tokens_per_rank = cap,
                               .dtype = dtype,
                               .max_sms = static_cast<int>(max_sms),
                               .mode = path};
    const std::string why = weft::MoeRs::can_implement(o, W);
    TORCH_CHECK_VALUE(why.empty(), "weft.", op, ": ", why, " (h ", shape_of(h), ", token_row ", shape_of(token_row),
                      ", w_down ", shape_of(w_down), ")");

    c10::cuda::CUDAGuard guard(rt.device());
    cudaStream_t stream = current_stream(rt);
    // k_local may differ by rank: not in the key (see MoeRsPlan).
    const PlanKey key = PlanKey::make<PlanKind::moe_rs>(o.experts, o.hidden, o.top_k, o.max_tokens_per_rank, dtype,
                                                         o.max_sms, o.mode);
    auto& plan = static_cast<MoeRsPlan&>(rt.plan(op, key, stream, [&] {
      auto p = std::make_unique<MoeRsPlan>();
      p->op = std::make_unique<weft::MoeRs>(rt.ctx_ptr(), o);
      p->slices.insert(o.k_local);
      return p;
    }));
    use_slice(op, "k_local", plan, o.k_local, stream);
    // The routing over the tensors ag_moe returned (MoeRs reads the counts and the pair maps only).
    weft::MoeRouting r;
    r.world = W;
    r.experts = o.experts;
    r.top_k = o.top_k;
    r.capacity = cap;
    r.num_tokens = num_tokens;
    r.max_rows = G * k;
    r.dtype = dtype;
    r.run = 1;
    r.expert_rows = expert_rows.data_ptr<std::int32_t>();
    if (path != weft::OverlapMode::sequential) {
      r.expert_offset = expert_offset->data_ptr<std::int32_t>();
      r.row_token = row_token->data_ptr<std::int32_t>();
    }
    r.token_row = token_row.data_ptr<std::int32_t>();
    r.token_weight = token_weight.data_ptr<float>();
    auto out = at::empty({num_tokens, H}, h.options());
    plan.op->run(h.data_ptr(), r, w_down.data_ptr(), num_tokens ? out.data_ptr() : nullptr, stream);
    return out;
  });
}

// ---- CPU kernels: refuse, naming the first CPU tensor ----

[[noreturn]] void refuse_cpu_tensors(const char* op,
                                     std::initializer_list<std::pair<const char*, const at::Tensor*>> args) {
  const char* arg = args.begin()->first;
  for (const auto& [name, t] : args)
    if (t->is_cpu()) {
      arg = name;
      break;
    }
  refuse_cpu(op, arg);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> ag_moe_cpu(
    const at::Tensor& x, const at::Tensor& topk_idx, const at::Tensor& topk_weights, const at::Tensor& w_up, int64_t,
    c10::string_view, int64_t, c10::string_view) {
  refuse_cpu_tensors("ag_moe", {{"x", &x}, {"topk_idx", &topk_idx}, {"topk_weights", &topk_weights}, {"w_up", &w_up}});
}

at::Tensor moe_rs_cpu(const at::Tensor& h, const at::Tensor& expert_rows, const at::Tensor& token_row,
                      const at::Tensor& token_weight, const at::Tensor& w_down, int64_t, c10::string_view, int64_t,
                      c10::string_view, const std::optional<at::Tensor>&, const std::optional<at::Tensor>&) {
  refuse_cpu_tensors("moe_rs", {{"h", &h}, {"expert_rows", &expert_rows}, {"token_row", &token_row},
                        {"token_weight", &token_weight}, {"w_down", &w_down}});
}

/// Synchronises the current stream; raises if an ag_moe run since the last
/// check met an expert id outside [-1, experts) (the same error on every rank).
void ag_moe_check_errors() {
  const char* op = "ag_moe_check_errors";
  guarded(op, [&] {
    Runtime& rt = runtime(op);
    c10::cuda::CUDAGuard guard(rt.device());
    cudaStream_t stream = current_stream(rt);
    py::gil_scoped_release nogil;
    for (AnyPlan* p : rt.plans_of(PlanKind::ag_moe)) static_cast<AgMoePlan*>(p)->op->check_errors(stream);
  });
}

}  // namespace

void bind_moe_tp(py::module_& m) {
  m.def("ag_moe_check_errors", &ag_moe_check_errors,
        "Synchronises the current stream; raises if an ag_moe run since the last check met a bad expert id.");
}

}  // namespace weft_torch

// Functional ops (no argument written, nothing aliased): functionalization and
// torch.compile need no kernels of their own beyond the fakes.
TORCH_LIBRARY_FRAGMENT(weft, m) {
  m.def("ag_moe(Tensor x, Tensor topk_idx, Tensor topk_weights, Tensor w_up, int max_tokens_per_rank, "
        "str group_name, *, int max_sms=0, str mode=\"sequential\") -> (Tensor h, Tensor expert_rows, "
        "Tensor expert_offset, Tensor token_row, Tensor token_weight, Tensor row_token)");
  m.def("moe_rs(Tensor h, Tensor expert_rows, Tensor token_row, Tensor token_weight, Tensor w_down, "
        "SymInt num_tokens, str group_name, *, int max_sms=0, str mode=\"sequential\", Tensor? expert_offset=None, "
        "Tensor? row_token=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(weft, CUDA, m) {
  using namespace weft_torch;
  m.impl("ag_moe", &ag_moe);
  m.impl("moe_rs", &moe_rs);
}

TORCH_LIBRARY_IMPL(weft, CPU, m) {
  using namespace weft_torch;
  m.impl("ag_moe", &ag_moe_cpu);
  m.impl("moe_rs", &moe_rs_cpu);
}
