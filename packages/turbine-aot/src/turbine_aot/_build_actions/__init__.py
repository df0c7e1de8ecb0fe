"""Build actions: ``turbine_generate``, torch export as an action of an ``iree.build`` graph.

Modules, lowest first:

- :mod:`.errors`: the build actions' errors.
- :mod:`.pool`: a small, crash-tolerant pool of worker processes.
- :mod:`.options`: the command-line options and environment variables.
- :mod:`.returns`: a generator's declared returns, as files of the build.
- :mod:`.remote`: what runs in a worker (the ``RemoteGenerator`` thunk, the pickler).
- :mod:`.dask_executor`: the optional Dask backend.
- :mod:`.action`: ``TurbineBuilderAction``, its fingerprints, ``turbine_generate``.
"""
