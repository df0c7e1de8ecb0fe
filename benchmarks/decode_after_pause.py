"""Decode steps after a pause: how fast an LLM's decode steps run when its weights have left the
cache (a server idle between requests), against steady steps, turbine and llama.cpp.

For the 110M Llama of ``llm_bench.MODELS`` (random init) in one process, one thread
(``local-sync``) or ``--threads N`` (``local-task``): turbine's module for ``--weights``
(``llm.quantized_copy``, as ``llama_cpp_side_by_side.py`` exports it; ``--baseline-env
KEY=VALUE``: the same export compiled under that setting too, e.g.
``TURBINE_CPU_QUANT_AMX=off``) and, where ``llama-cpp-python`` and ``gguf`` are installed,
llama.cpp on the matching GGUF. Each candidate runs ``--steps`` decode steps at one position
(turbine: its prepared decode step; llama.cpp: a generate, its per-token times) right after:

* ``steady``: the previous steps (nothing in between);
* ``sleep``: ``--pause-s`` seconds asleep;
* ``busy``: as long in a Python loop that touches no memory of its own;
* ``copy``: four copies of 64 MiB (our own traffic through the caches);
* ``prefill``: a prefill of the prompt (turbine only).

The figure per step index is the median over ``--repeats`` repetitions (the first dropped).
On a 2-core Xeon VM (shared 480 MiB L3) the AMX int4 kernel's steps took 7 ms after a pause and
3.7 ms steady, coming back over 15-20 steps; llama.cpp's Q4_0 ran 7.9 ms either way
(docs/quantization.md, "Decode against the bandwidth limit as issue 26 defines it").

Usage::

    python benchmarks/decode_after_pause.py                       # int4, 1 thread
    python benchmarks/decode_after_pause.py --weights int8 --threads 2 --json out.json
    python benchmarks/decode_after_pause.py --baseline-env TURBINE_CPU_QUANT_AMX=off
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
for _p in (HERE, HERE.parent / "tools"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import _harness  # noqa: E402

PAUSES = ("steady", "sleep", "busy", "copy", "prefill")


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _turbine(model: Any, threads: int, env: str | None) -> Any:
    from turbine_aot import llm

    eo = llm.export_causal_lm(model, max_seq_len=48)
    device = "local-sync" if threads == 1 else "local-task"
    if env is None:
        return llm.load(eo, device=device)
    key, _, value = env.partition("=")
    with _harness.environment(key, value):
        return llm.load(eo, device=device)


def _turbine_steps(lm: Any, prompt: Any, steps: int) -> Callable[[], list[float]]:
    import numpy as np

    lm.generate(prompt, 4)  # makes the prepared step
    step = lm._prepared_step()
    if step is None:
        raise SystemExit("this module has no prepared decode step (docs/llms.md)")
    tok, pos = np.array([5]), np.array([20])

    def run() -> list[float]:
        out = []
        for _ in range(steps):
            t0 = time.perf_counter()
            step(tok, pos, 20)
            out.append((time.perf_counter() - t0) * 1e3)
        return out

    return run


def measure(args: Any) -> dict:
    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    if args.threads > 1:
        _harness.set_runtime_flags([f"--task_topology_max_group_count={args.threads}"])
    import llm_bench

    from turbine_aot import llm

    fp32 = llm_bench._build("llama-110m")
    model = fp32
    if args.weights != "fp32":
        gs = 128 if args.weights == "int4" else None
        model = llm.quantized_copy(fp32, args.weights, group_size=gs)
    prompt = torch.randint(3, 32000, (1, 8), generator=torch.Generator().manual_seed(1))
    runs: dict[str, Callable[[], list[float]]] = {}
    prefills: dict[str, Callable[[], Any]] = {}
    lm = _turbine(model, args.threads, None)
    runs["turbine"] = _turbine_steps(lm, prompt, args.steps)
    prefills["turbine"] = lambda: lm.prefill(prompt, torch.tensor([8]))
    if args.baseline_env:
        base = _turbine(model, args.threads, args.baseline_env)
        runs[f"turbine {args.baseline_env}"] = _turbine_steps(base, prompt, args.steps)
        prefills[f"turbine {args.baseline_env}"] = lambda: base.prefill(prompt, torch.tensor([8]))
    import llama_cpp_side_by_side as side

    if not args.no_llama_cpp and side.missing_requirements() is None:
        gt = side.WEIGHTS[args.weights]
        path = Path(tempfile.mkdtemp(prefix="turbine-pause-")) / f"{gt}.gguf"
        side.write_gguf(fp32, path, gt)
        lc = side.LlamaCpp(str(path), args.threads, n_ctx=48)
        ids = prompt[0].tolist()

        def cpp() -> list[float]:
            lc.generate(ids, args.steps + 1)
            return list(lc.decode_ms)

        runs[f"llama.cpp {gt}"] = cpp
    big = np.ones(64 * 2**20 // 4, np.float32)
    dst = np.empty_like(big)

    def copies(who: str) -> None:
        for _ in range(4):
            np.copyto(dst, big)

    pauses: dict[str, Callable[[str], None]] = {
        "steady": lambda who: None,
        "sleep": lambda who: time.sleep(args.pause_s),
        "busy": lambda who: _busy(args.pause_s),
        "copy": copies,
        "prefill": lambda who: prefills[who](),
    }
    times: dict[str, dict[str, list[list[float]]]] = {w: {p: [] for p in PAUSES} for w in runs}
    for _ in range(args.repeats + 1):
        for who, run in runs.items():
            run()  # each candidate's weights warm before its pauses
            for pause in PAUSES:
                if pause == "prefill" and who not in prefills:
                    continue
                pauses[pause](who)
                times[who][pause].append(run())
    res: dict = {
        "model": "llama-110m",
        "weights": args.weights,
        "threads": args.threads,
        "pause_s": args.pause_s,
        "steps": args.steps,
        "candidates": {},
    }
    for who, by_pause in times.items():
        res["candidates"][who] = {
            p: [statistics.median(col) for col in zip(*v[1:], strict=True)]
            for p, v in by_pause.items()
            if len(v) > 1
        }
    res["load_avg"] = os.getloadavg()
    return res


def table(res: dict) -> str:
    lines = [
        "| candidate | before the steps | step 1 | step 4 | step 12 | steps 13+ (median) |",
        "|---|---|---|---|---|---|",
    ]
    for who, by_pause in res["candidates"].items():
        for pause, ms in by_pause.items():
            rest = statistics.median(ms[12:]) if len(ms) > 12 else float("nan")
            picks = [f"{ms[i]:.2f}" if len(ms) > i else "-" for i in (0, 3, 11)]
            lines.append(f"| {who} | {pause} | {' | '.join(picks)} | {rest:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = _harness.argument_parser(__doc__)
    p.add_argument("--weights", default="int4", choices=("fp32", "int8", "int4"))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--pause-s", type=float, default=0.2)
    p.add_argument("--baseline-env", default=None, metavar="KEY=VALUE")
    p.add_argument("--no-llama-cpp", action="store_true")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.baseline_env is not None and "=" not in args.baseline_env:
        p.error(f"--baseline-env {args.baseline_env!r}: expected KEY=VALUE")
    res = measure(args)
    print(
        f"llama-110m {args.weights}, {args.threads} thread(s), ms per decode step after each "
        f"pause ({args.pause_s} s), medians of {args.repeats}; load {res['load_avg']}"
    )
    print(table(res))
    if args.json:
        _harness.write_json(args.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
