"""Pytree helpers used to flatten procedure arguments, results and global collections.

These are torch's own pytree functions (``torch.utils._pytree``), re-exported so that a tree
schema produced here (``TreeSpec``) is the one torch.export and ``treespec_dumps`` understand.
Unregistered Python objects (intrinsics, abstract types) are leaves.
"""

from __future__ import annotations

from torch.utils import _pytree as _torch_pytree

__all__ = [
    "TreeSpec",
    "tree_flatten",
    "tree_map",
    "tree_unflatten",
    "treespec_dumps",
    "treespec_loads",
]

TreeSpec = _torch_pytree.TreeSpec
tree_flatten = _torch_pytree.tree_flatten
tree_map = _torch_pytree.tree_map
tree_unflatten = _torch_pytree.tree_unflatten
treespec_dumps = _torch_pytree.treespec_dumps
treespec_loads = _torch_pytree.treespec_loads
