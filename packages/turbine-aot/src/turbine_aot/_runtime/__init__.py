"""The runtime: loading compiled modules (``.vmfb``) with their parameter archives on one or
more IREE devices and calling them with torch tensors. Only ``iree.runtime`` (and torch, to
hold the tensors) is needed here: nothing of it compiles, and it never imports the exporter.

Modules, lowest first:

- :mod:`.tensors`: torch tensors <-> IREE HAL buffer views, for every dtype the ABI carries.
- :mod:`.devices`: device URIs, devices created, lost devices replaced.
- :mod:`.parameters`: parameter archives per scope as an ``io_parameters`` module.
- :mod:`.loaded_module`: :class:`~.loaded_module.LoadedModule` and its
  :class:`~.loaded_module.LoadedFunction`\\ s.
- :mod:`.prepared_calls`: :class:`~.prepared_calls.PreparedCall`, repeated calls with the
  arguments kept in device buffers (an LLM's decode loop).
- :mod:`.module_check`: checked loading of untrusted modules in a short-lived child process.
- :mod:`.loading`: ``load_module``.
- :mod:`.numerics`: comparing a compiled function with eager PyTorch.
"""
