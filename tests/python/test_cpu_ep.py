"""CPU tests of expert parallelism from PyTorch: the classes and their
signatures, the arguments they check before needing weft or a GPU, and the
parts of weft.nn.ExpertParallelMoE that are plain torch (Mixtral's routing,
the experts' SwiGLU over their contiguous rows) against direct computations.
The dispatch and combine themselves are GPU tests (test_gpu_ep.py)."""

import inspect

import pytest
import torch

import weft
import weft.nn


def params(f):
    return [p.name for p in inspect.signature(f).parameters.values()]


def test_classes_are_exported():
    assert {"ExpertParallel", "ExpertParallelLowLatency"} <= set(weft.__all__)
    assert weft.ExpertParallel.__module__ == "weft._ep" and weft.nn.ExpertParallelMoE.__module__ == "weft.nn"
    for name in ("ExpertParallel", "ExpertParallelLowLatency", "EpHandle"):
        assert hasattr(weft._C, name), name
    assert {"dispatch", "combine"} <= set(dir(weft._C.ExpertParallel))
    assert {"dispatch", "combine", "check_errors"} <= set(dir(weft._C.ExpertParallelLowLatency))


def test_signatures():
    ep, ll, moe = weft.ExpertParallel, weft.ExpertParallelLowLatency, weft.nn.ExpertParallelMoE
    assert params(ep.__init__) == ["self", "num_experts", "hidden", "top_k", "max_tokens", "group", "max_sms"]
    assert params(ep.dispatch) == ["self", "x", "topk_idx", "topk_weights"]
    assert params(ep.combine) == ["self", "y", "handle"]
    assert params(ll.__init__) == ["self", "num_experts", "hidden", "top_k", "max_tokens", "group", "max_sms"]
    assert params(ll.dispatch) == ["self", "x", "topk_idx"]
    assert params(ll.combine) == ["self", "y", "topk_idx", "topk_weights"]
    assert params(ll.check_errors) == ["self"]
    assert params(moe.__init__) == ["self", "hidden", "ffn", "num_experts", "top_k", "max_tokens", "max_sms", "device"]
    assert params(moe.from_dense) == ["gate_weight", "w1", "w3", "w2", "top_k", "max_tokens", "max_sms"]
    for cls in (ep, ll):
        defaults = {p.name: p.default for p in inspect.signature(cls.__init__).parameters.values()}
        assert defaults["group"] is None and defaults["max_sms"] == 0


BAD_ARGS = [
    (dict(num_experts=0), ValueError, r"argument 'num_experts' must be in \[1, 1024\], got 0"),
    (dict(num_experts=1025), ValueError, r"argument 'num_experts' must be in \[1, 1024\], got 1025"),
    (dict(hidden=1001), ValueError, r"argument 'hidden' must be a positive multiple of 8 .*got 1001"),
    (dict(hidden=0), ValueError, r"argument 'hidden' must be a positive multiple of 8"),
    (dict(top_k=0), ValueError, r"argument 'top_k' must be in \[1, 8\] .*got 0"),
    (dict(top_k=33, num_experts=64), ValueError, r"argument 'top_k' must be in \[1, 32\]"),
    (dict(top_k=9, num_experts=8), ValueError, r"argument 'top_k' must be in \[1, 8\] .*num_experts = 8"),
    (dict(max_tokens=0), ValueError, r"argument 'max_tokens' must be positive"),
    (dict(max_sms=-1), ValueError, r"argument 'max_sms' must be >= 0"),
    (dict(hidden=64.0), TypeError, r"argument 'hidden' must be an int, got float"),
    (dict(top_k=True), TypeError, r"argument 'top_k' must be an int, got bool"),
]


@pytest.mark.parametrize("cls", ["ExpertParallel", "ExpertParallelLowLatency"])
@pytest.mark.parametrize("bad,error,message", BAD_ARGS)
def test_arguments_are_checked_first(cls, bad, error, message):
    args = dict(num_experts=8, hidden=64, top_k=2, max_tokens=16, max_sms=0)
    args.update(bad)
    with pytest.raises(error, match=rf"weft.{cls}: {message}"):
        getattr(weft, cls)(**args)


