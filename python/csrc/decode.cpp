// decode.cpp - torch.ops.weft.flash_decode and dist_flash_decode: decode attention
// (one query token per sequence) over a KV cache, weft::FlashDecode on one GPU
// and weft::DistFlashDecode over a cache sharded across weft's ranks.
//
// Plans live in the Runtime's plan cache, keyed by everything a plan is built
// for (shapes, layout, dtype, scale), like the other ops' plans: a decode loop
// over a cache allocated at its capacity, with the lengths in kv_lens, reuses
// one plan for every step. Kernels run on torch's current stream, allocate
// only their outputs from torch's caching allocator and never synchronise the
// host, so a warmed-up call can be captured in a CUDA graph. A plan's
// workspace serves one call at a time: calls with the same shapes on several
// streams at once must be ordered by the caller. The fake (meta) kernels are
// in weft/_decode.py.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <tuple>

#include "runtime.hpp"
#include "weft/ops/dist_flash_decode.hpp"
#include "weft/ops/flash_decode.hpp"

namespace weft_torch {
namespace {

/// One call's checked arguments: the plan's options, its key, and the run's pointers.
struct DecodeCall {
  weft::FlashDecodeOptions o;
  weft::FlashDecodeArgs a;
  PlanKey key;
  at::Tensor out, lse;
};

/// A decode plan's key: every option it is built for (the scale by its bits).
template <PlanKind K>
PlanKey decode_key(const weft::FlashDecodeOptions& o, std::uint32_t scale_bits) {
  return PlanKey::make<K>(o.layout, o.batch, o.q_heads, o.kv_heads, o.head_dim, o.dtype, o.max_kv_len,
                          o.max_pages_per_seq, o.page_size, scale_bits);
}

/// Checks q, k, v, kv_lens, block_table and scale (each error names the op,
/// the argument and what was expected), allocates out and lse, and fills in
/// the plan's options and the run's pointers. The options' limits are
/// checked where a plan is built (check_limits): they are a plan's, and the
/// key holds every option.
DecodeCall decode_call(PlanKind kind, const char* op, Runtime& rt, const at::Tensor& q, const at::Tensor& k,
                       const at::Tensor& v, const std::optional<at::Tensor>& kv_lens,
                       const std::optional<at::Tensor>& block_table, std::optional<double> scale) {
  const bool paged = block_table.has_value();
  for (auto [arg, t] : {std::pair<const char*, const at::Tensor*>{"q", &q}, {"k", &k}, {"v", &v}}) {
    check_device(op, arg, *t, rt);
    check_contiguous(op, arg, *t);
  }
  TORCH_CHECK_TYPE(q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kHalf, "weft.", op,
                   ": argument 'q' must be torch.bfloat16 or torch.float16, got ", dtype_name(q.scalar_type()));
  TORCH_CHECK_TYPE(k.scalar_type() == q.scalar_type(), "weft.", op, ": argument 'k' must have q's dtype ",
                   dtype_name(q.scalar_type()), ", got ", dtype_name(k.scalar_type()));
  TORCH_CHECK_TYPE(v.scalar_type() == q.scalar_type(), "weft.", op, ": argument 'v' must have q's dtype ",
                   dtype_name(q.scalar_type()), ", got ", dtype_name(v.scalar_type()));
  TORCH_CHECK_VALUE(q.dim() == 3, "weft.", op, ": argument 'q' must have shape [batch, q_heads, head_dim], got ",
                    shape_of(q));
  const int64_t batch = q.size(0), q_heads = q.size(1), head_dim = q.size(2);
  TORCH_CHECK_VALUE(head_dim == 64 || head_dim == 128, "weft.", op,
                    ": argument 'q' must have head_dim (its last dimension) 64 or 128, got shape ", shape_of(q));
  const char* k_shape =
      paged ? "[num_pages, kv_heads, page_size, head_dim]" : "[batch, kv_heads, max_kv_len, head_dim]";
  TORCH_CHECK_VALUE(k.dim() == 4 && k.size(3) == head_dim && (paged || k.size(0) == batch), "weft.", op,
                    ": argument 'k' must have shape ", k_shape, " with ", paged ? "" : "batch and ",
                    "head_dim of q ", shape_of(q), ", got ", shape_of(k));
  TORCH_CHECK_VALUE(v.sizes() == k.sizes(), "weft.", op, ": argument 'v' must have k's shape ", shape_of(k), ", got ",
                    shape_of(v));
  const int64_t kv_heads = k.size(1);
  TORCH_CHECK_VALUE(kv_heads >= 1 && q_heads % kv_heads == 0, "weft.", op, ": q's heads (", q_heads,
                    ") must be a multiple of k's and v's heads (", kv_heads, "): each KV head serves q_heads / "
                    "kv_heads query heads; got q ", shape_of(q), " and k ", shape_of(k));
  TORCH_CHECK_VALUE(!paged || kv_lens.has_value(), "weft.", op, ": argument 'kv_lens' is required with a "
                    "block_table (paged KV: int32 [batch], each sequence's keys)");
  if (kv_lens) {
    check_device(op, "kv_lens", *kv_lens, rt);
    check_dtype(op, "kv_lens", *kv_lens, at::kInt);
    TORCH_CHECK_VALUE(kv_lens->dim() == 1 && kv_lens->size(0) == batch && kv_lens->is_contiguous(), "weft.", op,
                      ": argument 'kv_lens' must be a contiguous [batch] = [", batch, "], got shape ",
                      shape_of(*kv_lens));
  }
  if (paged) {
    check_device(op, "block_table", *block_table, rt);
    check_dtype(op, "block_table", *block_table, at::kInt);
    TORCH_CHECK_VALUE(block_table->dim() == 2 && block_table->size(0) == batch && block_table->size(1) >= 1, "weft.",
                      op, ": argument 'block_table' must have shape [batch, max_pages] = [", batch,
                      ", >= 1], got ", shape_of(*block_table));
    check_contiguous(op, "block_table", *block_table);
  }
  TORCH_CHECK_VALUE(!scale || (std::isfinite(*scale) && *scale > 0), "weft.", op,
                    ": argument 'scale' must be positive and finite (None: 1 / sqrt(head_dim)), got ", *scale);

  DecodeCall c;
  weft::FlashDecodeOptions& o = c.o;
  o.batch = static_cast<int>(batch);
  o.q_heads = static_cast<int>(q_heads);
  o.kv_heads = static_cast<int>(kv_heads);
  o.head_dim = static_cast<int>(head_dim);
  o.dtype = q.scalar_type() == at::kHalf ? weft::DType::fp16 : weft::DType::bf16;
  o.layout = paged ? weft::KvLayout::paged : weft::KvLayout::contiguous;
  if (paged) {
    o.page_size = static_cast<int>(k.size(2));
    o.max_pages_per_seq = static_cast<int>(block_table->size(1));
  } else {
    o.max_kv_len = k.size(2);
  }
  const float s = scale ? static_cast<float>(*scale) : 0.f;
  o.softmax_scale = s;
  std::uint32_t scale_bits = 0;
  std::memcpy(&scale_bits, &s, sizeof s);
  c.key = kind == PlanKind::flash_decode ? decode_key<PlanKind::flash_decode>(o, scale_bits)
                                         : decode_key<PlanKind::dist_flash_decode>(o, scale_bits);
  c.out = new_output(q.sizes(), q);
  c.lse = new_output({batch, q_heads}, at::kFloat, q.device());
  c.a.q = q.data_ptr();
  c.a.k = k.data_ptr();
  c.a.v = v.data_ptr();
  c.a.kv_lens = kv_lens ? kv_lens->data_ptr<std::int32_t>() : nullptr;
  c.a.block_table = paged ? block_table->data_ptr<std::int32_t>() : nullptr;
  c.a.out = c.out.data_ptr();
  c.a.lse = c.lse.data_ptr<float>();
  return c;
}

/// The limits of a plan for `o` (batch, heads, page size, ...), said in its own
/// terms: checked before the plan for a new key is built, as the options are
/// the key's, every later call with that key passes.
void check_limits(const char* op, const weft::FlashDecodeOptions& o, const at::Tensor& q, const at::Tensor& k,
                  const std::optional<at::Tensor>& block_table) {
  const std::string why = o.check();
  TORCH_CHECK_VALUE(why.empty(), "weft.", op, ": ", why, " (q ", shape_of(q), ", k ", shape_of(k),
                    block_table ? ", block_table " + shape_of(*block_table) : std::string(), ")");
}

std::tuple<at::Tensor, at::Tensor> flash_decode(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                const std::optional<at::Tensor>& kv_lens,
                                                const std::optional<at::Tensor>& block_table,
                                                std::optional<double> scale) {
  const char* op = "flash_decode";
  return guarded(op, [&] {
    Runtime& rt = runtime(op);
    DecodeCall c = decode_call(PlanKind::flash_decode, op, rt, q, k, v, kv_lens, block_table, scale);
    if (c.o.batch == 0) return std::make_tuple(c.out, c.lse);
    c10::cuda::CUDAGuard guard(rt.device());
    cudaStream_t stream = current_stream(rt);
    AnyPlan* found = rt.find(c.key);
    if (!found) {
      check_limits(op, c.o, q, k, block_table);
      // Local to this process: no symmetric memory, nothing checked across ranks.
      found = &rt.build(op, c.key, stream, [&] {
        auto p = std::make_unique<Plan<weft::FlashDecode>>();
        p->op = std::make_unique<weft::FlashDecode>(c.o);
        return p;
      });
    }
    static_cast<Plan<weft::FlashDecode>*>(found)->op->run(c.a, stream);
    return std::make_tuple(c.out, c.lse);
  });
}

std::tuple<at::Tensor, at::Tensor> dist_flash_decode(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                     const std::optional<at::Tensor>& kv_lens,
                                                     const std::optional<at::Tensor>& block_table,
                                                     std::optional<double> scale, c10::string_view group_name) {
  const char* op = "dist_flash_decode";
  return guarded(op, [&] {
    Runtime& rt = runtime(op);
    check_group(op, group_name, rt);
    DecodeCall c = decode_call(PlanKind::dist_flash_decode, op, rt, q, k, v, kv_lens, block_table, scale);
    if (c.o.batch == 0) return std::make_tuple(c.out, c.lse);
    c10::cuda::CUDAGuard guard(rt.device());
    cudaStream_t stream = current_stream(rt);
    AnyPlan* found = rt.find(c.key);
    if (!found) {
      check_limits(op, c.o, q, k, block_table);
      found = &rt.build(op, c.key, stream, [&] {
        // Every rank builds the plan of one key together, so the whole key (the
        // shards' capacity and block-table width too, which DistFlashDecode's
        // own check leaves out) must agree: otherwise a rank that already holds
        // a plan would run it while another builds one, and both would wait.
        rt.ctx().verify_same_call(c.key.str());
        auto p = std::make_unique<Plan<weft::DistFlashDecode>>();
        p->op = std::make_unique<weft::DistFlashDecode>(rt.ctx_ptr(), c.o);  // allocates its staging in the heap
        return p;
      });
    }
    static_cast<Plan<weft::DistFlashDecode>*>(found)->op->run(c.a, stream);
    return std::make_tuple(c.out, c.lse);
  });
}

// ---- CPU kernels: refuse, naming the first CPU tensor ----

[[noreturn]] void refuse_cpu_tensors(const char* op, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const std::optional<at::Tensor>& kv_lens,
                                     const std::optional<at::Tensor>& block_table) {
  const char* arg = q.is_cpu()                          ? "q"
                    : k.is_cpu()                        ? "k"
                    : v.is_cpu()                        ? "v"
                    : kv_lens && kv_lens->is_cpu()      ? "kv_lens"
                                                        : "block_table";
  refuse_cpu(op, arg);
}

std::tuple<at::Tensor, at::Tensor> flash_decode_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                    const std::optional<at::Tensor>& kv_lens,
                                                    const std::optional<at::Tensor>& block_table,
                                                    std::optional<double>) {
  refuse_cpu_tensors("flash_decode", q, k, v, kv_lens, block_table);
}

std::tuple<at::Tensor, at::Tensor> dist_flash_decode_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                         const std::optional<at::Tensor>& kv_lens,
                                                         const std::optional<at::Tensor>& block_table,
                                                         std::optional<double>, c10::string_view) {
  refuse_cpu_tensors("dist_flash_decode", q, k, v, kv_lens, block_table);
}

}  // namespace
}  // namespace weft_torch

// Functional ops (no argument written, nothing aliased): functionalization and
// torch.compile need no kernels of their own beyond the fakes.
TORCH_LIBRARY_FRAGMENT(weft, m) {
  m.def("flash_decode(Tensor q, Tensor k, Tensor v, Tensor? kv_lens=None, Tensor? block_table=None, "
        "float? scale=None) -> (Tensor out, Tensor lse)");
  m.def("dist_flash_decode(Tensor q, Tensor k, Tensor v, Tensor? kv_lens, Tensor? block_table, float? scale, "
        "str group_name) -> (Tensor out, Tensor lse)");
}

TORCH_LIBRARY_IMPL(weft, CUDA, m) {
  using namespace weft_torch;
  m.impl("flash_decode", &flash_decode);
  m.impl("dist_flash_decode", &dist_flash_decode);
}

TORCH_LIBRARY_IMPL(weft, CPU, m) {
  using namespace weft_torch;
  m.impl("flash_decode", &flash_decode_cpu);
  m.impl("dist_flash_decode", &dist_flash_decode_cpu);
}
