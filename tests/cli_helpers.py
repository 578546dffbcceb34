"""The CLI in this process (typer's runner) and the check every bad-input test makes: one line
on stderr naming the problem, exit status 2, no run directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from flowerbed.apps.cli import app

runner = CliRunner()


def run_cli(tmp_path: Path, *args: str, engine: str = "inline") -> tuple[Any, Path]:
    """``flowerbed run ARGS --engine ENGINE --out tmp_path/out``; (result, out)."""
    out = tmp_path / "out"
    result = runner.invoke(app, ["run", *args, "--engine", engine, "--out", str(out)])
    return result, out


def one_line_exit_2(result: Any, out: Path, needle: str) -> None:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert needle in lines[0], lines[0]
    assert not out.exists()
