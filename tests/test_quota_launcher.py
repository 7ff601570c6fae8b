"""benchmarks/quota_launcher.py's command line (the cgroup itself is tested on fake trees in
tests/test_cpu_cgroup.py, and used for real in the benchmarks)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import quota_launcher


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--cores", "0.9"], "expected the launcher to run after --"),
        (["--cores", "0.9", "--"], "expected the launcher to run after --"),
        (["--cores", "0", "--", "true"], "--cores: expected a positive number of CPUs, got 0.0"),
    ],
)
def test_bad_command_lines_are_refused(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        quota_launcher.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_machine_without_the_cpu_controller_is_a_clear_error_and_nothing_runs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(quota_launcher, "CGROUP_ROOT", tmp_path)  # a tree with no controller mounted
    marker = tmp_path / "ran"
    assert quota_launcher.main(["--cores", "0.5", "--", "touch", str(marker)]) == 2
    assert f"{tmp_path / 'cpu'}: no cgroup v1 cpu controller" in capsys.readouterr().err
    assert not marker.exists()
