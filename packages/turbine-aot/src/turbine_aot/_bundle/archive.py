"""Bundle archives (``.tar`` / ``.tar.gz``): packing a bundle directory into one, atomically,
and unpacking only archives all of whose members stay inside the bundle."""

from __future__ import annotations

import os
import shutil
import tarfile
import tempfile
from pathlib import Path

from turbine_params import atomic_output_file, make_owned_temp

from .bundle import BundleError

__all__ = ["extract_archive", "publish_archive", "unpack_dir", "unsafe_path"]


def publish_archive(work: Path, dest: Path) -> None:
    """The bundle form ``.tar`` / ``.tar.gz``: ``work`` packed into ``dest``, then removed."""
    # turbine_params.atomic_output_file: fsynced, renamed, never a half-written archive.
    gz = dest.name.endswith(("gz", "tgz"))
    with atomic_output_file(dest) as tmp_tar, tarfile.open(tmp_tar, "w:gz" if gz else "w") as tf:
        for p in sorted(work.rglob("*")):
            tf.add(p, arcname=str(p.relative_to(work)), recursive=False)
    shutil.rmtree(work)


def unpack_dir() -> Path:
    """A new private (0700) directory in the system temp directory to unpack an archive into,
    named for its owner: one that a process killed while holding a bundle left behind is
    removed by the next unpack (``turbine_params.make_owned_temp``), so copies of weights do
    not pile up in /tmp."""
    tmp = make_owned_temp(Path(tempfile.gettempdir()) / "turbine-bundle", directory=True)
    os.chmod(tmp, 0o700)
    return tmp


def unsafe_path(name: str) -> str | None:
    """Why an archive member name or manifest path would leave the bundle, or None if it stays."""
    if not name:
        return "an empty path"
    if name.startswith(("/", "\\")) or os.path.isabs(name) or name[1:2] == ":":
        return "an absolute path"
    if ".." in name.replace("\\", "/").split("/"):
        return "a '..' component"
    if "\0" in name:
        return "a NUL byte"
    return None


def _check_members(members: list[tarfile.TarInfo], src: Path) -> None:
    """Refuses an archive any of whose members would be written outside the extraction
    directory or is not a plain file, directory or link that stays inside it.

    Done on every Python version before anything is extracted (``filter="data"`` exists only
    from Python 3.10.12 / 3.11.4, and then is used as well)."""
    names = {m.name.rstrip("/") for m in members}
    links = {m.name.rstrip("/") for m in members if m.issym() or m.islnk()}
    for m in members:
        name = m.name.rstrip("/")
        why = unsafe_path(m.name)
        if why is None and not (m.isfile() or m.isdir() or m.issym() or m.islnk()):
            why = "not a regular file, directory or link (a device, FIFO or other special file)"
        if why is None and m.issym():
            target = m.linkname
            joined = os.path.normpath(os.path.join(os.path.dirname(name), target))
            if (
                unsafe_path(target) == "an absolute path"
                or joined == ".."
                or joined.startswith("../")
            ):
                why = f"a symbolic link to {target!r}, outside the bundle"
        if (
            why is None
            and m.islnk()
            and (unsafe_path(m.linkname) is not None or m.linkname.rstrip("/") not in names)
        ):
            why = f"a hard link to {m.linkname!r}, which is not a file of the archive"
        if why is None:
            parts = name.split("/")
            through = next(
                ("/".join(parts[:i]) for i in range(1, len(parts)) if "/".join(parts[:i]) in links),
                None,
            )
            if through is not None:
                why = f"a path through the link {through!r}"
        if why is not None:
            raise BundleError(
                f"bundle archive {str(src)!r} has an unsafe member {m.name!r} ({why}); refusing "
                "to unpack it: a bundle archive holds only files inside the bundle. Rebuild it "
                "with `turbine-aot bundle`"
            )


def extract_archive(tf: tarfile.TarFile, src: Path, out: Path) -> None:
    try:
        members = tf.getmembers()
    except (tarfile.TarError, EOFError, OSError) as e:
        raise BundleError(f"bundle archive {str(src)!r} is damaged or truncated: {e}") from e
    _check_members(members, src)
    try:
        if hasattr(tarfile, "data_filter"):
            tf.extractall(out, members=members, filter="data")
        else:  # pragma: no cover - Python < 3.10.12: the checks above are the only guard
            tf.extractall(out, members=members)
    except (tarfile.TarError, EOFError) as e:  # incl. the data filter's FilterError
        raise BundleError(f"bundle archive {str(src)!r} cannot be unpacked: {e}") from e
