"""Deployable bundles: one directory (or ``.tar``/``.tar.gz``) with a ``.vmfb``, its parameter
archives and a manifest.

Layout::

    my_bundle/
      manifest.json            what is inside, how to run it, which versions built it
      module.vmfb              the compiled module
      params/<scope>[-N].<ext> the parameter archives, one or more per scope
      iree-run-module.flags    a flag file: iree-run-module --flagfile=iree-run-module.flags ...

The manifest records the entry points with argument/result shapes (``null`` for dynamic dims)
and dtypes, the parameter scopes, the target devices, the compile flags and the versions of IREE,
torch and turbine used; :func:`~.load.load_bundle` refuses a bundle built for another device
kind or another IREE release with a message saying what to rebuild or install.

Modules, lowest first:

- :mod:`.manifest`: format constants, versions and device records, the manifest's shape check.
- :mod:`.bundle`: :class:`~.bundle.Bundle` (a bundle on disk, its recorded files and hashes)
  and :class:`~.bundle.BundleError`.
- :mod:`.archive`: packing and (safely) unpacking ``.tar`` / ``.tar.gz`` bundles.
- :mod:`.write`: ``save_bundle``.
- :mod:`.read`: ``read_bundle`` and the compatibility checks.
- :mod:`.load`: ``load_bundle``.
"""
