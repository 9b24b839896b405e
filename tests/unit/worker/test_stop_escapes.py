"""The ``--stop`` escapes, written once (``prioreplay.rollout_worker.config``) for the worker's flag
and for the demo and ``compare``, which pass their stop strings to workers as flags."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from prioreplay.rollout_worker.config import WorkerConfig, escape_stop, unescape_stop


@given(st.text(alphabet=st.sampled_from("ab\\\nt\t#"), max_size=20))
def test_a_stop_string_survives_escaping_for_a_flag_and_decoding_by_the_worker(s):
    assert unescape_stop(escape_stop(s)) == s
    assert "\n" not in escape_stop(s) and "\t" not in escape_stop(s)  # one flag value, one line


def test_the_three_escapes_are_decoded_and_any_other_backslash_is_kept():
    assert unescape_stop(r"\n\n") == "\n\n"
    assert unescape_stop(r"a\tb\\c") == "a\tb\\c"
    assert unescape_stop(r"\x\q") == r"\x\q" and unescape_stop("end\\") == "end\\"


def test_the_worker_flag_decodes_the_escapes():
    assert WorkerConfig(stop=[r"\n\n", "####"], metrics_port=0).stop == ["\n\n", "####"]
