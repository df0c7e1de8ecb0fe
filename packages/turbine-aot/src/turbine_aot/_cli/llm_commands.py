"""``turbine-aot llm``: export a causal LM to a bundle, generate tokens from one.

::

    turbine-aot llm export model.py:config --max-seq-len 256 -o tiny_llm   # bundle directory
    turbine-aot llm export model.py:config --max-seq-len 256 --quantize int4 -o tiny_llm_int4
    turbine-aot llm generate tiny_llm --ids 1,2,3 --max-new-tokens 32 [--json]

``export`` takes ``file.py:NAME`` or ``package.module:NAME`` naming a ``transformers`` config (a
model is built from it with random weights, seeded by ``--seed``: nothing is downloaded), a
causal LM instance, class or factory. The bundle holds the ``.vmfb`` (``prefill`` and
``decode``), the weights as ``params/model.irpa`` and the manifest.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from turbine_aot._bundle.write import save_bundle

from .inputs import CliError, _load_source
from .progress import Stages

__all__ = ["register"]

_DTYPES = ("float32", "bfloat16", "float16")


def register(sub: Any, common: Any, commands: dict[str, Any]) -> None:
    """Adds ``llm export`` / ``llm generate`` to the ``turbine-aot`` parser."""
    llm = sub.add_parser("llm", help="causal LMs: export prefill+decode to a bundle, generate")
    common(llm)
    llm_sub = llm.add_subparsers(dest="llm_command", required=True)

    e = llm_sub.add_parser("export", help="export a causal LM (prefill + decode) to a bundle")
    e.add_argument("source", help="CONFIG_OR_MODEL.py:NAME or package.module:NAME")
    e.add_argument("--max-seq-len", type=int, required=True, help="KV cache positions")
    e.add_argument("--batch-size", type=int, default=1, help="sequences per call (default 1)")
    e.add_argument("--dtype", choices=_DTYPES, default=None, help="compute dtype")
    e.add_argument(
        "--kv-cache",
        choices=("global", "argument"),
        default="global",
        help="keep the KV cache in the module's globals (default) or pass it as an argument",
    )
    e.add_argument(
        "--quantize",
        choices=("int8", "int4", "w8a8", "w4a8"),  # llm.QUANTIZATIONS (llm is heavy)
        default=None,
        help="quantize the linear layers with torchao first (needs torchao): int8 / int4 "
        "weights, w8a8 (int8 weights and activations, integer products) or w4a8 (int4 "
        "weights in groups, int8 activations, integer products)",
    )
    e.add_argument(
        "--group-size",
        type=int,
        default=None,
        help="inputs per int4 scale (default 128; with --quantize int4 or w4a8)",
    )
    e.add_argument(
        "--decode-windows",
        default="auto",
        help="cache lengths W < --max-seq-len to export decode_W for, comma-separated (a step "
        "at positions below W attends to W entries), 'none', or 'auto' (default: those of "
        "128,512,2048,8192 below --max-seq-len)",
    )
    e.add_argument("--device", "-d", default="local-task", help="device URI it is built for")
    e.add_argument("--seed", type=int, default=0, help="seed of the random weights of a config")
    e.add_argument("-o", "--output", required=True, help="bundle directory, or .tar / .tar.gz")
    e.add_argument("--force", action="store_true", help="replace an existing bundle")
    common(e)

    g = llm_sub.add_parser("generate", help="greedy generation from an exported causal LM")
    g.add_argument("bundle", help="a bundle from 'turbine-aot llm export' (or a .vmfb)")
    g.add_argument(
        "--ids", action="append", required=True, help="prompt token ids 1,2,3 (repeat: a batch)"
    )
    g.add_argument(
        "--max-new-tokens", type=int, default=32, help="tokens to generate at most (default 32)"
    )
    g.add_argument("--eos", type=int, default=None, help="end-of-sequence token id")
    g.add_argument("--device", "-d", default=None, help="device URI (default: the bundle's)")
    common(g)
    commands["llm"] = _cmd_llm


def _cmd_llm(args: argparse.Namespace, st: Stages) -> dict[str, Any]:
    if args.llm_command == "export":
        return _export(args, st)
    return _generate(args, st)


def _build_model(obj: Any, seed: int) -> Any:
    import torch

    if isinstance(obj, torch.nn.Module):
        return obj
    if hasattr(obj, "model_type") and hasattr(obj, "to_dict"):  # a transformers config
        import transformers

        torch.manual_seed(seed)
        try:
            return transformers.AutoModelForCausalLM.from_config(obj)
        except ValueError as e:
            raise CliError(f"cannot build a causal LM from this config: {e}") from e
    raise CliError(
        f"the source is a {type(obj).__name__}; name a transformers config or a causal LM "
        "(nn.Module instance, class or factory)"
    )


def _decode_windows(text: str) -> Any:
    """``--decode-windows``: ``auto``, ``none`` or ``W,W,...``."""
    text = text.strip().lower()
    if text in ("auto", "none"):
        return "auto" if text == "auto" else ()
    try:
        return tuple(int(w) for w in text.split(","))
    except ValueError:
        raise CliError(
            f"--decode-windows takes 'auto', 'none' or comma-separated ints; got {text!r}"
        ) from None


def _export(args: argparse.Namespace, st: Stages) -> dict[str, Any]:
    import torch

    from turbine_aot.llm import export_causal_lm

    if args.max_seq_len < 2:
        raise CliError(f"--max-seq-len must be at least 2; got {args.max_seq_len}")
    windows = _decode_windows(args.decode_windows)
    with st("load source"):
        model = _build_model(_load_source(args.source), args.seed)
    dtype = getattr(torch, args.dtype) if args.dtype else None
    with st("export"):
        eo = export_causal_lm(
            model,
            max_seq_len=args.max_seq_len,
            batch_size=args.batch_size,
            dtype=dtype,
            kv_cache=args.kv_cache,
            quantize=args.quantize,
            group_size=args.group_size,
            decode_windows=windows,
        )
    with tempfile.TemporaryDirectory(prefix="turbine-llm-") as tmp:
        irpa = Path(tmp) / "model.irpa"
        with st("save params"):
            eo.save_parameters(irpa)
        with st("compile + bundle"):
            bundle = save_bundle(
                args.output, eo, parameters=irpa, device=args.device, overwrite=args.force
            )
    info = eo.llm
    return {
        "bundle": str(bundle.path),
        "functions": list(bundle.manifest["functions"]),
        "llm": info.__dict__,
        "parameters": sum(t.numel() for t in model.parameters()),
        "timings": st.timings,
    }


def _parse_ids(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise CliError(
            f"bad --ids {text!r}: expected token ids separated by commas, e.g. 1,2,3"
        ) from None
    if not ids:
        raise CliError("--ids is empty: give at least one token id, e.g. --ids 1,2,3")
    return ids


def _generate(args: argparse.Namespace, st: Stages) -> dict[str, Any]:
    from turbine_aot.llm import load

    prompts = [_parse_ids(t) for t in args.ids]
    if not Path(args.bundle).exists():
        raise CliError(f"bundle {args.bundle!r} does not exist")
    with st("load"):
        lm = load(args.bundle, **({"device": args.device} if args.device else {}))
    with st("generate"):
        out = lm.generate(prompts, args.max_new_tokens, eos_token_id=args.eos)
    width = max(len(p) for p in prompts)
    new = out[:, width:].tolist()
    t = lm.timings
    return {
        "ids": new[0] if len(new) == 1 else new,
        "tokens_per_s": round(t.decode_tokens_per_s, 2),
        "prefill_ms": round(t.prefill_ms, 3),
        "decode_ms_per_token": round(t.decode_ms_per_token, 3),
        "timings": st.timings,
    }
