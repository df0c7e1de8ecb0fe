"""Model zoo: real architectures from transformers, torchvision and timm, as their users write them.

Each model is built from its library's config with random weights (``torch.manual_seed(0)``;
nothing is downloaded), small enough to compile in about a minute on 2 cores but with its
architecture's real features (GPT-2's causal mask with padding, Llama's GQA and RoPE, BERT's
``attention_mask``, T5's relative position bias, wav2vec2's weight-normed positional conv, Swin's
shifted windows, ...). Then, in its own child process with a timeout, as a user would:

1. ``turbine_aot.export(model, args=..., kwargs=...)`` with the model's native inputs (HF text
   models get their own ``attention_mask``, never a precomputed float mask);
2. ``ExportOutput.compile()`` with turbine's defaults;
3. run on IREE's ``local-task`` driver and compare every output with eager (max abs error;
   BatchNorm statistics are calibrated first on a few random batches in train mode, then eval);
4. latency: wall-clock time per call, turbine and eager interleaved in the same process (median),
   with CPU time per call beside it; with ``--peers`` (the default of ``nox -s zoo``) ONNX Runtime
   and OpenVINO (f32) are built from the same model (``benchmarks/_peers.py``), checked against
   eager and timed in the same rounds, and the table shows turbine over the faster of them;
   beside it the same module called as the peers are (``prepared``: inputs written once into
   a ``runtime.PreparedCall``'s buffers, numpy results copied, its error against eager in the
   JSON as ``prepared_max_abs_err``; ``turbine`` is the eager-like call, torch tensors in and
   the model's output structure out).

``torchvision`` and ``transformers`` import only after ``tools/torchvision_compat.install()``: the
registry's ``torchvision==0.28.0`` wheel for torch 2.13 is CUDA-linked and its C++ ops do not load
against the CPU torch (``operator torchvision::nms does not exist``); the stand-in schemas let
classification and segmentation models (which never call those ops) and ``transformers`` import.
These libraries are benchmark/test dependencies only (``tools/requirements-dev.txt``).

Usage::

    python benchmarks/zoo.py                      # every model: table + JSON
    python benchmarks/zoo.py --models gpt2,resnet50 --json zoo.json
    python benchmarks/zoo.py --quick              # the CI subset (also `nox -s zoo-quick`)
    python benchmarks/zoo.py --list

It is a benchmark: nothing here asserts on time (``benchmarks/test_zoo.py`` checks numerics).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _p in (HERE, ROOT / "tools"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))


@dataclass
class ZooCase:
    """One model: how to build it and call it.

    ``args``/``kwargs`` are the example inputs (passed to the IREE function flattened, args first,
    kwargs in order); ``more_inputs`` are further input sets for dynamic variants (each checked
    against eager on the same compiled module).
    """

    name: str
    source: str  # "transformers" | "torchvision" | "timm"
    what: str  # the architecture and what of it is kept
    module: Any
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    dynamic_shapes: Any = None
    more_inputs: list[tuple[tuple, dict]] = field(default_factory=list)
    atol: float = 1e-3


# ------------------------------------------------------------------------------------ models
def _torchvision():
    import torchvision_compat

    torchvision_compat.install()
    import torchvision

    return torchvision


def _timm():
    _torchvision()  # timm imports torchvision
    import timm

    return timm


def _transformers():
    import torchvision_compat

    torchvision_compat.install()
    import transformers

    transformers.logging.set_verbosity_error()
    return transformers


def _text_inputs(batch: int, seq: int, vocab: int, *, pad: int = 5):
    """Token ids and the HF ``attention_mask`` (int64, 1 = token), the last row right-padded."""
    import torch

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[-1, seq - pad :] = 0
    return ids, mask


def gpt2(*, dynamic_batch: bool = False) -> ZooCase:
    import torch

    tf = _transformers()
    cfg = tf.GPT2Config(
        n_layer=2, n_embd=128, n_head=4, vocab_size=1024, n_positions=128, use_cache=False
    )
    model = tf.GPT2Model(cfg).eval()
    ids, mask = _text_inputs(2, 32, cfg.vocab_size)
    case = ZooCase(
        "gpt2",
        "transformers",
        "GPT2Model: learned positions, causal mask & padding attention_mask, GELU MLP",
        model,
        kwargs={"input_ids": ids, "attention_mask": mask},
    )
    if dynamic_batch:
        batch = torch.export.Dim("batch", min=1, max=16)
        case.name = "gpt2-dyn-batch"
        case.what = "GPT2Model exported with a dynamic batch dimension, native attention_mask"
        case.dynamic_shapes = {"input_ids": {0: batch}, "attention_mask": {0: batch}}
        ids5, mask5 = _text_inputs(5, 32, cfg.vocab_size, pad=9)
        case.more_inputs = [((), {"input_ids": ids5, "attention_mask": mask5})]
    return case


def llama() -> ZooCase:
    tf = _transformers()
    cfg = tf.LlamaConfig(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=1024,
        max_position_embeddings=256,
        use_cache=False,
    )
    model = tf.LlamaModel(cfg).eval()
    ids, mask = _text_inputs(2, 32, cfg.vocab_size)
    return ZooCase(
        "llama",
        "transformers",
        "LlamaModel: GQA (4 query / 2 KV heads), RoPE, RMSNorm, SwiGLU, causal + padding mask",
        model,
        kwargs={"input_ids": ids, "attention_mask": mask},
    )


def bert(*, dynamic_seq: bool = False) -> ZooCase:
    import torch

    tf = _transformers()
    cfg = tf.BertConfig(
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=256,
        vocab_size=1024,
    )
    model = tf.BertModel(cfg).eval()
    ids, mask = _text_inputs(2, 32, cfg.vocab_size)
    types = torch.zeros_like(ids)
    types[:, 16:] = 1
    case = ZooCase(
        "bert",
        "transformers",
        "BertModel: padding attention_mask, token_type_ids, pooler",
        model,
        kwargs={"input_ids": ids, "attention_mask": mask, "token_type_ids": types},
    )
    if dynamic_seq:
        seq = torch.export.Dim("seq", min=2, max=128)
        case.name = "bert-dyn-seq"
        case.what = "BertModel exported with a dynamic sequence length, native attention_mask"
        case.kwargs = {"input_ids": ids, "attention_mask": mask}
        case.dynamic_shapes = {"input_ids": {1: seq}, "attention_mask": {1: seq}}
        ids2, mask2 = _text_inputs(2, 19, cfg.vocab_size, pad=4)
        case.more_inputs = [((), {"input_ids": ids2, "attention_mask": mask2})]
    return case


def t5_encoder() -> ZooCase:
    tf = _transformers()
    cfg = tf.T5Config(d_model=128, d_kv=32, d_ff=256, num_layers=2, num_heads=4, vocab_size=1024)
    model = tf.T5EncoderModel(cfg).eval()
    ids, mask = _text_inputs(2, 32, cfg.vocab_size)
    return ZooCase(
        "t5-encoder",
        "transformers",
        "T5EncoderModel: relative position bias buckets, RMS layer norm, padding attention_mask",
        model,
        kwargs={"input_ids": ids, "attention_mask": mask},
    )


def vit() -> ZooCase:
    import torch

    tf = _transformers()
    cfg = tf.ViTConfig(
        image_size=64,
        patch_size=8,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=256,
    )
    model = tf.ViTModel(cfg).eval()
    return ZooCase(
        "vit",
        "transformers",
        "ViTModel: patch-embedding conv, CLS token, learned positions, pooler (64×64, 8×8 patches)",
        model,
        args=(torch.randn(2, 3, 64, 64),),
    )


def wav2vec2() -> ZooCase:
    import torch

    tf = _transformers()
    cfg = tf.Wav2Vec2Config(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        conv_dim=(32, 32, 32),
        conv_stride=(5, 2, 2),
        conv_kernel=(10, 3, 3),
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4,
    )
    model = tf.Wav2Vec2Model(cfg).eval()
    return ZooCase(
        "wav2vec2",
        "transformers",
        "Wav2Vec2Model: conv feature encoder with GroupNorm, weight-normed grouped positional "
        "Conv1d (parametrizations.weight_norm), transformer encoder (4000 samples)",
        model,
        args=(torch.randn(1, 4000),),
    )


def whisper_encoder() -> ZooCase:
    import torch

    tf = _transformers()
    cfg = tf.WhisperConfig(
        d_model=64,
        encoder_layers=2,
        encoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_layers=1,
        decoder_attention_heads=4,
        decoder_ffn_dim=128,
        num_mel_bins=16,
        max_source_positions=50,
    )
    model = tf.WhisperModel(cfg).get_encoder().eval()
    return ZooCase(
        "whisper-encoder",
        "transformers",
        "Whisper encoder: two Conv1d + GELU over log-mel frames, sinusoidal positions, "
        "pre-LN transformer",
        model,
        args=(torch.randn(1, 16, 100),),
    )


def resnet50() -> ZooCase:
    import torch

    tv = _torchvision()
    return ZooCase(
        "resnet50",
        "torchvision",
        "ResNet-50: all 16 bottleneck blocks, BatchNorm (calibrated), 1000 classes (96×96 input)",
        tv.models.resnet50(weights=None),
        args=(torch.randn(1, 3, 96, 96),),
    )


def mobilenet_v3() -> ZooCase:
    import torch

    tv = _torchvision()
    return ZooCase(
        "mobilenet-v3",
        "torchvision",
        "MobileNetV3-Large: depthwise convs, squeeze-excitation, hardswish (128×128 input)",
        tv.models.mobilenet_v3_large(weights=None),
        args=(torch.randn(1, 3, 128, 128),),
    )


def efficientnet_b0() -> ZooCase:
    import torch

    tv = _torchvision()
    return ZooCase(
        "efficientnet-b0",
        "torchvision",
        "EfficientNet-B0: MBConv blocks, squeeze-excitation, SiLU, stochastic depth (eval) "
        "(96×96 input)",
        tv.models.efficientnet_b0(weights=None),
        args=(torch.randn(1, 3, 96, 96),),
    )


def lraspp() -> ZooCase:
    import torch

    tv = _torchvision()
    return ZooCase(
        "lraspp-mobilenet-v3",
        "torchvision",
        "LR-ASPP segmentation on MobileNetV3-Large with dilated depthwise convs, bilinear "
        "upsampling (128×128 input, 5 classes)",
        tv.models.segmentation.lraspp_mobilenet_v3_large(
            weights=None, weights_backbone=None, num_classes=5
        ),
        args=(torch.randn(1, 3, 128, 128),),
    )


def convnext() -> ZooCase:
    import torch

    timm = _timm()

    return ZooCase(
        "convnext-atto",
        "timm",
        "ConvNeXt-atto: 7×7 depthwise convs, channels-last LayerNorm, GELU MLP, layer scale "
        "(depths 2-2-6-2; 96×96 input)",
        timm.create_model("convnext_atto", pretrained=False),
        args=(torch.randn(1, 3, 96, 96),),
    )


def swin() -> ZooCase:
    import torch

    timm = _timm()

    model = timm.create_model(
        "swin_tiny_patch4_window7_224",
        pretrained=False,
        img_size=112,
        embed_dim=48,
        depths=(2, 2, 2, 2),
        num_heads=(2, 4, 8, 16),
    )
    return ZooCase(
        "swin",
        "timm",
        "Swin Transformer: shifted 7×7 windows with attention masks, relative position bias, "
        "patch merging (embed 48, depths 2-2-2-2; 112×112 input)",
        model,
        args=(torch.randn(1, 3, 112, 112),),
    )


def regnet() -> ZooCase:
    import torch

    timm = _timm()

    return ZooCase(
        "regnety-002",
        "timm",
        "RegNetY-200MF: grouped convs, squeeze-excitation, BatchNorm (calibrated) (96×96 input)",
        timm.create_model("regnety_002", pretrained=False),
        args=(torch.randn(1, 3, 96, 96),),
    )


ZOO: dict[str, Callable[[], ZooCase]] = {
    "gpt2": gpt2,
    "gpt2-dyn-batch": lambda: gpt2(dynamic_batch=True),
    "llama": llama,
    "bert": bert,
    "bert-dyn-seq": lambda: bert(dynamic_seq=True),
    "t5-encoder": t5_encoder,
    "vit": vit,
    "wav2vec2": wav2vec2,
    "whisper-encoder": whisper_encoder,
    "resnet50": resnet50,
    "mobilenet-v3": mobilenet_v3,
    "efficientnet-b0": efficientnet_b0,
    "lraspp-mobilenet-v3": lraspp,
    "convnext-atto": convnext,
    "swin": swin,
    "regnety-002": regnet,
}
#: The CI subset (a few minutes on 2 cores): HF with its native mask, a dynamic variant, a conv
#: net with BatchNorm, the weight-normed audio model.
QUICK = ("bert", "gpt2-dyn-batch", "llama", "regnety-002")


# ------------------------------------------------------------------------------------- child
def _calibrate_batchnorm(case: ZooCase, batches: int = 4) -> bool:
    """Runs a few random batches in train mode so BatchNorm statistics are not degenerate."""
    import torch

    bns = [m for m in case.module.modules() if isinstance(m, torch.nn.modules.batchnorm._NormBase)]
    if not bns:
        return False
    g = torch.Generator().manual_seed(2)
    case.module.train()
    with torch.no_grad():
        for _ in range(batches):
            args = tuple(
                torch.randn(max(a.shape[0], 2), *a.shape[1:], generator=g)
                if isinstance(a, torch.Tensor) and a.is_floating_point()
                else a
                for a in case.args
            )
            case.module(*args, **case.kwargs)
    case.module.eval()
    return True


def model_case(name: str) -> ZooCase:
    """The zoo's case ``name`` as :func:`run_model` measures it: built, its BatchNorm statistics
    calibrated (with the initial ones a network's activations shrink layer by layer:
    EfficientNet-B0's logits come out near 1e-20), in eval mode. For the tools that measure a
    zoo model outside this script."""
    case = ZOO[name]()
    _calibrate_batchnorm(case)
    case.module.eval()
    return case


def _leaves(out: Any) -> list:
    import torch
    from torch.utils import _pytree as pytree

    return [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


def _flat_inputs(args: tuple, kwargs: dict) -> list:
    return [*args, *kwargs.values()]


def _max_err(got: Any, expected: Any) -> tuple[float, int]:
    import torch

    g = _leaves(got)  # a tensor, a tuple, or the output structure the runtime restored
    e = _leaves(expected)
    if len(g) != len(e):
        raise AssertionError(f"turbine returned {len(g)} tensors, eager {len(e)}")
    err = 0.0
    for a, b in zip(g, e):
        a = torch.as_tensor(a)
        if a.shape != b.shape:
            raise AssertionError(f"shape {tuple(a.shape)} != eager {tuple(b.shape)}")
        err = max(err, float((a.float() - b.float()).abs().max()))
    return err, len(e)


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _peer_calls(case: ZooCase, threads: int, res: dict) -> dict:
    """ONNX Runtime and OpenVINO f32 built from the zoo case; failures are recorded in ``res``."""
    import _peers

    calls: dict = {}
    expected = [_peers._np(t) for t in _peers.flat_tensors(case.module(*case.args, **case.kwargs))]
    td = Path(tempfile.mkdtemp(prefix="turbine-zoo-peers-"))
    onnx_path = None
    for rt in ("ort", "openvino-f32"):
        row: dict[str, Any] = {}
        res.setdefault("peers", {})[rt] = row
        try:
            if rt == "ort":
                onnx_path, export_s = _peers.export_onnx(case.module, case.args, case.kwargs, td)
                built = _peers.build_ort(onnx_path, case.args, case.kwargs, threads, export_s)
            else:
                model, conv_s, notes = _peers.convert_openvino(
                    case.module, case.args, case.kwargs, onnx_path
                )
                built = _peers.build_openvino(
                    model, conv_s, notes, case.args, case.kwargs, threads, f32=True
                )
            row["build_s"] = built.build_s
            row["max_abs_err"] = _peers.max_abs_err(built.outputs(), expected)
            calls[rt] = built.call
        except Exception as e:  # a peer that cannot take the model is a result
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    return calls


def run_model(
    name: str, *, threads: int = 0, calls: int = 20, budget_s: float = 15.0, peers: bool = False
) -> dict:
    """Export, compile with the defaults, run, compare and time one zoo model (in this process);
    ``peers`` times ONNX Runtime and OpenVINO f32 in the same rounds."""
    import _harness
    import torch

    import turbine_aot
    from turbine_aot import runtime

    threads = threads or len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    res: dict[str, Any] = {"model": name, "threads": threads}
    t0 = time.perf_counter()
    case = ZOO[name]()
    res.update(source=case.source, what=case.what, build_s=time.perf_counter() - t0)
    res["params"] = sum(p.numel() for p in case.module.parameters())
    res["batchnorm_calibrated"] = _calibrate_batchnorm(case)
    # Inference, as users run it: timm/torchvision models are built in train mode (swin's
    # stochastic depth then made eager differ from call to call: "error" 1.2e-01).
    case.module.eval()
    with torch.no_grad():
        expected = case.module(*case.args, **case.kwargs)
    # The outputs' scale, so that a small error is not read on degenerate (near-zero) outputs.
    res["eager_max_abs"] = max(float(t.abs().max()) for t in _leaves(expected))

    warnings = _Warnings()
    logging.getLogger("turbine").addHandler(warnings)
    stage = "export"
    try:
        t0 = time.perf_counter()
        eo = turbine_aot.export(
            case.module, args=case.args, kwargs=case.kwargs, dynamic_shapes=case.dynamic_shapes
        )
        res["export_s"] = time.perf_counter() - t0
        stage = "compile"
        with tempfile.TemporaryDirectory(prefix="turbine-zoo-") as td:
            path = Path(td, "module.vmfb")
            t0 = time.perf_counter()
            eo.compile(save_to=path)
            res["compile_s"] = time.perf_counter() - t0
            res["vmfb_bytes"] = path.stat().st_size
            res["compile_flags"] = eo._last_compile_flags
            stage = "run"
            # One thread: torch on one thread against IREE's local-sync driver (no workers).
            flags = [f"--task_topology_max_group_count={threads}"] if threads > 1 else []
            driver = "local-task" if threads > 1 else "local-sync"
            res["driver"] = driver
            m = runtime.load_module(path, device=driver, runtime_flags=flags)
            inputs = _flat_inputs(case.args, case.kwargs)
            got = m.main(*inputs)
            res["max_abs_err"], res["outputs"] = _max_err(got, expected)
            for args, kwargs in case.more_inputs:
                with torch.no_grad():
                    exp_i = case.module(*args, **kwargs)
                err_i, _ = _max_err(m.main(*_flat_inputs(args, kwargs)), exp_i)
                res["max_abs_err"] = max(res["max_abs_err"], err_i)
                res.setdefault("checked_shapes", []).append(
                    [list(t.shape) for t in _flat_inputs(args, kwargs)]
                )
            stage = "time"

            def eager() -> None:
                with torch.no_grad():
                    case.module(*case.args, **case.kwargs)

            fns = {"turbine": lambda: m.main(*inputs), "eager": eager}
            if peers:
                stage = "peers"
                # turbine called as the peers are, checked against eager like every candidate
                import _peers

                fns["turbine-prepared"] = _peers.prepared_call(m, inputs)
                got_p = [torch.from_numpy(r) for r in fns["turbine-prepared"]()]
                res["prepared_max_abs_err"], _ = _max_err(got_p, expected)
                with torch.no_grad():
                    fns.update(_peer_calls(case, threads, res))
                stage = "time"
            timings = _harness.time_interleaved(fns, calls=calls, budget_s=budget_s)
    except Exception as e:  # a failure is a result: the stage and the message
        res["error"] = f"{stage}: {type(e).__name__}: {str(e)[:1500]}"
        return res
    finally:
        logging.getLogger("turbine").removeHandler(warnings)
        res["warnings"] = [w[:500] for w in warnings.messages]
    retries = [w for w in warnings.messages if "speed-only defaults" in w]
    res["fallback"] = bool(retries)
    if retries:  # the groups the compile that worked went without (the last retry's)
        res["fallback_dropped"] = retries[-1].split("speed-only defaults ", 1)[1].split(" (")[0]
    res["ms"] = timings["turbine"]["wall"] * 1e3
    if "turbine-prepared" in timings:
        res["prepared_ms"] = timings["turbine-prepared"]["wall"] * 1e3
    res["eager_ms"] = timings["eager"]["wall"] * 1e3
    res["cpu_ms"] = timings["turbine"]["cpu"] * 1e3
    res["eager_cpu_ms"] = timings["eager"]["cpu"] * 1e3
    for rt, row in res.get("peers", {}).items():
        if rt in timings:
            row["ms"] = timings[rt]["wall"] * 1e3
    res["rounds"] = len(timings["turbine"]["all"])
    res["loadavg_1m"] = os.getloadavg()[0]
    res["passed"] = res["max_abs_err"] <= case.atol
    res["atol"] = case.atol
    return res


# ------------------------------------------------------------------------------------ parent
def run_in_child(name: str, args: argparse.Namespace) -> dict:
    """:func:`run_model` in a child process with ``args.timeout_s`` (``_harness``)."""
    import _harness

    with tempfile.TemporaryDirectory(prefix="turbine-zoo-") as td:
        out = Path(td, f"{name}.json")
        cmd = [sys.executable, str(Path(__file__)), "--_child", name, "--_child-json", str(out)]
        cmd += ["--threads", str(args.threads), "--calls", str(args.calls)]
        cmd += ["--budget-s", str(args.budget_s)]
        if getattr(args, "peers", False):
            cmd.append("--peers")
        child = _harness.run_json_child(cmd, out, timeout=args.timeout_s)
    res = dict(child.result or {})
    if child.error and "error" not in res:
        res["error"] = child.error
    res.setdefault("model", name)
    res["child_wall_s"] = child.wall_s
    return res


def _ratio(a: float | None, b: float | None) -> str:
    return "–" if not a or not b else f"{a / b:.2f}×"


def _peer_cells(r: dict) -> list[str]:
    """ORT and OpenVINO f32 ms (or why not) and turbine over the faster of them."""
    peers = r.get("peers", {})
    cells, best = [], None
    for rt in ("ort", "openvino-f32"):
        row = peers.get(rt, {})
        if "ms" in row:
            cells.append(f"{row['ms']:.2f}")
            best = row["ms"] if best is None else min(best, row["ms"])
        else:
            cells.append("failed" if "error" in row else "")
    cells.append(_ratio(r["ms"], best))
    prepared = r.get("prepared_ms")
    cells += [f"{prepared:.2f}" if prepared else "", _ratio(prepared, best)]
    return cells


def markdown_table(results: list[dict]) -> str:
    """The zoo table: wall-clock latency per call first, CPU time beside it."""
    head = [
        "model",
        "source",
        "params",
        "export s",
        "compile s",
        "max abs err",
        "max abs eager",
        "turbine ms",
        "eager ms",
        "× eager (wall)",
        "× eager (CPU)",
    ]
    with_peers = any("peers" in r for r in results)
    if with_peers:
        head += ["ORT ms", "OpenVINO f32 ms", "× best peer", "prepared ms", "prepared × best peer"]
    head.append("status")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        if "error" in r:
            cells = [r["model"], r.get("source", "")] + [""] * (len(head) - 3)
            cells.append("FAILED: " + r["error"].splitlines()[0][:120].replace("|", "/"))
        else:
            status = "pass" if r["passed"] else f"numerics > {r['atol']:g}"
            if r.get("fallback"):
                dropped = r.get("fallback_dropped", "speed-only defaults")
                status += f" (fallback: {dropped} dropped)"
            cells = [
                r["model"],
                r["source"],
                f"{r['params'] / 1e6:.1f}M",
                f"{r['export_s']:.1f}",
                f"{r['compile_s']:.0f}",
                f"{r['max_abs_err']:.1e}",
                f"{r.get('eager_max_abs', float('nan')):.1e}",
                f"{r['ms']:.2f}",
                f"{r['eager_ms']:.2f}",
                _ratio(r["ms"], r["eager_ms"]),
                _ratio(r["cpu_ms"], r["eager_cpu_ms"]),
            ]
            if with_peers:
                cells += _peer_cells(r)
            cells.append(status)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import _harness

    p = _harness.argument_parser(__doc__)
    p.add_argument("--models", default="", help=f"comma list of: {', '.join(ZOO)}")
    p.add_argument("--quick", action="store_true", help=f"the CI subset: {', '.join(QUICK)}")
    p.add_argument("--list", action="store_true", help="list the models and exit")
    p.add_argument(
        "--threads",
        type=int,
        default=0,
        help="0: every core of this process (IREE local-task); 1: torch on one thread against "
        "IREE local-sync (the figures that hold on a loaded machine)",
    )
    p.add_argument("--calls", type=int, default=20, help="timed calls per candidate")
    p.add_argument("--budget-s", type=float, default=15.0, help="timing budget per model")
    p.add_argument("--timeout-s", type=float, default=600.0, help="per-model child timeout")
    p.add_argument(
        "--peers",
        action="store_true",
        help="also build, check and time ONNX Runtime and OpenVINO f32 on each model",
    )
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--report", default=None, help="print the table of a --json file and exit")
    p.add_argument("--_child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--_child-json", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.list:
        for name in ZOO:
            print(name + (" (quick)" if name in QUICK else ""))
        return 0
    if args.report:
        import json

        print(markdown_table(json.loads(Path(args.report).read_text())["results"]))
        return 0
    if args._child:
        res = run_model(
            args._child,
            threads=args.threads,
            calls=args.calls,
            budget_s=args.budget_s,
            peers=args.peers,
        )
        _harness.write_json(Path(args._child_json), res)
        return 0
    names = list(QUICK) if args.quick else [m for m in args.models.split(",") if m] or list(ZOO)
    unknown = [n for n in names if n not in ZOO]
    if unknown:
        p.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(ZOO)}")
    results = []
    t_all = time.perf_counter()
    for name in names:
        print(f"[zoo] {name} ...", flush=True)
        r = run_in_child(name, args)
        results.append(r)
        status = (
            r["error"].splitlines()[0][:160]
            if "error" in r
            else (
                f"err {r['max_abs_err']:.1e}, {r['ms']:.2f} ms vs eager {r['eager_ms']:.2f} ms "
                f"({_ratio(r['ms'], r['eager_ms'])} wall, {_ratio(r['cpu_ms'], r['eager_cpu_ms'])} CPU)"
            )
        )
        print(f"[zoo] {name}: {status} [{r['child_wall_s']:.0f} s]", flush=True)
    print()
    print(markdown_table(results))
    load = os.getloadavg()[0]
    print(f"\n[zoo] {len(results)} models in {time.perf_counter() - t_all:.0f} s; load {load:.1f}")
    if args.json:
        _harness.write_json(Path(args.json), {"benchmark": "zoo", "results": results})
    return 0 if all(r.get("passed") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
