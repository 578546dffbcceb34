"""The live display through a real pseudo-terminal 80 columns wide: bar, n/R and elapsed time on
one line, status and metrics on their own lines, nothing wider than the terminal."""

import fcntl
import os
import re
import struct
import subprocess
import sys
import termios
import time

ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07|\x1b[()][A-Z0-9]|\x1b[=>78]")


def _run_in_pty(args: list[str], columns: int = 80, timeout: float = 600) -> tuple[int, str]:
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    env = {**os.environ, "COLUMNS": str(columns), "LINES": "24", "TERM": "xterm-256color"}
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen(args, stdin=slave, stdout=slave, stderr=slave, env=env)
    os.close(slave)
    chunks, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    return proc.wait(timeout=60), b"".join(chunks).decode(errors="replace")


def test_run_display_fits_80_columns(tmp_path):
    code, raw = _run_in_pty(
        [sys.executable, "-m", "flowerbed.apps.cli", "run", "quickstart", "rounds=2",
         "clients.num=2", "--engine", "inline", "--out", str(tmp_path / "run")],
    )  # fmt: skip
    assert code == 0, raw[-3000:]
    lines = [ln for ln in re.split(r"\r\n|\r|\n", ANSI.sub("", raw)) if ln.strip()]
    too_wide = [ln for ln in lines if len(ln) > 80 and not ln.startswith("run directory: /")]
    assert not too_wide, too_wide
    bars = [ln for ln in lines if re.search(r"quickstart.*━.*\b[012]/2\s+\d:\d\d:\d\d\s*$", ln)]
    assert bars, lines  # the bar, n/R and the elapsed time share one line
    assert any(ln.startswith("  central.accuracy=") for ln in lines), lines  # metrics line
    assert any(re.match(r"  (round \d/2|building the workload)", ln) for ln in lines), lines
    assert any("failed replies: none" in ln for ln in lines), lines
