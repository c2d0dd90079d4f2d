"""tools/dev/same_tokens.py, which says whether two bench_direct reports chose the same tokens (the
device sampler's launch shapes A/B): equal hashes pass, a different or missing one fails, an
unreadable report is exit 2 with one line."""
from __future__ import annotations

import json

from tools.dev import same_tokens


def write(path, rows):
    path.write_text(json.dumps({"batches": [{"batch": b, "sampling": s, "token_hash": h} for s, b, h in rows]}))
    return str(path)


def test_same_hashes_pass_and_a_different_or_missing_one_fails(tmp_path, capsys):
    a = write(tmp_path / "a.json", [("greedy", 1, "g1"), ("top-p", 1, "t1"), ("top-p", 64, "t64")])
    assert same_tokens.main([a, write(tmp_path / "b.json", [("greedy", 1, "g1"), ("top-p", 64, "t64")])]) == 0
    assert "top-p batch 64: same tokens" in capsys.readouterr().out
    assert same_tokens.main([a, write(tmp_path / "c.json", [("greedy", 1, "g1"), ("top-p", 1, "XX")])]) == 1
    assert "top-p batch 1: DIFFERENT (t1 vs XX)" in capsys.readouterr().out
    assert same_tokens.main([a, write(tmp_path / "d.json", [("penalties", 1, "p1")])]) == 1
    assert same_tokens.main([a, write(tmp_path / "e.json", [])]) == 1  # nothing compared is not a pass


def test_an_unreadable_report_is_exit_2_with_one_line(tmp_path, capsys):
    a = write(tmp_path / "a.json", [("greedy", 1, "g1")])
    assert same_tokens.main([a, str(tmp_path / "missing.json")]) == 2
    (tmp_path / "bad.json").write_text("{")
    assert same_tokens.main([a, str(tmp_path / "bad.json")]) == 2
    assert same_tokens.main([a]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 3
