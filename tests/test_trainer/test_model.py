"""trainer/model/model.py and the modules applied to it: geometry, loss equivalences, attention paths, the model
options, the compile policy (trainer/model/compile.py), the kernels (trainer/model/kernels.py) and the HF Llama on-disk
format (trainer/model/hf.py)."""

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch.utils._python_dispatch import TorchDispatchMode

from trainer.model import kernels as K
from trainer.model import model as M
from trainer.model.compile import compile_blocks, compile_model, inductor_kernel_settings, keep_grads_allocated
from trainer.model.hf import from_hf_config, hf_state_dict, load_hf_state_dict, save_pretrained, to_hf_config
from trainer.model.model import GEOMETRIES, Llama, ModelConfig, count_params
from trainer.model.options import ModelOptions

TINY = GEOMETRIES["tiny"]


@pytest.fixture(autouse=True)
def one_thread():
    # Models this small run many times slower when two intra-op threads fight other processes for 2 cores.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny(seed: int = 0, **kw) -> Llama:
    torch.manual_seed(seed)
    return Llama(TINY, **kw)


def batch(b: int = 2, t: int = 24, vocab: int = TINY.vocab_size, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (b, t), generator=g), torch.randint(0, vocab, (b, t), generator=g)


def test_frozen_geometry_counts_exactly_106194240_parameters():
    with torch.device("meta"):
        m = Llama(GEOMETRIES["ounce100m-22l"])
    assert count_params(m) == 106_194_240
    # the tie is real: one tensor, not two that happen to be counted once
    assert "lm_head.weight" not in dict(m.named_parameters())
    # and the saved weights hold that many numbers: what the P4 specs count in the horizon checkpoint
    assert sum(t.numel() for t in hf_state_dict(m).values()) == 106_194_240


def test_tiny_geometry_parameter_count_matches_the_arithmetic():
    c = TINY
    kv = c.n_kv_head * c.head_dim
    block = 2 * c.d_model * c.d_model + 2 * c.d_model * kv + 3 * c.d_model * c.d_mlp + 2 * c.d_model
    assert count_params(tiny()) == c.vocab_size * c.d_model + c.n_layer * block + c.d_model == 119_104


def test_init_is_llama_normal_0_02_and_norms_start_at_one():
    m = tiny()
    w = m.layers[0].mlp.up_proj.weight
    assert abs(w.std().item() - 0.02) < 0.002 and abs(w.mean().item()) < 0.002
    assert torch.equal(m.norm.weight, torch.ones(TINY.d_model))


def test_forward_without_targets_returns_logits_of_batch_time_vocab():
    x, _ = batch(b=3, t=10)
    logits, loss = tiny()(x)
    assert loss is None and logits.shape == (3, 10, TINY.vocab_size)


def test_untrained_loss_is_near_log_vocab():
    x, y = batch(b=4, t=32)
    _, loss = tiny()(x, y)
    assert abs(loss.item() - torch.log(torch.tensor(512.0)).item()) < 0.1


def test_chunked_loss_and_its_gradients_equal_plain_cross_entropy():
    x, y = batch(b=2, t=24)
    m_chunked = tiny(options=ModelOptions(loss_chunk_rows=7))  # 2x24 rows -> 7 chunks, the last one partial
    m_plain = tiny()
    _, loss = m_chunked(x, y)
    logits, _ = m_plain(x)
    ref = F.cross_entropy(logits.reshape(-1, TINY.vocab_size), y.reshape(-1))
    torch.testing.assert_close(loss, ref, rtol=1e-6, atol=1e-6)
    loss.backward()
    ref.backward()
    for (name, p), q in zip(m_chunked.named_parameters(), m_plain.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-7, msg=name)


