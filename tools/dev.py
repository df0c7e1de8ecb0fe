#!/usr/bin/env python3
"""Bootstrap for turbine development: one environment, two commands.

    python3 tools/dev.py demo   # set up, then export -> compile -> run -> compare with eager
    python3 tools/dev.py test   # set up, then run every nox session tagged "ci"

Other forms:
    python3 tools/dev.py setup            # only create/refresh .venv
    python3 tools/dev.py nox -- ARGS...   # run nox from the environment with ARGS

Standard library only: it runs on a fresh Debian machine with Python >= 3.10 and pip.
It creates ``.venv`` at the repository root and installs the five packages editable,
pinned by ``tools/constraints.txt`` (torch 2.13.0 CPU, IREE 3.13.0), plus the dev tools
from ``tools/requirements-dev.txt``. The install is skipped when nothing it depends on
changed (a hash of the inputs is kept in ``.venv/turbine-env.stamp``). When run as root on
Debian, it installs Mesa's lavapipe Vulkan driver so the ``vulkan-spirv`` backend can be tested.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
PACKAGES = ("params", "ir", "trace", "fx", "aot")
CONSTRAINTS = ROOT / "tools" / "constraints.txt"
DEV_REQUIREMENTS = ROOT / "tools" / "requirements-dev.txt"
STAMP = VENV / "turbine-env.stamp"
APT_PACKAGES = ("mesa-vulkan-drivers", "libvulkan1")


def log(msg: str) -> None:
    print(f"[dev] {msg}", flush=True)


def venv_python() -> Path:
    return VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _inputs_digest() -> str:
    h = hashlib.sha256()
    files = [CONSTRAINTS, DEV_REQUIREMENTS, Path(__file__)]
    files += [ROOT / "packages" / f"turbine-{p}" / "pyproject.toml" for p in PACKAGES]
    for f in files:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    h.update(sys.version.encode())
    return h.hexdigest()


def _have_lavapipe() -> bool:
    icd_dirs = [Path("/usr/share/vulkan/icd.d"), Path("/etc/vulkan/icd.d")]
    has_icd = any(d.is_dir() and any(d.glob("lvp_icd*.json")) for d in icd_dirs)
    try:
        ldconfig = subprocess.run(
            ["ldconfig", "-p"], capture_output=True, text=True, check=False
        ).stdout
    except OSError:
        ldconfig = ""
    return has_icd and "libvulkan.so.1" in ldconfig


def ensure_system_packages() -> None:
    """Installs Mesa lavapipe (software Vulkan) when possible; never fatal."""
    if _have_lavapipe():
        return
    if os.environ.get("TURBINE_SKIP_APT"):
        log("TURBINE_SKIP_APT set: not installing lavapipe; vulkan tests will skip")
        return
    if not shutil.which("apt-get") or os.geteuid() != 0:
        log(
            "lavapipe (Vulkan on CPU) is not installed and this is not a root Debian "
            "machine: the vulkan-spirv backend will be skipped. To enable it: "
            "apt-get install " + " ".join(APT_PACKAGES)
        )
        return
    log("installing Mesa lavapipe for the vulkan-spirv backend: " + " ".join(APT_PACKAGES))
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    ok = (
        subprocess.run(["apt-get", "update", "-qq"], env=env, check=False).returncode == 0
        and subprocess.run(
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *APT_PACKAGES],
            env=env,
            check=False,
        ).returncode
        == 0
    )
    if not ok:
        log("apt-get failed: the vulkan-spirv backend will be skipped")


def ensure_env(*, quiet: bool = False) -> Path:
    """Creates or refreshes .venv; returns its python."""
    py = venv_python()
    digest = _inputs_digest()
    if py.exists() and STAMP.exists() and STAMP.read_text().strip() == digest:
        if not quiet:
            log(f"environment up to date: {VENV}")
        return py
    if not py.exists():
        log(f"creating {VENV}")
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    pip = [str(py), "-m", "pip", "install", "--disable-pip-version-check"]
    if quiet:
        pip.append("-q")
    log("installing turbine packages (editable) and dev tools, pinned by tools/constraints.txt")
    cmd = [*pip, "-c", str(CONSTRAINTS), "-r", str(DEV_REQUIREMENTS)]
    for p in PACKAGES:
        cmd += ["-e", str(ROOT / "packages" / f"turbine-{p}")]
    subprocess.run(cmd, check=True)
    STAMP.write_text(digest + "\n")
    return py


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if rest[:1] == ["--"]:
        rest = rest[1:]
    if cmd not in ("setup", "demo", "test", "nox"):
        print(f"unknown command {cmd!r}; expected one of: setup, demo, test, nox", file=sys.stderr)
        return 2
    ensure_system_packages()
    py = ensure_env()
    env = dict(os.environ)
    env["PATH"] = str(py.parent) + os.pathsep + env.get("PATH", "")
    if cmd == "setup":
        return 0
    if cmd == "demo":
        return subprocess.run([str(py), "-m", "turbine_aot", "demo", *rest], env=env).returncode
    if cmd == "test":
        nox_args = ["-t", "ci", *rest]
    else:
        nox_args = rest
    return subprocess.run(
        [str(py), "-m", "nox", "-f", str(ROOT / "noxfile.py"), *nox_args], cwd=ROOT, env=env
    ).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
