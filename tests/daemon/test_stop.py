"""Stop strings in growing text: found across deltas, the earliest one wins, nothing that could
still become a stop string is released early, and an unmatched tail is released at the end."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pegainfer.daemon.stop import StopText


def feed(stops: list[str], deltas: list[str], include: bool = False) -> tuple[list[str], bool, str]:
    s = StopText(stops, include)
    out = [s.push(d) for d in deltas]
    return out, s.stopped, "" if s.stopped else s.flush()


def test_a_stop_string_split_over_deltas_is_found_and_never_released():
    out, stopped, tail = feed(["END"], ["abc E", "N", "D more"])
    assert out == ["abc ", "", ""] and stopped and tail == ""


def test_the_earliest_stop_string_wins():
    out, stopped, _ = feed(["xyz", "b"], ["axyzb"])
    assert out == ["a"] and stopped


def test_a_prefix_that_does_not_complete_is_released_later():
    out, stopped, tail = feed(["abc"], ["xab", "d", "ab"])
    assert out == ["x", "abd", ""] and not stopped and tail == "ab"


@given(st.lists(st.text(alphabet="ab\u00e9", max_size=4), max_size=8), st.text(alphabet="ab\u00e9", min_size=1,
                                                                                max_size=3))
def test_released_text_is_the_text_before_the_first_stop(deltas, stop):
    out, stopped, tail = feed([stop], deltas)
    text = "".join(deltas)
    cut = text.find(stop)
    assert "".join(out) + tail == (text if cut < 0 else text[:cut])
    assert stopped == (cut >= 0)
    released = ""
    for piece in out:  # no prefix released ever reaches into the stop string
        released += piece
        assert cut < 0 or len(released) <= cut


def test_include_releases_the_stop_string_and_nothing_after_it():
    """vLLM's include_stop_str_in_output: the text ends with the stop string, even one split over
    deltas; what follows it in the same delta is dropped; of two starting together, the shorter."""
    out, stopped, tail = feed(["END"], ["abc E", "N", "D more"], include=True)
    assert out == ["abc ", "", "END"] and stopped and tail == ""
    assert feed(["xyz", "b"], ["axyzb"], include=True)[0] == ["axyz"]
    assert feed(["ab", "abc"], ["xabcd"], include=True)[0] == ["xab"]


@given(st.lists(st.text(alphabet="ab\u00e9", max_size=4), max_size=8), st.text(alphabet="ab\u00e9", min_size=1,
                                                                                max_size=3))
def test_with_include_the_text_ends_with_the_first_stop(deltas, stop):
    out, stopped, tail = feed([stop], deltas, include=True)
    text = "".join(deltas)
    cut = text.find(stop)
    assert "".join(out) + tail == (text if cut < 0 else text[:cut + len(stop)])