def test_eager_and_sdpa_attention_give_the_same_loss_and_logits():
    x, y = batch(b=2, t=40)
    eager, sdpa = tiny(attn="eager"), tiny(attn="sdpa")
    torch.testing.assert_close(eager(x)[0], sdpa(x)[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(eager(x, y)[1], sdpa(x, y)[1], rtol=1e-6, atol=1e-6)


def test_attention_is_causal_future_tokens_do_not_change_past_logits():
    m = tiny(attn="eager")
    x, _ = batch(b=1, t=16)
    x2 = x.clone()
    x2[0, 10:] = (x2[0, 10:] + 1) % TINY.vocab_size
    torch.testing.assert_close(m(x)[0][:, :10], m(x2)[0][:, :10])
    assert not torch.allclose(m(x)[0][:, 10:], m(x2)[0][:, 10:])


def test_gradient_checkpointing_changes_nothing_but_memory():
    x, y = batch()
    a, b = tiny(grad_ckpt=False), tiny(grad_ckpt=True)
    la, lb = a(x, y)[1], b(x, y)[1]
    la.backward()
    lb.backward()
    torch.testing.assert_close(la, lb)
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


def test_unknown_attention_implementation_and_overlong_input_are_refused():
    with pytest.raises(ValueError, match="attn must be"):
        Llama(TINY, attn="flash3")
    with pytest.raises(ValueError, match="exceeds max_seq_len 2048"):
        tiny()(torch.zeros(1, 2049, dtype=torch.long))


def test_bad_geometry_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="n_head 9 is not divisible by n_kv_head 2"):
        ModelConfig(n_layer=1, d_model=576, d_mlp=8, n_head=9, n_kv_head=2, vocab_size=8)


def test_hf_config_round_trips_and_has_every_llamaconfig_key():
    cfg = GEOMETRIES["ounce100m-22l"]
    d = to_hf_config(cfg)
    assert d["architectures"] == ["LlamaForCausalLM"] and d["model_type"] == "llama"
    assert {
        k: d[k]
        for k in (
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "vocab_size",
            "max_position_embeddings",
        )
    } == {
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 22,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "vocab_size": 49152,
        "max_position_embeddings": 2048,
    }
    assert (d["rms_norm_eps"], d["rope_theta"], d["hidden_act"], d["tie_word_embeddings"]) == (
        1e-5,
        10000.0,
        "silu",
        True,
    )
    assert (d["attention_bias"], d["mlp_bias"], d["torch_dtype"]) == (False, False, "float32")
    assert from_hf_config(d) == cfg
    # the transformers-5 spelling of the same model
    d5 = {k: v for k, v in d.items() if k not in ("rope_theta", "rope_scaling")}
    d5["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
    assert from_hf_config(d5) == cfg


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("model_type", "gpt2", "model_type is 'gpt2'"),
        ("tie_word_embeddings", False, "tie_word_embeddings is False"),
        ("rope_scaling", {"rope_type": "llama3", "factor": 8.0}, "rope type is 'llama3'"),
        ("head_dim", 32, "head_dim 32"),
    ],
)
def test_hf_config_this_model_cannot_represent_is_refused(field, value, match):
    d = to_hf_config(TINY)
    d[field] = value
    with pytest.raises(ValueError, match=match):
        from_hf_config(d)


def test_hf_config_missing_field_is_named():
    d = to_hf_config(TINY)
    del d["vocab_size"]
    with pytest.raises(ValueError, match="lacks the field 'vocab_size'"):
        from_hf_config(d)


def test_hf_state_dict_uses_exactly_llama_names_without_the_tied_head():
    names = set(hf_state_dict(tiny()))
    per_layer = [
        "input_layernorm.weight",
        "post_attention_layernorm.weight",
        "self_attn.q_proj.weight",
        "self_attn.k_proj.weight",
        "self_attn.v_proj.weight",
        "self_attn.o_proj.weight",
        "mlp.gate_proj.weight",
        "mlp.up_proj.weight",
        "mlp.down_proj.weight",
    ]
    want = {"model.embed_tokens.weight", "model.norm.weight"}
    want |= {f"model.layers.{i}.{n}" for i in range(TINY.n_layer) for n in per_layer}
    assert names == want


def test_save_pretrained_writes_hf_files_that_load_back_identically(tmp_path):
    m = tiny(seed=3)
    hashes = save_pretrained(m, TINY, tmp_path)
    assert sorted(hashes) == ["config.json", "model.safetensors"] and all(len(h) == 64 for h in hashes.values())
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert from_hf_config(cfg) == TINY and cfg["torch_dtype"] == "float32"
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        assert f.metadata() == {"format": "pt"}
        sd = {k: f.get_tensor(k) for k in f.keys()}
    assert set(sd) == set(hf_state_dict(m)) and sd["model.layers.1.self_attn.k_proj.weight"].shape == (32, 64)
    other = tiny(seed=4)
    load_hf_state_dict(other, sd)
    x, _ = batch()
    torch.testing.assert_close(other(x)[0], m(x)[0], rtol=0, atol=0)


