"""turbine_aot.llm: causal LMs exported as prefill + decode, generating what eager generates.

Small random-init configs (nothing is downloaded): a Llama-family model with GQA and RoPE and
GPT-2, fp32, compared token by token with ``transformers``' greedy ``generate``. Where ids
differ, the test names the first differing position and passes only if the eager top-2 logits
there are within 1e-4 (a tie that float rounding may break either way).
"""

from __future__ import annotations

import json
import re

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is a test dependency")

from turbine_aot import llm  # noqa: E402
from turbine_aot._cli.main import main as cli_main  # noqa: E402
from turbine_aot._compiler.isa import host_isa  # noqa: E402
from turbine_aot.llm._runner import STEP_ENV  # noqa: E402

NEW_TOKENS = 32
TIE = 1e-4


def _llama(layers: int = 2, **over) -> torch.nn.Module:
    fields = dict(
        vocab_size=320,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,  # GQA: 2 query heads per KV head
        max_position_embeddings=128,
        rope_theta=10000.0,
    )
    cfg = transformers.LlamaConfig(**{**fields, **over})
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval()


def _gpt2() -> torch.nn.Module:
    cfg = transformers.GPT2Config(vocab_size=300, n_positions=128, n_embd=64, n_layer=2, n_head=4)
    torch.manual_seed(1)
    return transformers.GPT2LMHeadModel(cfg).eval()


def _prompts(vocab: int, lengths: list[int], seed: int = 3) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g) for n in lengths]


