"""The softmax over a dynamic sequence or batch on another CPU: is the reciprocal form right
there, and what does it buy? (docs/performance.md, section 20.)

IREE 3.13 miscomputes ``exp(s - max) * reciprocal(sum)`` over dynamic shapes in some programs
(``tests/test_cpu_softmax.py``). On AVX2 builds the form is right where every use of the
softmax is a product on turbine's dynamic-size kernel, so turbine writes it there
(``softmax.DYNAMIC_SOFTMAX_ISAS``). This checks the same on a CPU this machine may not have
(AVX-512), with modules built here and run there, where only the IREE runtime is needed:

* ``python benchmarks/dynamic_softmax_prebuilt.py prepare DIR --cpu x86-64-v4 --isa avx512``
  (here, with the compiler): for each program and variant a ``.vmfb``, its inputs and eager's
  outputs (``.npz``), and ``cases.json``. Variants: ``main`` (today's rules for that ISA),
  ``dynsoftmax`` (the form over dynamic shapes on that ISA too), and two probes of IREE's
  miscompile that hand IREE the form with nothing in the way (``iree-form``: IREE's own
  products; expected wrong where IREE still has the bug).
* ``python benchmarks/dynamic_softmax_prebuilt.py run DIR --json out.json`` (there: numpy and
  iree-base-runtime; torch + transformers for eager's time, optional): each module's max abs
  error against eager at every input, and for the BERT, median ms per call on one thread
  (``local-sync``) of each variant and, where transformers is there, eager.

``--cpu host`` builds for this machine instead (a check of the script itself).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import _harness

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

#: Sequence lengths the BERT is called at (vector main loops, remainders, the zoo's 32).
BERT_SEQS = (19, 32, 64, 128, 256)
#: Lengths of the small self-attention (5 and 37: vector remainders, where AVX2 went wrong).
SELF_SEQS = (5, 24, 37)


@contextmanager
def _variant(name: str, isa: str) -> Iterator[None]:
    """The compile-time rules of variant ``name`` (see the module's docstring)."""
    from turbine_aot._compiler import rewrites, softmax

    saved_isas, saved_forms = softmax.DYNAMIC_SOFTMAX_ISAS, rewrites.reciprocal_forms
    saved_env = os.environ.get("TURBINE_CPU_DYNAMIC_MATMUL")
    try:
        if name == "dynsoftmax":
            softmax.DYNAMIC_SOFTMAX_ISAS = (*saved_isas, isa)
        elif name == "iree-form":
            rewrites.reciprocal_forms = lambda op: []  # the model's form reaches IREE
            os.environ["TURBINE_CPU_DYNAMIC_MATMUL"] = "iree"
        yield
    finally:
        softmax.DYNAMIC_SOFTMAX_ISAS, rewrites.reciprocal_forms = saved_isas, saved_forms
        if saved_env is None:
            os.environ.pop("TURBINE_CPU_DYNAMIC_MATMUL", None)
        else:
            os.environ["TURBINE_CPU_DYNAMIC_MATMUL"] = saved_env


def _programs() -> list[dict]:
    """Each program: name, model, export args and dynamic shapes, input sets, variants, and
    whether eager's values are expected of every variant."""
    import torch

    sys.path.insert(0, str(HERE.parent / "tools"))
    # the programs of tests/test_cpu_softmax.py
    from kernel_testing import DynamicBatchAttention, DynamicSelfAttention

    torch.manual_seed(1)
    seq = torch.export.Dim("seq", min=2, max=64)
    progs = [
        {
            "name": f"selfattn-{spelling}",
            "model": DynamicSelfAttention(spelling),
            "args": (torch.randn(2, 24, 16),),
            "kwargs": {},
            "dynamic_shapes": {"x": {1: seq}},
            "inputs": [(torch.randn(2, n, 16),) for n in SELF_SEQS],
            "labels": [str(n) for n in SELF_SEQS],
            "variants": ["main", "dynsoftmax", "iree-form"],
        }
        for spelling in ("softmax", "reciprocal")
    ]
    batch = torch.export.Dim("batch", min=1, max=16)
    progs += [
        {
            "name": f"batchattn-{spelling}",
            "model": DynamicBatchAttention(spelling),
            "args": tuple(torch.randn(2, 2, 24, 32) for _ in range(3)),
            "kwargs": {},
            "dynamic_shapes": {n: {0: batch} for n in "qkv"},
            "inputs": [tuple(torch.randn(b, 2, 24, 32) for _ in range(3)) for b in (1, 5, 16)],
            "labels": ["1", "5", "16"],
            "variants": ["main", "iree-form"],
        }
        for spelling in ("softmax", "reciprocal")
    ]
    import zoo

    case = zoo.bert(dynamic_seq=True)
    vocab = case.module.config.vocab_size
    bert_inputs = [zoo._text_inputs(2, n, vocab, pad=4) for n in BERT_SEQS]
    bert_seq = torch.export.Dim("seq", min=2, max=512)
    progs.append(
        {
            "name": "bert-dyn-seq",
            "model": case.module,
            "args": (),
            "kwargs": case.kwargs,
            "dynamic_shapes": {"input_ids": {1: bert_seq}, "attention_mask": {1: bert_seq}},
            "inputs": bert_inputs,
            "labels": [str(n) for n in BERT_SEQS],
            "variants": ["main", "dynsoftmax"],
            "config": case.module.config.to_dict(),
        }
    )
    return progs


def _flat(out) -> list:
    """A model's outputs as a flat list of tensors (a Hugging Face output's fields in order)."""
    import torch

    if isinstance(out, torch.Tensor):
        return [out]
    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    return [t for o in out for t in _flat(o)]


def prepare(out: Path, cpu: str, isa: str) -> None:
    import numpy as np
    import torch

    import turbine_aot
    from turbine_aot._compiler.flags import default_compile_flags

    os.environ["TURBINE_COMPILE_CACHE"] = "0"
    out.mkdir(parents=True, exist_ok=True)
    flags = default_compile_flags(
        "llvm-cpu",
        overrides=[f"--iree-llvmcpu-target-cpu={cpu}", f"--turbine-cpu-matmul={isa}"],
        use_env=False,
    )
    cases = []
    for prog in _programs():
        model = prog["model"].eval()
        if prog["name"] == "bert-dyn-seq":
            torch.save(model.state_dict(), out / "bert-dyn-seq.state.pt")
        eo = turbine_aot.export(
            model, args=prog["args"], kwargs=prog["kwargs"], dynamic_shapes=prog["dynamic_shapes"]
        )
        arrays = {}
        for i, inputs in enumerate(prog["inputs"]):
            with torch.no_grad():
                expected = _flat(model(*inputs))
            for j, a in enumerate(inputs):
                arrays[f"in{i}_{j}"] = a.numpy()
            for j, e in enumerate(expected):
                arrays[f"out{i}_{j}"] = e.numpy()
        np.savez(out / f"{prog['name']}.npz", **arrays)
        for variant in prog["variants"]:
            with _variant(variant, isa):
                path = out / f"{prog['name']}.{variant}.vmfb"
                eo.compile(save_to=path, target_device="llvm-cpu", extra_args=flags)
            print(f"{path.name}: {path.stat().st_size / 2**20:.2f} MiB", flush=True)
        cases.append(
            {
                "name": prog["name"],
                "labels": prog["labels"],
                "inputs": [len(i) for i in prog["inputs"]],
                "variants": prog["variants"],
                "config": prog.get("config"),
            }
        )
    doc = {"cpu": cpu, "isa": isa, "flags": flags, "cases": cases}
    (out / "cases.json").write_text(json.dumps(doc, indent=1))


def _eager_bert(src: Path, config: dict):
    """The BERT rebuilt there from its config and saved weights, or ``None``."""
    try:
        import torch

        sys.path.insert(0, str(HERE.parent / "tools"))
        import torchvision_compat

        torchvision_compat.install()
        import transformers

        model = transformers.BertModel(transformers.BertConfig(**config)).eval()
        model.load_state_dict(torch.load(src / "bert-dyn-seq.state.pt"))
        torch.set_num_threads(1)
        return model
    except Exception as e:  # eager's time is optional there
        print(f"no eager BERT: {type(e).__name__}: {str(e)[:200]}", flush=True)
        return None


def run(src: Path, json_out: str | None, calls: int) -> int:
    import iree.runtime as rt
    import numpy as np

    doc = json.loads((src / "cases.json").read_text())
    config = rt.Config("local-sync")
    results: dict = {"cpu": doc["cpu"], "isa": doc["isa"], "cases": {}}
    for case in doc["cases"]:
        data = np.load(src / f"{case['name']}.npz")
        fns = {}
        res: dict = {"errors": {}, "ms": {}}
        for variant in case["variants"]:
            vm = rt.VmModule.mmap(config.vm_instance, str(src / f"{case['name']}.{variant}.vmfb"))
            ctx = rt.SystemContext(vm_modules=[vm], config=config)
            fn = ctx.modules.module["main"]
            errs = {}
            for i, label in enumerate(case["labels"]):
                ins = [data[f"in{i}_{j}"] for j in range(case["inputs"][i])]
                got = fn(*ins)
                got = got if isinstance(got, (list, tuple)) else [got]
                errs[label] = max(
                    float(np.abs(np.asarray(g.to_host()) - data[f"out{i}_{j}"]).max())
                    for j, g in enumerate(got)
                )
                if case["name"] == "bert-dyn-seq":
                    fns.setdefault(label, {})[variant] = lambda fn=fn, ins=ins: fn(*ins)
            res["errors"][variant] = errs
            print(
                f"{case['name']:22s} {variant:11s} max abs err "
                + " ".join(f"{k}: {v:.1e}" for k, v in errs.items()),
                flush=True,
            )
        if case["name"] == "bert-dyn-seq":
            model = _eager_bert(src, case["config"])
            for i, label in enumerate(case["labels"]):
                per = fns[label]
                if model is not None:
                    import torch

                    ids, mask = (torch.from_numpy(data[f"in{i}_{j}"]) for j in range(2))

                    def eager(model=model, ids=ids, mask=mask) -> None:
                        with torch.no_grad():
                            model(input_ids=ids, attention_mask=mask)

                    per["eager"] = eager
                t = _harness.time_interleaved(per, calls=calls, warmup=3, budget_s=20)
                res["ms"][label] = {k: v["wall"] * 1e3 for k, v in t.items()}
                print(
                    f"bert-dyn-seq seq {label:>4s} ms per call (1 thread): "
                    + " ".join(f"{k} {v:.3f}" for k, v in res["ms"][label].items()),
                    flush=True,
                )
        results["cases"][case["name"]] = res
        if json_out:
            _harness.write_json(json_out, results)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = _harness.argument_parser(__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("prepare")
    a.add_argument("dir")
    a.add_argument("--cpu", default="x86-64-v4", help="the LLVM CPU to build for, or host")
    a.add_argument("--isa", default="avx512", choices=("avx512", "avx2"))
    b = sub.add_parser("run")
    b.add_argument("dir")
    b.add_argument("--json", default=None)
    b.add_argument("--calls", type=int, default=25)
    args = p.parse_args(argv)
    if args.cmd == "prepare":
        prepare(Path(args.dir), args.cpu, args.isa)
        return 0
    return run(Path(args.dir), args.json, args.calls)


if __name__ == "__main__":
    sys.exit(main())