def test_load_hf_state_dict_names_missing_and_unexpected_keys():
    sd = hf_state_dict(tiny())
    sd.pop("model.norm.weight")
    sd["model.layers.0.mlp.extra.weight"] = torch.zeros(1)
    with pytest.raises(
        KeyError, match=r"missing \['model.norm.weight'\].*unexpected \['model.layers.0.mlp.extra.weight'\]"
    ):
        load_hf_state_dict(tiny(), sd)


def test_wrapped_model_is_unwrapped_for_names_and_counts():
    m = tiny()

    class Wrapper(torch.nn.Module):  # the shape of DDP: the model under .module
        def __init__(self, inner):
            super().__init__()
            self.module = inner

    assert set(hf_state_dict(Wrapper(m))) == set(hf_state_dict(m))
    assert count_params(Wrapper(m)) == count_params(m)


def test_transformers_loads_the_saved_model_with_the_same_logits(tmp_path):
    transformers = pytest.importorskip("transformers")
    m = tiny(seed=5).eval()
    save_pretrained(m, TINY, tmp_path)
    hf = transformers.LlamaForCausalLM.from_pretrained(str(tmp_path)).eval()  # dtype from config.json: float32
    x, _ = batch(b=2, t=48)
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, m(x)[0], rtol=0, atol=1e-5)


def test_fused_loss_under_bf16_autocast_matches_plain_cross_entropy_within_bf16_tolerance():
    # The fast loss computes its gradients inside the forward in the autocast dtype; compare with the
    # textbook path (full bf16 logits -> fp32 cross-entropy) under the same autocast.
    x, y = batch(b=2, t=40)
    fast, plain = tiny(seed=7), tiny(seed=7)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, loss = fast(x, y)
        logits, _ = plain(x)
        ref = F.cross_entropy(logits.float().reshape(-1, TINY.vocab_size), y.reshape(-1))
    torch.testing.assert_close(loss, ref, rtol=1e-2, atol=1e-2)
    loss.backward()
    ref.backward()
    for (name, p), q in zip(fast.named_parameters(), plain.parameters()):
        rel = ((p.grad - q.grad).norm() / q.grad.norm()).item()
        assert rel < 2e-2, f"{name}: relative gradient difference {rel:.2e}"


def test_loss_without_grad_equals_loss_with_grad():
    x, y = batch()
    m = tiny()
    with torch.no_grad():
        _, l_eval = m(x, y)
    _, l_train = m(x, y)
    torch.testing.assert_close(l_eval, l_train.detach(), rtol=1e-6, atol=1e-6)


def test_sdpa_enable_gqa_computes_the_same_function_and_gradients():
    x, y = batch()
    out = []
    for gqa in (False, True):
        m = tiny(seed=3, options=ModelOptions(sdpa_gqa=gqa))
        logits, _ = m(x)
        _, loss = m(x, y)
        loss.backward()
        out.append((logits.detach(), m.layers[0].self_attn.k_proj.weight.grad.clone()))
    torch.testing.assert_close(out[0][0], out[1][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out[0][1], out[1][1], rtol=1e-5, atol=1e-6)


def test_loss_chunk_rule_is_eight_chunks_per_micro_batch_between_512_and_4096_rows():
    assert [K.loss_chunk_rows(n) for n in (48, 4096, 8192, 16384, 32768, 65536)] == [512, 512, 1024, 2048, 4096, 4096]
    assert K.loss_chunk_rows(32768, fixed=7) == 7


def test_compile_blocks_keeps_the_parameter_names():
    m = tiny()
    before = list(hf_state_dict(m))
    compile_blocks(m, ModelOptions())  # compiles lazily: nothing runs until the first forward
    assert list(hf_state_dict(m)) == before and count_params(m) == 119_104


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "inductor"])
def test_pointwise_softmax_gradient_pass_equals_the_in_place_one(compiled):
    # ce_grad_pointwise is what CUDA compiles; it must be ce_grad_eager's function, eagerly and as
    # Inductor builds it (here its CPU backend), including a target in the first and the last column.
    g = torch.Generator().manual_seed(11)
    logits = (torch.randn(37, 300, generator=g) * 4).to(torch.bfloat16)
    y = torch.randint(0, 300, (37,), generator=g)
    y[0], y[-1] = 0, 299
    fn = torch.compile(K.ce_grad_pointwise, dynamic=False) if compiled else K.ce_grad_pointwise
    loss, grad = fn(logits, y)
    ref_loss, ref_grad = K.ce_grad_eager(logits.clone(), y)
    assert grad.dtype == torch.bfloat16 and grad.shape == (37, 300)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(grad.float(), ref_grad.float(), rtol=0, atol=2**-8)
    assert torch.allclose(grad.float().sum(1), torch.zeros(37), atol=0.05)  # softmax - one-hot sums to 0