def test_low_latency_max_tokens_is_bounded():
    with pytest.raises(ValueError, match=r"weft.ExpertParallelLowLatency: argument 'max_tokens' must be positive, at "
                       r"most 4096, got 4097"):
        weft.ExpertParallelLowLatency(8, 64, 2, 4097)


def test_good_arguments_need_init():
    for cls in ("ExpertParallel", "ExpertParallelLowLatency"):
        with pytest.raises(RuntimeError, match=rf"weft.{cls}: weft is not initialised in this process: call "
                           r"weft.init"):
            getattr(weft, cls)(8, 64, 2, 16)
        with pytest.raises(RuntimeError, match=rf"weft.{cls}: weft is not initialised in this process"):
            getattr(weft._C, cls)(8, 64, 2, 16, 0)  # the extension's own check
    with pytest.raises(RuntimeError, match=r"weft.world_size: weft is not initialised in this process"):
        weft.nn.ExpertParallelMoE(64, 128, 8, 2, 16)


def test_mixtral_route():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(50, 8, generator=g).bfloat16()
    idx, w = weft.nn.mixtral_route(logits, 2)
    assert idx.dtype == torch.int64 and w.dtype == torch.float32 and idx.shape == w.shape == (50, 2)
    assert idx.is_contiguous() and w.is_contiguous()
    probs = torch.softmax(logits.double(), dim=-1)
    for t in range(50):
        order = probs[t].argsort(descending=True)
        # the two most probable experts, by logit; ties in bf16 logits may come in either order
        assert set(idx[t].tolist()) == set(order[:2].tolist()) or probs[t, order[1]] == probs[t, order[2]]
        expect = probs[t, idx[t]] / probs[t, idx[t]].sum()
        torch.testing.assert_close(w[t].double(), expect, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(w.sum(-1), torch.ones(50))
    idx1, w1 = weft.nn.mixtral_route(logits, 1)
    assert torch.equal(logits.gather(1, idx1)[:, 0], logits.max(-1).values) and torch.all(w1 == 1)


def swiglu_reference(x, rows, w1, w3, w2):
    """Row by row in float64: each row through the expert its position falls in."""
    out, e_of_row = [], [e for e, n in enumerate(rows) for _ in range(n)]
    for i, e in enumerate(e_of_row):
        xi = x[i].double()
        h = torch.nn.functional.silu(w1[e].double() @ xi) * (w3[e].double() @ xi)
        out.append(w2[e].double() @ h)
    return torch.stack(out) if out else torch.empty(0, w2.shape[1], dtype=torch.float64)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_expert_swiglu_loop(dtype, tol):
    g = torch.Generator().manual_seed(7)
    rows = [3, 0, 11, 1]
    x = torch.randn(sum(rows), 64, generator=g).to(dtype)
    w1, w3 = (torch.randn(4, 32, 64, generator=g) / 8).to(dtype), (torch.randn(4, 32, 64, generator=g) / 8).to(dtype)
    w2 = (torch.randn(4, 64, 32, generator=g) / 6).to(dtype)
    y = weft.nn.expert_swiglu(x, rows, w1, w3, w2)  # on the CPU: the loop
    assert y.shape == (15, 64) and y.dtype == dtype
    ref = swiglu_reference(x, rows, w1, w3, w2)
    assert ((y.double() - ref).norm() / ref.norm()).item() <= tol
    assert weft.nn.expert_swiglu(x[:0], [0, 0, 0, 0], w1, w3, w2).shape == (0, 64)


def test_expert_swiglu_checks_the_rows():
    x, w = torch.ones(4, 8), torch.ones(2, 8, 8)
    with pytest.raises(ValueError, match=r"weft.nn.expert_swiglu: argument 'expert_rows' must have one count per "
                       r"expert \(2\), got 3"):
        weft.nn.expert_swiglu(x, [1, 1, 2], w, w, w)
    with pytest.raises(ValueError, match=r"weft.nn.expert_swiglu: argument 'expert_rows' must sum to x's rows \(4\), "
                       r"got 3"):
        weft.nn.expert_swiglu(x, [1, 2], w, w, w)
