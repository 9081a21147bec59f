"""tools/typecheck.py: mypy against a baseline that only shrinks. The comparison is checked
here on made-up error lists (mypy itself runs in CI: .ci/run)."""

import collections
import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture
def tool(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("typecheck", ROOT / "tools" / "typecheck.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "BASELINE", tmp_path / "baseline.txt")
    return mod


def errors(*items):
    return collections.Counter(items)


A = ("actorflow/x.py", "arg-type", 'Argument 1 has incompatible type "int"')
B = ("actorflow/y.py", "attr-defined", '"Foo" has no attribute "bar"')


def test_a_new_error_fails_and_the_baseline_is_not_grown(tool, monkeypatch, capsys):
    tool.write_baseline(errors(A))
    monkeypatch.setattr(tool, "current", lambda: errors(A, B))
    assert tool.main([]) == 1
    assert "not in the baseline" in capsys.readouterr().out
    assert tool.main(["--update"]) == 1  # refused: B is new
    assert tool.read_baseline() == errors(A)


def test_one_more_of_a_known_error_is_new(tool, monkeypatch):
    tool.write_baseline(errors(A))
    monkeypatch.setattr(tool, "current", lambda: errors(A, A))
    assert tool.main([]) == 1


def test_a_fixed_error_fails_until_the_baseline_shrinks(tool, monkeypatch, capsys):
    tool.write_baseline(errors(A, B))
    monkeypatch.setattr(tool, "current", lambda: errors(A))
    assert tool.main([]) == 1
    assert "--update" in capsys.readouterr().out
    assert tool.main(["--update"]) == 0
    assert tool.read_baseline() == errors(A) and tool.main([]) == 0


def test_the_baseline_round_trips_messages_with_tabs_and_brackets(tool):
    odd = ("actorflow/z.py", "index", 'Value of type "list[int] | None" is not indexable')
    tool.write_baseline(errors(odd, odd, A))
    assert tool.read_baseline() == errors(odd, odd, A)


def test_mypys_lines_are_read_without_their_line_numbers(tool):
    m = tool.LINE.match(
        'actorflow/x.py:12: error: Argument 1 has incompatible type "int"  [arg-type]'
    )
    assert (m["path"], m["code"], m["msg"]) == A