def _residual_dtype(lowp: bool, dtype: torch.dtype | None) -> torch.dtype:
    m = tiny(seed=4, options=ModelOptions(bf16_residual=lowp))
    seen = []
    m.layers[1].register_forward_pre_hook(lambda mod, args: seen.append(args[0].dtype))
    x, y = batch()
    with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        m(x, y)
    return seen[0]


def test_residual_stream_is_bf16_only_under_bf16_autocast_with_the_switch_on():
    assert _residual_dtype(True, torch.bfloat16) == torch.bfloat16
    assert _residual_dtype(False, torch.bfloat16) == torch.float32
    assert _residual_dtype(True, torch.float16) == torch.float32  # fp16's range: kept fp32
    assert _residual_dtype(True, None) == torch.float32


def test_bf16_residual_stream_changes_the_loss_and_gradients_only_by_bf16_rounding():
    x, y = batch(b=2, t=40)
    out = []
    for lowp in (False, True):
        m = tiny(seed=6, options=ModelOptions(bf16_residual=lowp))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _, loss = m(x, y)
        loss.backward()
        out.append((loss.detach(), [p.grad for p in m.parameters()]))
    torch.testing.assert_close(out[1][0], out[0][0], rtol=1e-2, atol=1e-2)
    for a, b in zip(out[1][1], out[0][1]):
        assert ((a - b).norm() / b.norm()).item() < 3e-2


def test_sdpa_gqa_is_on_from_cuda_capability_8_and_off_below_and_on_cpu(monkeypatch):
    caps = {"t4": (7, 5), "a100": (8, 0), "h200": (9, 0)}
    for card, cap in caps.items():
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, cap=cap: cap)
        assert M.sdpa_gqa(torch.device("cuda", 0)) is (cap >= (8, 0)), card
        assert ModelOptions().resolved("cuda", cap).sdpa_gqa is (cap >= (8, 0)), card
    assert M.sdpa_gqa(torch.device("cpu")) is False
    assert ModelOptions().resolved("cpu", None).sdpa_gqa is False
    for forced in (True, False):
        assert M.sdpa_gqa(torch.device("cpu"), forced) is forced
        assert ModelOptions(sdpa_gqa=forced).resolved("cuda", (7, 5)).sdpa_gqa is forced


def _saved_by_compiled_block(lean: bool) -> list[tuple[tuple[int, ...], torch.dtype]]:
    from torch._functorch import config as partitioner

    saved = []

    def pack(t):
        saved.append((tuple(t.shape), t.dtype))
        return t

    # The config module's own patch(): monkeypatch's undo would delete a config attribute, not restore it.
    with partitioner.patch(ban_recompute_materialized_backward=True):  # torch's default
        m = tiny(seed=8)
        compile_blocks(m, ModelOptions(lean_activations=lean))
        x, y = batch()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast("cpu", dtype=torch.bfloat16):
            m(x, y)
    return saved


