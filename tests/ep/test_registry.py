"""One registry names the EP backends: every entry's maturity is a known one, agrees with the
backend class it loads, and the docs/STATUS.md "EP backends" table says exactly the same."""
from __future__ import annotations

from pathlib import Path

import pytest

from pegainfer.ep import registry
from pegainfer.ep.backend import MATURITIES

STATUS = Path(__file__).resolve().parents[2] / "docs" / "STATUS.md"


def status_table(section: str = "## EP backends") -> dict[str, str]:
    """backend name -> maturity, from the first markdown table under `section`."""
    lines = STATUS.read_text().splitlines()
    start = lines.index(section) + 1
    rows: dict[str, str] = {}
    in_table = False
    for line in lines[start:]:
        if line.startswith("## "):
            break
        if not line.startswith("|"):
            if in_table:
                break
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not in_table:  # header row, then the --- separator
            in_table = True
            assert cells[:2] == ["backend", "maturity"], cells
            continue
        if set(cells[0]) <= {"-", " "}:
            continue
        rows[cells[0].strip("`")] = cells[1]
    return rows


def test_every_backend_has_a_known_maturity() -> None:
    assert registry.REGISTRY
    for name, e in registry.REGISTRY.items():
        assert e.name == name
        assert e.maturity in MATURITIES, (name, e.maturity)


@pytest.mark.parametrize("name", sorted(registry.REGISTRY))
def test_entry_agrees_with_the_backend_class(name: str) -> None:
    e = registry.entry(name)
    cls = e.load()
    assert cls.name == e.name
    assert cls.maturity == e.maturity
    assert registry.maturity(name) == cls.maturity


def test_status_table_agrees_with_the_registry() -> None:
    assert status_table() == {n: e.maturity for n, e in registry.REGISTRY.items()}


def test_the_ep_backends_of_the_design_are_registered() -> None:
    assert {"local": "production", "host-staged": "production", "nccl": "candidate"}.items() <= \
        {n: e.maturity for n, e in registry.REGISTRY.items()}.items()


def test_unknown_backend_names_the_known_ones() -> None:
    with pytest.raises(registry.UnknownBackend, match=r"known: local, host-staged, nccl\)"):
        registry.entry("mpi")


def test_test_only_transports_say_so_and_users_cannot_choose_them() -> None:
    """A transport that exists for CPU tests is named as such (so no artifact can pass it off as
    the backend it imitates), is registered `test-only`, and user entry points refuse it."""
    test_only = {n for n, e in registry.REGISTRY.items() if e.maturity == registry.TEST_ONLY}
    assert test_only == {"nccl-over-gloo-test"}
    for name in test_only:
        assert name.endswith("-test")
        assert registry.entry(name).load().maturity == "test-only"
        with pytest.raises(registry.TestOnlyBackend, match="is test-only"):
            registry.user_entry(name)
    assert registry.user_backends() == ["local", "host-staged", "nccl"]
    assert registry.user_entry("nccl").maturity == "candidate"
