"""Progress of long work: tqdm's bar on a terminal, plain lines in a log file (``writers/progress.py``)."""

from __future__ import annotations

import io

from feedline.writers.progress import Lines, progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_progress_is_a_line_at_the_start_every_interval_and_at_the_end():
    now = [0.0]
    out = io.StringIO()
    with Lines(100, "converting to x.h5", "img", file=out, every_s=30, clock=lambda: now[0]) as bar:
        for _ in range(10):
            now[0] += 10  # 10 s per ten images: a line at 30, 60 and 90 s
            bar.update(10)
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert lines == [
        "converting to x.h5: 0/100 img (0%)",
        "converting to x.h5: 30/100 img (30%)",
        "converting to x.h5: 60/100 img (60%)",
        "converting to x.h5: 90/100 img (90%)",
        "converting to x.h5: 100/100 img (100%), 100 s",
    ]


def test_a_log_file_gets_lines_and_a_terminal_gets_the_bar():
    assert isinstance(progress(5, "x", "img", file=io.StringIO()), Lines)
    terminal = Terminal()
    bar = progress(5, "x", "img", file=terminal)
    bar.update(5)
    bar.close()
    assert not isinstance(bar, Lines) and "5/5" in terminal.getvalue() and "\r" in terminal.getvalue()