def test_lean_activations_make_compiled_blocks_save_the_weights_not_their_bf16_copies():
    # A bf16 copy of each block matrix kept for the backward is memory the parameters already hold in fp32.
    torch._dynamo.reset()
    shapes = {tuple(p.shape) for n, p in tiny().layers[0].named_parameters() if p.dim() == 2}
    default = _saved_by_compiled_block(lean=False)
    torch._dynamo.reset()
    lean = _saved_by_compiled_block(lean=True)
    torch._dynamo.reset()
    bf16_weights = lambda saved: [s for s, dt in saved if s in shapes and dt == torch.bfloat16]  # noqa: E731
    assert len(bf16_weights(default)) >= 7 * TINY.n_layer  # q, k, v, o, gate, up, down per block
    assert bf16_weights(lean) == []

    def activation_bytes(saved):
        return sum(torch.Size(s).numel() * (2 if dt == torch.bfloat16 else 4) for s, dt in saved if s not in shapes)

    assert activation_bytes(lean) < activation_bytes(default)


def test_a_second_backward_through_the_loss_is_refused_not_scaled_twice():
    # The loss scales its saved gradients in place; autograd's version check must turn a retained-graph
    # second backward into an error instead of a silently doubled scale.
    m = tiny()
    x, y = batch()
    _, loss = m(x, y)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_compile_model_keeps_the_names_and_computes_the_same_loss_and_gradients(monkeypatch):
    from torch._inductor import config as inductor

    monkeypatch.delenv("TORCHINDUCTOR_COORDINATE_DESCENT_TUNING", raising=False)
    torch._dynamo.reset()
    ref, m = tiny(seed=9), tiny(seed=9)
    before = list(hf_state_dict(m))
    x, y = batch()
    with inductor.patch(coordinate_descent_tuning=False, combo_kernels=False):
        compile_model(m, ModelOptions())
        assert m._compiled_call_impl is not None  # compiled in place, not wrapped
        assert inductor.coordinate_descent_tuning is True  # the kernel tuning comes with the scope
        assert inductor.combo_kernels is False  # combo kernels are opt-in
        loss = m(x, y)[1]
        loss.backward()
    torch._dynamo.reset()
    assert list(hf_state_dict(m)) == before and count_params(m) == 119_104
    loss_ref = ref(x, y)[1]
    loss_ref.backward()
    torch.testing.assert_close(loss, loss_ref, rtol=1e-5, atol=1e-5)
    for (name, p), q in zip(m.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)


def test_compile_model_leaves_tuning_to_inductors_own_switch_when_set(monkeypatch):
    from torch._inductor import config as inductor

    monkeypatch.setenv("TORCHINDUCTOR_COORDINATE_DESCENT_TUNING", "0")
    with inductor.patch(coordinate_descent_tuning=False, combo_kernels=False):
        compile_model(tiny(), ModelOptions())  # lazy: nothing is built before the first forward
        assert inductor.coordinate_descent_tuning is False
        assert inductor_kernel_settings() == "coordinate-descent tuning off, combo kernels off"


@pytest.mark.parametrize("combo", [False, True])
def test_combo_kernels_follow_the_model_option(combo):
    from torch._inductor import config as inductor

    with inductor.patch(combo_kernels=False):
        compile_model(tiny(), ModelOptions(combo_kernels=combo))  # what SPECPROBE_COMBO_KERNELS=1 sets
        assert inductor.combo_kernels is combo
        assert inductor_kernel_settings().endswith(f"combo kernels {'on' if combo else 'off'}")


@pytest.mark.parametrize("graphs, kwargs", [(False, {}), (True, {"mode": "reduce-overhead"})])
def test_compile_model_asks_for_cuda_graphs_only_when_told(monkeypatch, graphs, kwargs):
    from torch._inductor import config as inductor

    seen = []
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kw: seen.append(kw))
    with inductor.patch(coordinate_descent_tuning=False):
        compile_model(tiny(), ModelOptions(), graphs=graphs)
    assert seen == [kwargs]


def test_keep_grads_allocated_gives_zero_gradients_only_where_none_exist():
    m = tiny(seed=2)
    m.norm.weight.requires_grad_(False)  # frozen: left without a gradient
    up = m.layers[0].mlp.up_proj.weight
    kept = up.grad = torch.full_like(up, 3.0)
    keep_grads_allocated(m)
    assert m.norm.weight.grad is None
    assert up.grad is kept and bool((kept == 3.0).all())  # an existing gradient is left as it is
    others = [p for p in m.parameters() if p.requires_grad and p is not up]
    assert len(others) == len(list(m.parameters())) - 2
    assert all(p.grad is not None and p.grad.shape == p.shape and not p.grad.any() for p in others)


