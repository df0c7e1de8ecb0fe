"""The LLM benchmarks' bandwidth limits (``nox -s zoo-quick``, tagged ``ci``): the weight bytes a
decode step reads, counted from the archive a real export saves (and from a GGUF llama.cpp
reads), against the same count made from the model's own parameters. Nothing here is timed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness

transformers = pytest.importorskip("transformers")


def _llama(tie: bool = False):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=320,  # write_gguf's vocabulary needs 259 tokens or more
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=tie,
    )
    return transformers.LlamaForCausalLM(cfg).eval()


def _saved(model, path: Path) -> Path:
    from turbine_aot import llm

    llm.export_causal_lm(model, max_seq_len=16).save_parameters(path)
    return path


def _fp32_bytes_read(model) -> int:
    """fp32 weights a step reads, from the parameters: each once, of an embedding that is not
    the output layer's one row."""
    out = model.get_output_embeddings().weight
    total = 0
    for _, p in model.named_parameters():  # shared parameters are listed once
        total += p.numel() * 4
    for m in model.modules():
        if isinstance(m, torch.nn.Embedding) and m.weight is not out:
            total -= (m.num_embeddings - 1) * m.embedding_dim * 4
    return total


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_a_step_reads_every_weight_and_one_row_of_an_untied_embedding(tmp_path, tie):
    model = _llama(tie)
    irpa = _saved(model, tmp_path / "w.irpa")
    # tied: the archive names the table twice (embedding and LM head), stored once, read once
    assert _harness.decode_read_bytes(model, irpa) == _fp32_bytes_read(model)


def test_quantized_weights_count_as_stored(tmp_path):
    pytest.importorskip("torchao", reason="torchao (tools/requirements-dev.txt) is not installed")
    from turbine_aot import llm

    fp32 = _llama()
    q = llm.quantized_copy(fp32, "int4", group_size=32)
    got = _harness.decode_read_bytes(q, _saved(q, tmp_path / "q.irpa"))
    linear = sum(m.weight.numel() for m in fp32.modules() if isinstance(m, torch.nn.Linear))
    rest = _fp32_bytes_read(fp32) - linear * 4  # norms and one embedding row, still fp32
    # packed int4 (half a byte a weight) plus each group of 32's scale and zero point
    assert rest + linear // 2 < got <= rest + linear // 2 + (linear // 32) * 8


def test_a_gguf_step_reads_the_same_weights(tmp_path):
    pytest.importorskip(
        "gguf", reason="gguf is a bench-llm requirement (tools/requirements-bench-llm.txt)"
    )
    import llama_cpp_side_by_side as side

    model = _llama()
    path = tmp_path / "m.gguf"
    side.write_gguf(model, path, "F32")
    # GGUF holds the same fp32 tensors (the RMS norms too)
    assert side.gguf_decode_read_bytes(path) == _fp32_bytes_read(model)