def _eager_greedy(model, prompt: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """HF greedy generate of one prompt: (new ids, per-step logits [n, vocab])."""
    with torch.no_grad():
        out = model.generate(
            prompt.unsqueeze(0),
            attention_mask=torch.ones(1, prompt.numel(), dtype=torch.long),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=0,
        )
    return out.sequences[0, prompt.numel() :], torch.stack(out.logits, 1)[0]


def assert_same_greedy(
    got: torch.Tensor, want: torch.Tensor, eager_logits: torch.Tensor, what: str, tie: float = TIE
):
    """Equal ids, or a first difference where the eager top-2 logits tie within ``tie``."""
    if torch.equal(got, want):
        return
    pos = int((got != want).nonzero()[0, 0])
    top2 = eager_logits[pos].topk(2).values
    gap = float(top2[0] - top2[1])
    assert gap <= tie, (
        f"{what}: first differing generated token at position {pos}: turbine {int(got[pos])}, "
        f"eager {int(want[pos])}; eager top-2 logits differ by {gap:.3g} (> {tie}: not a tie)"
    )
    print(f"{what}: differs from position {pos} on, at a tie (top-2 gap {gap:.2g})")


# ----------------------------------------------------------------------------- IR (no compile)
def test_exported_module_has_prefill_decode_shared_weights_and_cache_globals():
    model = _llama(layers=1)
    eo = llm.export_causal_lm(model, max_seq_len=48)
    ir = str(eo.mlir_module)
    # FileCheck-style: the two entry points with their ABI.
    assert re.search(
        r"func\.func @prefill\(%arg0: !torch\.vtensor<\[1,\?\],si64>, %arg1: "
        r"!torch\.vtensor<\[1\],si64>\) -> !torch\.vtensor<\[1,320\],f32>",
        ir,
    ), ir[:2000]
    assert re.search(
        r"func\.func @decode\(%arg0: !torch\.vtensor<\[1,1\],si64>, %arg1: "
        r"!torch\.vtensor<\[1\],si64>\) -> !torch\.vtensor<\[1,320\],f32>",
        ir,
    )
    # One mutable global per layer for keys and values, [batch, kv_heads, max_seq, head_dim].
    for kind in "kv":
        assert re.search(
            rf"util\.global private mutable @__auto\.kv_cache\.{kind}0 = .* : "
            r"tensor<1x2x48x16xf32>",
            ir,
        )
        assert len(re.findall(rf"util\.global\.store %\S+, @__auto\.kv_cache\.{kind}0", ir)) == 2
    # Weights are external, declared once and loaded by both functions.
    decl = re.findall(
        r"util\.global private @(\S+) = #flow\.parameter\.named<\"model\"::\"model\.embed_tokens\.weight\">",
        ir,
    )
    assert len(decl) == 1
    assert len(re.findall(rf"util\.global\.load @{re.escape(decl[0])} ", ir)) == 2
    assert "dense_resource<torch_tensor_320x64" not in ir  # no weight data inline
    # The description the runner reads from the compiled module.
    # (an entry of the function's iree.reflection dictionary, beside the runtime's own)
    info = re.search(r'iree\.reflection = \{[^\n]*turbine\.llm = "([^"]*)"', ir).group(1)
    assert json.loads(info.replace("\\22", '"'))["max_seq_len"] == 48


def test_argument_cache_is_an_argument_and_a_result():
    eo = llm.export_causal_lm(_llama(layers=1), max_seq_len=16, kv_cache="argument")
    ir = str(eo.mlir_module)
    cache = r"!torch\.vtensor<\[1,2,1,2,16,16\],f32>"
    assert re.search(
        rf"func\.func @decode\(%arg0: !torch\.vtensor<\[1,1\],si64>, %arg1: "
        rf"!torch\.vtensor<\[1\],si64>, %arg2: {cache}\) -> \(!torch\.vtensor<\[1,320\],f32>, {cache}\)",
        ir,
    )
    assert "util.global private mutable" not in ir


# ----------------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def llama_model():
    return _llama()


@pytest.fixture(scope="module")
def llama_batch2(llama_model):
    return llm.load(llm.export_causal_lm(llama_model, max_seq_len=64, batch_size=2))


def test_llama_gqa_generates_eager_greedy_ids(llama_model, llama_batch2):
    """Prompts of lengths 1..20 in batches of 2 (padding, own positions), 32 new tokens."""
    prompts = _prompts(320, [5, 12, 1, 20, 3])
    mask_rows, rows = [], []
    width = max(p.numel() for p in prompts)
    for p in prompts:  # left padding, as transformers does
        rows.append(torch.cat([torch.zeros(width - p.numel(), dtype=torch.long), p]))
        mask_rows.append(torch.cat([torch.zeros(width - p.numel()), torch.ones(p.numel())]))
    out = llama_batch2.generate(
        torch.stack(rows), NEW_TOKENS, attention_mask=torch.stack(mask_rows).long()
    )
    assert out.shape == (5, width + NEW_TOKENS)
    for i, p in enumerate(prompts):
        want, logits = _eager_greedy(llama_model, p, NEW_TOKENS)
        assert_same_greedy(out[i, width:], want, logits, f"llama prompt {i} (len {p.numel()})")
    t = llama_batch2.timings
    assert t.decode_steps == 3 * (NEW_TOKENS - 1) and t.prefill_ms > 0
    print("llama batch 2:", t.to_json())


def test_llama_batched_generate_matches_transformers_batched_generate(llama_model, llama_batch2):
    prompts = _prompts(320, [7, 2], seed=5)
    out = llama_batch2.generate([p.tolist() for p in prompts], 8)  # lists: left-padded here
    ids = torch.zeros(2, 7, dtype=torch.long)
    mask = torch.zeros(2, 7, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, 7 - p.numel() :], mask[i, 7 - p.numel() :] = p, 1
    with torch.no_grad():
        want = llama_model.generate(
            ids, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0
        )
    assert torch.equal(out, want)


def test_gpt2_generates_eager_greedy_ids():
    model = _gpt2()
    lm = llm.load(llm.export_causal_lm(model, max_seq_len=64))
    for i, p in enumerate(_prompts(300, [4, 9, 17], seed=7)):
        out = lm.generate(p.unsqueeze(0), NEW_TOKENS)
        assert torch.equal(out[0, : p.numel()], p)
        want, logits = _eager_greedy(model, p, NEW_TOKENS)
        assert_same_greedy(out[0, p.numel() :], want, logits, f"gpt2 prompt {i}")


def test_argument_cache_generates_the_same_ids_and_reset(llama_model):
    lm = llm.load(llm.export_causal_lm(llama_model, max_seq_len=48, kv_cache="argument"))
    p = _prompts(320, [6], seed=11)[0]
    want, logits = _eager_greedy(llama_model, p, NEW_TOKENS)
    out = lm.generate(p, NEW_TOKENS)
    assert_same_greedy(out[0, 6:], want, logits, "argument cache")
    # The raw entry points: the cache tensor goes in and comes back updated.
    lm.reset()
    first = lm.prefill(torch.cat([p, p[:1]]).unsqueeze(0), torch.tensor([6]))
    assert int(first.argmax()) == int(want[0])
    assert lm._cache is not None and lm._cache.abs().sum() > 0
    second = lm.decode(first.argmax(-1, keepdim=True), torch.tensor([6]))
    assert int(second.argmax()) == int(want[1])


# ----------------------------------------------------------------------------- decode windows
def _count_decodes(lm) -> dict[str, int]:
    """Wraps the loaded module's decode functions (or, where ``generate`` runs the prepared
    step, its call of them by index) to count the calls of each."""
    calls: dict[str, int] = {}

    def counted(name, fn):
        def call(*args):
            calls[name] = calls.get(name, 0) + 1
            return fn(*args)

        return call

    step = lm._prepared_step()
    if step is not None:
        names = ["decode", *lm._decodes]
        prepared = step._call
        step._call = lambda index: counted(names[index], prepared)(index)
        return calls
    lm._decode = counted("decode", lm._decode)
    lm._decodes = {name: counted(name, fn) for name, fn in lm._decodes.items()}
    return calls


@pytest.mark.parametrize(
    ("kv_cache", "step"), [("global", "prepared"), ("global", "generic"), ("argument", "generic")]
)
def test_decode_windows_generate_eager_greedy_ids_across_their_boundaries(
    llama_model, kv_cache, step, monkeypatch
):
    """decode_16 / decode_32 attend to the cache's first 16 / 32 positions: each step takes the
    smallest that holds its positions, and the ids are eager's across both boundaries, through
    the prepared step and through ``decode`` alike."""
    if step == "generic":
        monkeypatch.setenv(STEP_ENV, "generic")
    eo = llm.export_causal_lm(
        llama_model, max_seq_len=64, batch_size=2, decode_windows=(32, 16), kv_cache=kv_cache
    )
    assert eo.llm.decode_windows == (16, 32)
    assert re.findall(r"func\.func @(decode\w*)\(", str(eo.mlir_module)) == [
        "decode",
        "decode_16",
        "decode_32",
    ]
    lm = llm.load(eo)
    calls = _count_decodes(lm)
    assert (lm._prepared_step() is not None) == (step == "prepared")
    prompts = _prompts(320, [5, 12, 20], seed=9)
    for p in prompts:  # 5 + 40 new tokens: positions 5..44, through all three functions
        out = lm.generate(p, 40)
        want, logits = _eager_greedy(llama_model, p, 40)
        assert_same_greedy(out[0, p.numel() :], want, logits, f"window, prompt {p.numel()}")
    # steps at positions len..len+38: 5..15 and 12..15 -> decode_16; 16..31, 16..31 and 20..31
    # -> decode_32; 32..43, 32..50 and 32..58 -> decode
    assert calls == {"decode_16": 11 + 4, "decode_32": 16 + 16 + 12, "decode": 12 + 19 + 27}
    assert [eo.llm.decode_function(p) for p in (0, 15, 16, 31, 32, 63)] == [
        "decode_16",
        "decode_16",
        "decode_32",
        "decode_32",
        "decode",
        "decode",
    ]


def test_decode_windows_auto_options_and_older_modules():
    cfg = {"max_position_embeddings": 1024}
    eo = llm.export_causal_lm(_llama(1, **cfg), max_seq_len=600)  # auto: 128 and 512 below 600
    assert eo.llm.decode_windows == (128, 512)
    assert re.findall(r"func\.func @(\w+)\(", str(eo.mlir_module)) == [
        "prefill",
        "decode",
        "decode_128",
        "decode_512",
    ]
    assert llm.export_causal_lm(_llama(1), max_seq_len=128).llm.decode_windows == ()
    assert (
        llm.export_causal_lm(_llama(1), max_seq_len=64, decode_windows=()).llm.decode_windows == ()
    )
    for bad in ((64,), (0,), (8, "16"), (True,), "some", 16):
        with pytest.raises(llm.LLMExportError, match=r"decode_windows must be 'auto' or ints"):
            llm.export_causal_lm(_llama(1), max_seq_len=64, decode_windows=bad)
    # A module exported before decode windows existed records none: plain decode only.
    info = json.loads(eo.llm.to_json())
    del info["decode_windows"]
    older = llm.CausalLMInfo.from_json(json.dumps(info))
    assert older.decode_windows == () and older.decode_function(5) == "decode"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_prepared_step_generates_what_the_decode_calls_generate(llama_model, dtype, monkeypatch):
    """``generate``'s prepared step (arguments written in place, the argmax of the logits read
    in place; bfloat16 logits widened from their bits) gives the ids of the loop over
    ``decode`` (torch tensors, ``argmax``): three prompts of different lengths in batches of
    two (the second batch filled with a copy), an eos that finishes rows at different steps,
    and decode windows crossed; one timing per step either way."""
    eo = llm.export_causal_lm(
        llama_model, max_seq_len=48, batch_size=2, decode_windows=(16,), dtype=dtype
    )
    prompts = [p.tolist() for p in _prompts(320, [3, 9, 6], seed=21)]
    eos = None
    runs = {}
    for step in ("generic", "prepared"):  # the mode is read when the model is loaded
        if step == "generic":
            monkeypatch.setenv(STEP_ENV, "generic")
        else:
            monkeypatch.delenv(STEP_ENV, raising=False)
        lm = llm.load(eo)
        assert (lm._prepared_step() is not None) == (step == "prepared")
        out = lm.generate(prompts, 30)
        if eos is None:
            eos = int(out[1, -20])  # a token the second row makes mid-way
        stopped = lm.generate(prompts, 30, eos_token_id=eos, pad_token_id=0)
        runs[step] = (out, stopped, lm.timings.decode_steps, lm.timings.new_tokens)
    assert torch.equal(runs["prepared"][0], runs["generic"][0])
    assert runs["prepared"][0].dtype == torch.int64
    assert torch.equal(runs["prepared"][1], runs["generic"][1])
    assert runs["prepared"][2:] == runs["generic"][2:]
    assert (runs["prepared"][1] == eos).any()  # the eos was generated and rows were padded


def test_prepared_step_is_not_used_where_it_does_not_apply(llama_model):
    """An ``argument`` cache goes through ``decode`` (the cache is a call's argument)."""
    lm = llm.load(llm.export_causal_lm(llama_model, max_seq_len=32, kv_cache="argument"))
    assert lm._prepared_step() is None


def test_eos_stops_and_pads():
    model = _llama(layers=1)
    lm = llm.load(llm.export_causal_lm(model, max_seq_len=32))
    p = _prompts(320, [4], seed=2)[0]
    free = lm.generate(p, 10)[0, 4:]
    eos = int(free[2])
    stopped = lm.generate(p, 10, eos_token_id=eos)[0, 4:]
    assert stopped.tolist() == free[:3].tolist()  # stops once every sequence is done
    with pytest.raises(llm.LLMError, match=r"needs 34 cache positions; .* max_seq_len 32"):
        lm.generate(p, 31)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_numerics_vs_fp32(dtype, llama_model):
    """Reports prefill-logit errors and greedy agreement of bf16/fp16 against fp32 eager."""
    lm = llm.load(llm.export_causal_lm(llama_model, max_seq_len=48, dtype=dtype))
    p = _prompts(320, [9], seed=13)[0]
    want, ref_logits = _eager_greedy(llama_model, p, 16)
    got = lm.prefill(torch.cat([p]).unsqueeze(0), torch.tensor([9])).float()[0]
    err = float((got - ref_logits[0]).abs().max())
    scale = float(ref_logits[0].abs().max())
    eager_half = model_half = llama_model.to(dtype)
    try:
        with torch.no_grad():
            eager_logits = model_half(p.unsqueeze(0)).logits[0, -1].float()
    finally:
        llama_model.to(torch.float32)
    eager_err = float((eager_logits - ref_logits[0]).abs().max())
    out = lm.generate(p, 16)[0, 9:]
    agree = int((out == want).cumprod(0).sum())
    print(
        f"{dtype}: prefill logits max abs err vs fp32 {err:.3g} (eager {dtype} {eager_err:.3g}; "
        f"logit scale {scale:.3g}); greedy agrees with fp32 for {agree}/16 tokens"
    )
    assert got.dtype == torch.float32 and lm.info.dtype == str(dtype).removeprefix("torch.")
    assert err <= max(4 * eager_err, 0.05 * scale)  # the same precision class as eager
    del eager_half


# ----------------------------------------------------------------------------- other families
_SMALL = dict(
    vocab_size=200, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4
)
#: The other supported transformers families, small and random-init (seeded by the tests).
_FAMILIES = {
    "mistral": lambda: transformers.MistralForCausalLM(
        transformers.MistralConfig(**_SMALL, num_key_value_heads=1, sliding_window=None)
    ),
    "qwen2": lambda: transformers.Qwen2ForCausalLM(
        transformers.Qwen2Config(**_SMALL, num_key_value_heads=2)
    ),
    "qwen3": lambda: transformers.Qwen3ForCausalLM(
        transformers.Qwen3Config(**_SMALL, num_key_value_heads=2, head_dim=16)
    ),
    # the LM head shares the embedding's weight (quantize= quantizes the head, not the table)
    "llama-tied": lambda: transformers.LlamaForCausalLM(
        transformers.LlamaConfig(**_SMALL, num_key_value_heads=2, tie_word_embeddings=True)
    ),
    "gpt2": lambda: transformers.GPT2LMHeadModel(
        transformers.GPT2Config(vocab_size=200, n_positions=128, n_embd=64, n_layer=2, n_head=4)
    ),
}


@pytest.mark.parametrize(
    "make", [_FAMILIES[k] for k in ("mistral", "qwen2", "qwen3")], ids=["mistral", "qwen2", "qwen3"]
)
def test_adapter_programs_in_eager_match_transformers(make):
    """The prefill/decode programs (before export) give HF's greedy ids for the other families."""
    from turbine_aot.llm._export import CausalLMInfo, _CausalLMRoot
    from turbine_aot.llm._hf import adapt_hf_model

    torch.manual_seed(0)
    model = make().eval()
    lm = adapt_hf_model(model, 32)
    layout = lm.kv_cache_layout
    info = CausalLMInfo(
        32, 1, "global", 200, layout.num_layers, layout.num_kv_heads, layout.head_dim, "float32"
    )
    root = _CausalLMRoot(lm, info)
    p = _prompts(200, [5], seed=4)[0]
    want, logits = _eager_greedy(model, p, 12)
    got = []
    with torch.no_grad():
        tok = root.prefill(p.unsqueeze(0), torch.tensor([5])).argmax(-1)
        got.append(tok)
        for i in range(11):
            tok = root.decode(tok.unsqueeze(1), torch.tensor([5 + i])).argmax(-1)
            got.append(tok)
    assert_same_greedy(torch.cat(got), want, logits, type(model).__name__)


@pytest.mark.parametrize(
    "family, quantize",
    [
        ("mistral", None),
        ("qwen2", None),
        ("qwen3", None),
        ("mistral", "int4"),
        ("qwen2", "int4"),
        ("qwen3", "int4"),
        ("llama-tied", "int8"),
        ("gpt2", "int4"),
    ],
)
def test_other_families_compiled_generate_eager_greedy_ids(family, quantize):
    """Each supported family compiled (fp32, and quantized as ``llm.quantized_copy`` quantizes
    it: int4 in groups of 32, int8 per channel) generates the greedy ids of its eager model (the
    quantized copy's for quantize=), over two prompts."""
    if quantize is not None:
        _torchao_or_skip()
    torch.manual_seed(0)
    model = _FAMILIES[family]().eval()
    group_size = 32 if quantize == "int4" else None
    eo = llm.export_causal_lm(model, max_seq_len=48, quantize=quantize, group_size=group_size)
    if family == "gpt2" and quantize is not None:
        # GPT-2's projections are transformers' Conv1D, not nn.Linear: quantized all the same
        ir = str(eo.mlir_module)
        for proj in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"):
            assert f'"transformer.h.1.{proj}.weight.qdata"' in ir, proj
    lm = llm.load(eo)
    eager = (
        model if quantize is None else llm.quantized_copy(model, quantize, group_size=group_size)
    )
    for i, p in enumerate(_prompts(200, [5, 11], seed=3)):
        want, logits = _eager_greedy(eager, p, 16)
        lm.reset()
        out = lm.generate(p, 16)
        assert_same_greedy(out[0, p.numel() :], want, logits, f"{family} {quantize} prompt {i}")


# ----------------------------------------------------------------------------- plain nn.Module
class TinyLM(torch.nn.Module):
    """A plain module under the calling convention: cache.update + additive mask."""

    def __init__(self, vocab: int = 50, dim: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads, self.hd = heads, dim // heads
        self.emb = torch.nn.Embedding(vocab, dim)
        self.pos = torch.nn.Embedding(64, dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.out = torch.nn.Linear(dim, vocab)
        self.vocab_size = vocab
        self.kv_cache_layout = llm.KVCacheLayout(num_layers=1, num_kv_heads=heads, head_dim=self.hd)

    def forward(self, input_ids, *, position_ids, attention_mask, cache):
        b, s = input_ids.shape
        h = self.emb(input_ids) + self.pos(position_ids)
        q, k, v = self.qkv(h).view(b, s, 3, self.heads, self.hd).permute(2, 0, 3, 1, 4)
        k, v = cache.update(k, v, 0)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask)
        return self.out(h + a.transpose(1, 2).reshape(b, s, -1))


def _tiny_greedy(model: TinyLM, prompt: torch.Tensor, n: int) -> list[int]:
    """Reference: no cache at all, the whole sequence each step."""
    ids = prompt.tolist()

    class NoCache:
        def update(self, k, v, layer):
            return k, v

    for _ in range(n):
        x = torch.tensor([ids])
        s = x.shape[1]
        causal = torch.full((s, s), torch.finfo(torch.float32).min).triu(1)
        with torch.no_grad():
            logits = model(
                x, position_ids=torch.arange(s)[None], attention_mask=causal, cache=NoCache()
            )
        ids.append(int(logits[0, -1].argmax()))
    return ids[prompt.numel() :]


def test_plain_module_following_the_calling_convention():
    torch.manual_seed(0)
    model = TinyLM().eval()
    lm = llm.load(llm.export_causal_lm(model, max_seq_len=40, external_parameters=False))
    p = torch.tensor([3, 1, 4, 1, 5])
    assert lm.generate(p.tolist(), 20)[0, 5:].tolist() == _tiny_greedy(model, p, 20)  # flat list


# ----------------------------------------------------------------------------- errors
def test_unsupported_models_and_options_are_refused():
    bert = transformers.BertLMHeadModel(
        transformers.BertConfig(
            vocab_size=50,
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
            is_decoder=True,
        )
    )
    with pytest.raises(llm.LLMExportError, match=r"model_type 'bert'.*supported: llama, .*gpt2"):
        llm.export_causal_lm(bert, max_seq_len=16)
    with pytest.raises(llm.LLMExportError, match="kv_cache must be one of global, argument"):
        llm.export_causal_lm(_llama(1), max_seq_len=16, kv_cache="paged")
    with pytest.raises(
        llm.LLMExportError, match="exceeds LlamaForCausalLM's max_position_embeddings 128"
    ):
        llm.export_causal_lm(_llama(1), max_seq_len=512)
    with pytest.raises(llm.LLMExportError, match="kv_cache_layout"):
        llm.export_causal_lm(torch.nn.Linear(2, 2), max_seq_len=16)
    with pytest.raises(llm.LLMError, match=r"is not from turbine_aot\.llm\.export_causal_lm"):
        import turbine_aot

        llm.load(turbine_aot.export(torch.nn.Linear(2, 2), args=(torch.randn(1, 2),)))


# ----------------------------------------------------------------------------- CLI
def test_cli_llm_export_and_generate(tmp_path, capsys):
    src = tmp_path / "tiny_config.py"
    src.write_text(
        "from transformers import LlamaConfig\n"
        "config = LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64,\n"
        "    num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,\n"
        "    max_position_embeddings=64)\n"
    )
    bundle = tmp_path / "tiny_llm"
    assert (
        cli_main(
            [
                *["--json", "llm", "export", f"{src}:config", "--max-seq-len", "32"],
                *["-o", str(bundle), "--decode-windows", "8,16"],
            ]
        )
        == 0
    )
    exported = json.loads(capsys.readouterr().out)
    assert exported["functions"] == ["prefill", "decode", "decode_8", "decode_16"]
    assert (bundle / "params" / "model.irpa").is_file() and (bundle / "module.vmfb").is_file()
    assert (
        cli_main(
            ["--json", "llm", "generate", str(bundle), "--ids", "1,2,3", "--max-new-tokens", "12"]
        )
        == 0
    )
    result = json.loads(capsys.readouterr().out)
    assert len(result["ids"]) == 12 and result["tokens_per_s"] > 0
    # The same ids as eager: rebuild the model the CLI built (same seed).
    torch.manual_seed(0)
    import importlib.util

    spec = importlib.util.spec_from_file_location("tiny_config_ref", src)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    model = transformers.AutoModelForCausalLM.from_config(mod.config).eval()
    want, logits = _eager_greedy(model, torch.tensor([1, 2, 3]), 12)
    assert_same_greedy(torch.tensor(result["ids"]), want, logits, "cli")
    # A user error is one line, status 2.
    assert cli_main(["llm", "generate", str(bundle), "--ids", "1,x"]) == 2
    assert "bad --ids '1,x'" in capsys.readouterr().err
    args = ["llm", "export", f"{src}:config", "--max-seq-len", "32", "-o", str(tmp_path / "b")]
    assert cli_main([*args, "--decode-windows", "8,x"]) == 2
    assert (
        "--decode-windows takes 'auto', 'none' or comma-separated ints" in capsys.readouterr().err
    )


# ----------------------------------------------------------------------------- quantized
def _torchao_or_skip():
    pytest.importorskip(
        "torchao.quantization", reason="torchao is a dev requirement (tools/requirements-dev.txt)"
    )


@pytest.mark.parametrize(
    "quantize, group_size, qdata",
    [("int8", None, "tensor<64x64xi8>"), ("int4", 32, "tensor<64x64xi4>")],
    ids=["int8", "int4-g32"],
)
def test_quantized_llama_generates_torchao_eager_greedy_ids(
    llama_model, tmp_path, quantize, group_size, qdata
):
    """quantize= exports torchao's quantized copy: the same greedy ids as it in eager."""
    _torchao_or_skip()
    eo = llm.export_causal_lm(llama_model, max_seq_len=64, quantize=quantize, group_size=group_size)
    ir = str(eo.mlir_module)
    assert re.search(
        r"@__auto\.model\.layers\.0\.self_attn\.q_proj\.weight\.qdata = #flow\.parameter\.named"
        rf'<"model"::"model\.layers\.0\.self_attn\.q_proj\.weight\.qdata"> : {qdata}',
        ir,
    )
    assert "model.layers.0.self_attn.q_proj.weight.scale" in ir
    assert type(llama_model.model.layers[0].self_attn.q_proj.weight) is torch.nn.Parameter
    if quantize == "int4" and host_isa() == "avx2":  # decode's one-row products: nibble masks
        from kernel_testing import compile_copy_asm

        from turbine_aot._compiler.flags import default_compile_flags

        asm = compile_copy_asm(eo, default_compile_flags("llvm-cpu", use_env=False))
        assert re.search(r"_cvt_nm[12]_pr\b", asm)  # ... reading rows prepared once per call
        assert "flow.dispatch @__turbine_avx2_i4_row_" in asm
    eager = llm.quantized_copy(llama_model, quantize, group_size=group_size)
    lm = llm.load(eo)  # weights from memory (llm_parameters)
    eo.save_parameters(tmp_path / "q.irpa")
    from_archive = llm.load(eo, parameters=tmp_path / "q.irpa")
    for i, p in enumerate(_prompts(320, [5, 13], seed=17)):
        want, logits = _eager_greedy(eager, p, NEW_TOKENS)
        for runner, what in ((lm, "memory"), (from_archive, "irpa")):
            runner.reset()
            out = runner.generate(p, NEW_TOKENS)
            assert_same_greedy(out[0, p.numel() :], want, logits, f"{quantize} {what} prompt {i}")


#: w8a8's ties: the activations are rounded to int8 per row, so a float rounding difference
#: upstream (IREE's and eager's fp32 norms, attention) that moves one activation across a
#: rounding boundary changes it by a whole step; measured: a first difference at a top-2 gap of
#: 2.9e-3 (prompt 1, position 18), with IREE's own integer matmul as with turbine's kernel.
W8A8_TIE = 1e-2


def test_w8a8_llama_generates_torchao_eager_greedy_ids(llama_model, monkeypatch):
    """quantize="w8a8" (int8 activations and weights): on turbine's VNNI kernel where the CPU
    has it, the same greedy ids as IREE's own integer matmul (the kernel's sums are exact), and
    torchao eager's up to ties of the activations' rounding (W8A8_TIE)."""
    _torchao_or_skip()
    from kernel_testing import compile_copy_asm

    from turbine_aot._compiler.avx512_vnni import host_vnni_missing
    from turbine_aot._compiler.flags import default_compile_flags

    monkeypatch.delenv("TURBINE_CPU_MATMUL", raising=False)
    monkeypatch.delenv("TURBINE_CPU_INT8_MATMUL", raising=False)
    eo = llm.export_causal_lm(llama_model, max_seq_len=64, quantize="w8a8")
    assert "torch.aten._int_mm" in str(eo.mlir_module)
    asm = compile_copy_asm(eo, default_compile_flags("llvm-cpu", use_env=False))
    kernel = "func.func private @__turbine_avx512_vnni_int8_matmul_" in asm
    assert kernel == (not host_vnni_missing() and "avx512f" in asm)
    eager = llm.quantized_copy(llama_model, "w8a8")
    lm = llm.load(eo)
    monkeypatch.setenv("TURBINE_CPU_INT8_MATMUL", "iree")
    iree = llm.load(eo)  # IREE's integer matmul
    for i, p in enumerate(_prompts(320, [5, 13], seed=17)):
        want, logits = _eager_greedy(eager, p, NEW_TOKENS)
        lm.reset()
        iree.reset()
        out = lm.generate(p, NEW_TOKENS)[0, p.numel() :]
        assert torch.equal(out, iree.generate(p, NEW_TOKENS)[0, p.numel() :])
        assert_same_greedy(out, want, logits, f"w8a8 prompt {i} (kernel: {kernel})", W8A8_TIE)


def test_w4a8_llama_generates_torchao_eager_greedy_ids(monkeypatch):
    """quantize="w4a8" (int4 weights in groups of 32, int8 activations; widths 128 / 256, which
    the kernel takes): on turbine's w4a8 kernel where the CPU has VNNI (its VNNI form) or only
    AVX2 (its AVX2 form), torchao eager's
    greedy ids up to ties of the activations' rounding (W8A8_TIE: the same int8 rounding of
    the activations as w8a8's), as on the weight-only int4 kernel (TURBINE_CPU_INT8_MATMUL=iree,
    the path before)."""
    _torchao_or_skip()
    from kernel_testing import compile_copy_asm

    from turbine_aot._compiler.avx512_vnni import host_vnni_missing
    from turbine_aot._compiler.flags import default_compile_flags
    from turbine_aot._compiler.isa import host_isa

    monkeypatch.delenv("TURBINE_CPU_MATMUL", raising=False)
    monkeypatch.delenv("TURBINE_CPU_INT8_MATMUL", raising=False)
    model = _llama(hidden_size=128, intermediate_size=256)
    eo = llm.export_causal_lm(model, max_seq_len=64, quantize="w4a8", group_size=32)
    asm = compile_copy_asm(eo, default_compile_flags("llvm-cpu", use_env=False))
    vnni = host_isa() == "avx512" and not host_vnni_missing()
    kernel = "avx512_vnni" if vnni else "avx2" if host_isa() == "avx2" else ""
    calls = asm.count("_w4a8_matmul_") // 2  # each private function: its definition and call
    # per layer q, k, v, o, gate, up, down (twice: prefill and decode), and the LM head's two
    assert calls == ((2 * 7 + 1) * 2 if kernel else 0)
    assert asm.count(f"func.func private @__turbine_{kernel}_w4a8_matmul_") == calls
    eager = llm.quantized_copy(model, "w4a8", group_size=32)
    lm = llm.load(eo)
    monkeypatch.setenv("TURBINE_CPU_INT8_MATMUL", "iree")
    before = llm.load(eo)  # the weight-only int4 kernel on the dequantized activations
    for i, p in enumerate(_prompts(320, [5, 13], seed=17)):
        want, logits = _eager_greedy(eager, p, NEW_TOKENS)
        for runner, what in ((lm, f"kernel: {kernel}"), (before, "weight-only int4 kernel")):
            runner.reset()
            out = runner.generate(p, NEW_TOKENS)[0, p.numel() :]
            assert_same_greedy(out, want, logits, f"w4a8 prompt {i} ({what})", W8A8_TIE)


def test_quantize_options_are_checked():
    _torchao_or_skip()
    model = _llama(layers=1)
    with pytest.raises(llm.LLMExportError, match=r"group_size=128 does not divide.*64 inputs"):
        llm.export_causal_lm(model, max_seq_len=16, quantize="int4")
    with pytest.raises(
        llm.LLMExportError, match="quantize must be one of 'int8', 'int4', 'w8a8', 'w4a8'"
    ):
        llm.export_causal_lm(model, max_seq_len=16, quantize="fp4")
    for quantize in ("int8", "w8a8"):
        with pytest.raises(llm.LLMExportError, match="group_size is for quantize='int4'"):
            llm.export_causal_lm(model, max_seq_len=16, quantize=quantize, group_size=32)
    with pytest.raises(llm.LLMExportError, match="group_size is for quantize='int4'"):
        llm.export_causal_lm(model, max_seq_len=16, group_size=32)
    with pytest.raises(llm.LLMExportError, match="even int >= 2"):
        llm.export_causal_lm(model, max_seq_len=16, quantize="int4", group_size=3)
    with pytest.raises(llm.LLMExportError, match=r"group_size=128 does not divide.*64 inputs"):
        llm.export_causal_lm(model, max_seq_len=16, quantize="w4a8")
    with pytest.raises(llm.LLMExportError, match="even int >= 2"):
        llm.export_causal_lm(model, max_seq_len=16, quantize="w4a8", group_size=3)


@pytest.mark.parametrize("quantize", ["int4", "w4a8"])
def test_cli_llm_export_quantize_int4(tmp_path, capsys, quantize):
    """``--quantize int4`` / ``w4a8`` (int4 weights packed in the archive either way)."""
    _torchao_or_skip()
    src = tmp_path / "tiny_config.py"
    src.write_text(
        "from transformers import LlamaConfig\n"
        "config = LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128,\n"
        "    num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,\n"
        "    max_position_embeddings=64)\n"
    )
    bundle = tmp_path / f"tiny_{quantize}"
    args = ["--json", "llm", "export", f"{src}:config", "--max-seq-len", "32", "-o", str(bundle)]
    assert cli_main([*args, "--quantize", quantize, "--group-size", "32"]) == 0
    capsys.readouterr()
    from turbine_params import ParameterArchive

    with ParameterArchive(bundle / "params" / "model.irpa") as archive:
        md = archive["model.layers.0.mlp.up_proj.weight.qdata"].tensor_metadata
        assert md.packed == ("int4", (128, 64))
    generate = ["--json", "llm", "generate", str(bundle), "--ids", "1,2,3", "--max-new-tokens"]
    assert cli_main([*generate, "16"]) == 0
    got = json.loads(capsys.readouterr().out)["ids"]
    torch.manual_seed(0)
    import importlib.util

    spec = importlib.util.spec_from_file_location("tiny_int4_ref", src)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    model = transformers.AutoModelForCausalLM.from_config(mod.config).eval()
    eager = llm.quantized_copy(model, quantize, group_size=32)
    want, logits = _eager_greedy(eager, torch.tensor([1, 2, 3]), len(got))
    tie = W8A8_TIE if quantize == "w4a8" else TIE
    assert_same_greedy(torch.tensor(got), want, logits, f"cli {quantize}", tie)
    # A bad group size is a one-line error.
    assert cli_main([*args[1:], "--force", "--quantize", quantize]) == 2
    assert "group_size=128 does not divide" in capsys.readouterr().err
