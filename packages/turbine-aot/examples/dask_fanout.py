"""Fan the example's generators out over a Dask cluster instead of the local worker pool.

``turbine_generate`` hands each worker a ``RemoteGenerator``: a picklable, argument-free thunk
that runs the generator and writes its ``.mlir`` outputs. Any distributed executor that runs
picklable callables can run the same thunks; here Dask does (``pip install distributed``).

    python packages/turbine-aot/examples/dask_fanout.py --output-dir out            # LocalCluster
    python packages/turbine-aot/examples/dask_fanout.py --output-dir /shared/out \\
        --scheduler tcp://scheduler-host:8786                                       # a real one

With a real cluster, ``--output-dir`` must be on a file system every worker sees (or see
docs/build-actions.md for returning the MLIR bytes instead); the workers need the same Python
environment (torch, turbine) and get this example's model code through ``client.upload_file``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--output-dir", type=Path, required=True)
    p.add_argument("--scheduler", help="address of a running Dask scheduler (default: local)")
    p.add_argument("--workers", type=int, default=2, help="LocalCluster worker processes")
    args = p.parse_args(argv)

    from dask.distributed import Client, LocalCluster

    sys.path.insert(0, str(HERE))
    import example_builder

    from turbine_aot.build_actions import ExportOutputMarshaller, RemoteGenerator

    cluster = None
    if args.scheduler:
        client = Client(args.scheduler)
    else:
        cluster = LocalCluster(
            n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address=None
        )
        client = Client(cluster)
    try:
        # Ship the model code to every worker (present and future) so the generator, pickled
        # by reference as example_builder.export_two_branch, imports there.
        client.upload_file(str(HERE / "example_builder.py"))
        out = args.output_dir.resolve()
        out.mkdir(parents=True, exist_ok=True)
        thunks = {
            stem: RemoteGenerator(
                example_builder.export_two_branch,
                (batch_size,),
                {},
                [(ExportOutputMarshaller(), out / f"{stem}.mlir")],
            )
            for stem, batch_size in example_builder.VARIANTS.items()
        }
        start = time.perf_counter()
        futures = {
            stem: client.submit(thunk, pure=False, key=stem) for stem, thunk in thunks.items()
        }
        for stem, future in futures.items():
            (path,) = future.result()
            print(f"{stem}: {path}")
        print(
            f"{len(futures)} variants exported on the cluster in {time.perf_counter() - start:.1f} s"
        )
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
