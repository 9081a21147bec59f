"""mypy over the package, against a baseline that only shrinks.

    python tools/typecheck.py            # CI: fails on a new error, or a fixed one still listed
    python tools/typecheck.py --update   # after fixing errors: writes the smaller baseline

The baseline (``tools/mypy_baseline.txt``) lists the errors the package had when the check
started, as ``count<TAB>path<TAB>[code] message`` (no line numbers: an edit above an error
moves it without making it new). A run fails when an error is not in the baseline (or more
of one are) - fix it, or, where mypy is wrong, silence that line with
``# type: ignore[code]`` and a comment saying why - and when the baseline lists errors that
are gone: ``--update`` removes them. ``--update`` never adds one: it refuses while there are
new errors (where there is no baseline yet, it writes the first).
"""

from __future__ import annotations

import argparse
import collections
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
BASELINE = ROOT / "tools" / "mypy_baseline.txt"
LINE = re.compile(r"^(?P<path>[^:]+):\d+(?::\d+)?: error: (?P<msg>.*?)\s+\[(?P<code>[\w-]+)\]$")


def current() -> collections.Counter:
    """The package's mypy errors now, counted by (path, code, message)."""
    cmd = [
        sys.executable,
        "-m",
        "mypy",
        "--no-error-summary",
        "--show-error-codes",
        "--no-pretty",
        "--hide-error-context",
        "--no-color-output",
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode not in (0, 1):  # 2: mypy itself failed (a crash, bad config)
        sys.stderr.write(proc.stdout + proc.stderr)
        raise SystemExit(f"mypy did not run (exit {proc.returncode})")
    errors: collections.Counter = collections.Counter()
    for line in proc.stdout.splitlines():
        m = LINE.match(line.strip())
        if m:
            path = pathlib.PurePosixPath(pathlib.Path(m["path"]).as_posix())
            errors[(str(path), m["code"], m["msg"])] += 1
    return errors


def read_baseline() -> collections.Counter:
    errors: collections.Counter = collections.Counter()
    if BASELINE.exists():
        for line in BASELINE.read_text().splitlines():
            if line.strip():
                count, path, rest = line.split("\t", 2)
                code, msg = rest[1:].split("] ", 1)
                errors[(path, code, msg)] = int(count)
    return errors


def write_baseline(errors: collections.Counter) -> None:
    lines = [f"{n}\t{path}\t[{code}] {msg}" for (path, code, msg), n in sorted(errors.items())]
    BASELINE.write_text("\n".join(lines) + "\n")


def _show(title: str, errors: collections.Counter) -> None:
    print(title)
    for (path, code, msg), n in sorted(errors.items()):
        print(f"  {path}: [{code}] {msg}" + (f"  (x{n})" if n > 1 else ""))


def main(argv: list) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--update", action="store_true", help="write the baseline without the errors that are gone"
    )
    args = parser.parse_args(argv)
    now, base = current(), read_baseline()
    new, gone = now - base, base - now
    if new:
        _show(
            f"mypy: {sum(new.values())} error(s) not in the baseline (fix them; where "
            f"mypy is wrong, '# type: ignore[code]' with the reason):",
            new,
        )
    if args.update:
        if new and BASELINE.exists():  # (the first baseline is today's errors, all of them)
            print("the baseline is not updated while there are new errors")
            return 1
        write_baseline(now)
        print(f"baseline: {sum(now.values())} error(s) ({sum(gone.values())} fewer)")
        return 0
    if gone:
        _show(
            f"mypy: {sum(gone.values())} error(s) in the baseline are gone: run "
            f"'python tools/typecheck.py --update' to shrink it:",
            gone,
        )
    if new or gone:
        return 1
    print(f"mypy: {sum(now.values())} known error(s) in the baseline, none new")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