def test_accumulating_into_kept_gradients_zeroed_in_place_equals_set_to_none_bitwise():
    # The trainer's CUDA-graph path (gradients allocated up front, zeroed in place) trains exactly as the
    # default path (set to None): same gradients, same storage from step to step.
    x1, y1 = batch(seed=1)
    x2, y2 = batch(seed=2)
    grads, ptrs = [], []
    for in_place in (False, True):
        m = tiny(seed=6)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        if in_place:
            keep_grads_allocated(m)
            ptrs.append([p.grad.data_ptr() for p in m.parameters()])
        for _ in range(2):  # two steps of two accumulated micro-steps
            for x, y in ((x1, y1), (x2, y2)):
                (m(x, y)[1] / 2).backward()
            step_grads = [p.grad.clone() for p in m.parameters()]
            opt.step()
            opt.zero_grad(set_to_none=not in_place)
        grads.append(step_grads)
        if in_place:
            ptrs.append([p.grad.data_ptr() for p in m.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads))
    assert ptrs[0] == ptrs[1]  # never reallocated


def switch_off_then_on(monkeypatch, switch: str, autocast: bool = False):
    """[(loss, grads, LinearFp32Grad calls as weight counts)] of one model and batch with the model option
    `switch` off, then on."""
    x, y = batch()
    apply, calls = K.LinearFp32Grad.apply, []
    monkeypatch.setattr(K.LinearFp32Grad, "apply", lambda *a: calls.append(len(a) - 1) or apply(*a))
    out = []
    for on in (False, True):
        calls.clear()
        m = tiny(seed=4, options=ModelOptions(**{switch: on}))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            _, loss = m(x, y)
        loss.backward()
        out.append((loss.detach(), {n: p.grad for n, p in m.named_parameters()}, sorted(calls)))
    return out


def test_fp32_weight_gradients_equal_nn_linear_in_fp32(monkeypatch):
    (ref_loss, ref, ref_calls), (loss, got, calls) = switch_off_then_on(monkeypatch, "fp32_wgrad")
    assert ref_calls == [] and calls == [1] * 7 * TINY.n_layer  # every projection went through it, once
    assert loss == ref_loss and got.keys() == ref.keys()  # the same matmuls in the same order
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], rtol=1e-6, atol=1e-8, msg=name)


def test_fp32_weight_gradients_under_bf16_autocast_are_fp32_and_differ_from_nn_linear_by_rounding_only(monkeypatch):
    (ref_loss, ref, _), (loss, got, _) = switch_off_then_on(monkeypatch, "fp32_wgrad", autocast=True)
    assert loss == ref_loss
    for name in ref:
        assert got[name].dtype == torch.float32
        rel = ((got[name] - ref[name]).norm() / ref[name].norm()).item()
        assert rel < 0.02, f"{name}: relative difference {rel:.3g}"


def test_linear_fp32_grad_computes_the_linear_map_and_its_gradients():
    torch.manual_seed(0)
    x = torch.randn(3, 5, 8, requires_grad=True)
    w = torch.randn(6, 8, requires_grad=True)
    out = K.LinearFp32Grad.apply(x, w)
    torch.testing.assert_close(out, x @ w.t())
    g = torch.randn_like(out)
    out.backward(g)
    torch.testing.assert_close(x.grad, g @ w)
    torch.testing.assert_close(w.grad, g.reshape(-1, 6).t() @ x.reshape(-1, 8))
    w.requires_grad_(False)
    x.grad = w.grad = None
    out = K.LinearFp32Grad.apply(x, w)
    with MatmulCounter() as mm:
        out.backward(g)  # a frozen weight gets no gradient computed
    assert mm.calls == 1 and w.grad is None and x.grad is not None


class MatmulCounter(TorchDispatchMode):
    """Counts the matrix products (aten mm/bmm/addmm) run inside it."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.bmm, torch.ops.aten.addmm):
            self.calls += 1
        return func(*args, **(kwargs or {}))
