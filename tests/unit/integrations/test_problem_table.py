"""How PrioritySampler turns a dataset's rows into problems (no server: the table is pure)."""

from __future__ import annotations

import pytest

from prioreplay.convert import problem_from_proto
from prioreplay.errors import InvalidArgument
from prioreplay.integrations.torch import NO_ANSWER, ProblemTable

ROWS = [{"prompt": f"{i} + {i} =", "answer": str(2 * i)} for i in range(11)]


def test_rows_become_stable_problems_with_text_and_fingerprinted_ids():
    a, b = ProblemTable.from_dataset(ROWS), ProblemTable.from_dataset([dict(r) for r in ROWS])
    assert a.ids == b.ids and a.fingerprint == b.fingerprint  # stable across runs for the same data
    assert a.ids[3] == f"{a.fingerprint}:3" and a.prompts[3] == "3 + 3 =" and a.answers[3] == "6"
    edited = ProblemTable.from_dataset([*ROWS[:-1], {"prompt": "edited", "answer": "x"}])
    assert edited.fingerprint != a.fingerprint and edited.ids[0] != a.ids[0]  # other data: other problems

    chat = ProblemTable.from_dataset([{"id": "q1", "prompt": [{"role": "user", "content": "hi"}], "x": 1}], ids="id")
    assert (chat.ids, chat.prompts, chat.answers) == (["q1"], ["user: hi"], [NO_ANSWER])
    with pytest.raises(InvalidArgument, match="rows 0 and 1 share the problem id 'same'"):
        ProblemTable.from_dataset([{"id": "same", "prompt": "a"}, {"id": "same", "prompt": "b"}], ids="id")
    with pytest.raises(InvalidArgument, match="not mappings: pass ids="):
        ProblemTable.from_dataset([(1, 2), (3, 4)])
    assert ProblemTable.from_dataset([(1, 2), (3, 4)], ids=["a", "b"], prompt_column=None).prompts == ["row 0", "row 1"]
    with pytest.raises(InvalidArgument, match="column 'question' is missing"):
        ProblemTable.from_dataset(ROWS, prompt_column="question")


def test_the_registered_problems_carry_each_rows_text_and_where_it_came_from():
    table = ProblemTable.from_dataset(ROWS)
    got = [problem_from_proto(p) for p in table.records("trl")]
    assert [p.id for p in got] == table.ids and [p.prompt for p in got] == table.prompts
    assert got[4].answer == "8" and got[4].verifier == "exact"
    assert got[4].metadata == {"client": "trl", "dataset": table.fingerprint, "row": "4"}
