"""The path a new user follows: a server holding another dataset is refused before training, a
stopped script returns its leases, the wait message names who holds the problems, and
``prioreplay model`` prepares the model folder the scripts are given."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from prioreplay.client import PriorityClient
from prioreplay.config import ClientSettings
from prioreplay.errors import FailedPrecondition, InvalidArgument
from prioreplay.integrations.torch import PrioritySampler
from prioreplay.tiny_model import make_tiny_model
from prioreplay.v1 import priority_service_pb2 as pb
from tests.conftest import REPO

PRIOREPLAY = str(Path(sys.executable).parent / "prioreplay")  # the console script of this environment
ROWS = [{"prompt": f"{i} + {i} =", "answer": str(2 * i)} for i in range(8)]


def _client(server) -> PriorityClient:
    return PriorityClient(ClientSettings(server=server.address), max_retries=0)


def test_a_server_holding_another_dataset_is_refused_before_any_lease_with_the_fix(memory_server):
    server = memory_server()
    with _client(server) as c:  # as `prioreplay load arithmetic:200` before the script
        c.register([pb.Problem(id=f"arith-0-{i}", prompt=f"{i} - 1 =", answer=str(i - 1)) for i in range(20)])
        refused = r"holds 20 problems and this dataset has 8.*--namespace.*Nothing was written"
        with pytest.raises(FailedPrecondition, match=refused):
            PrioritySampler(ROWS, server=server.address, batch_size=2, group_size=2)
        st = c.stats()
    # refused before training and before registering: nothing leased, the user's 20 problems alone
    assert (st.step, st.active_leases, st.problems) == (0, 0, 20)


def test_a_smaller_other_dataset_is_refused_once_the_rows_are_in_and_says_they_were_written(memory_server):
    server = memory_server()
    with _client(server) as c:
        c.register([pb.Problem(id=f"arith-0-{i}", prompt=f"{i} - 1 =", answer=str(i - 1)) for i in range(3)])
        with pytest.raises(FailedPrecondition, match=r"holds 11 problems and this dataset has 8.*8 rows were registered"):
            PrioritySampler(ROWS, server=server.address, batch_size=2, group_size=2)
        assert c.stats().active_leases == 0


def test_the_wait_message_says_who_holds_the_problems(memory_server):
    server = memory_server()
    other = PrioritySampler(ROWS, server=server.address, batch_size=6, group_size=1, worker_id="other-run")
    next(iter(other))  # another client holds 6 of the 8 problems
    s = PrioritySampler(ROWS, server=server.address, batch_size=4, group_size=1, wait_timeout_s=0.2, register=False)
    with pytest.raises(
        InvalidArgument, match=r"only 2 of 4 .* 8 problems in 2 leases: 2 in 1 held by this sampler .* 6 in 1 by other"
    ):
        next(iter(s))
    other.close()


SCRIPT = """
import sys, time
from prioreplay.integrations.torch import PrioritySampler
rows = [{"prompt": f"{i} + {i} =", "answer": str(2 * i)} for i in range(8)]
s = PrioritySampler(rows, server=sys.argv[1], batch_size=4, group_size=2)
next(iter(s))
print("leased", flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("how", ["SIGTERM", "exception"])
def test_a_stopped_or_crashed_script_returns_its_leases(memory_server, tmp_path, how):
    server = memory_server()
    # the crash waits for the test's word, so the lease is seen held before it is returned
    crash = "sys.stdin.readline()\nraise RuntimeError('crash')"
    script = SCRIPT if how == "SIGTERM" else SCRIPT.replace("time.sleep(120)", crash)
    (tmp_path / "loop.py").write_text(textwrap.dedent(script))
    cmd = [sys.executable, str(tmp_path / "loop.py"), server.address]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=REPO)
    try:
        assert proc.stdout.readline().strip() == b"leased"
        with _client(server) as c:
            assert c.stats().active_leases == 1
            if how == "SIGTERM":
                proc.send_signal(signal.SIGTERM)
            else:
                proc.stdin.write(b"crash now\n")
                proc.stdin.flush()
            rc = proc.wait(timeout=60)
            assert rc == (128 + signal.SIGTERM if how == "SIGTERM" else 1)
            st = c.stats()
        assert (st.active_leases, st.leased, st.lease_expiries) == (0, 0, 0)  # returned, not expired
    finally:
        proc.kill()
        proc.wait()


def test_prioreplay_model_prints_the_model_folder(tmp_path):
    model = make_tiny_model(tmp_path / "tiny", seed=0)
    out = subprocess.run([PRIOREPLAY, "model", str(model)], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(model.resolve())
    bad = subprocess.run([PRIOREPLAY, "model", "no-such-alias"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert bad.returncode != 0 and "smollm2-135m" in bad.stderr


def test_docs_comparison_loop_keeps_each_servers_stats_and_no_fixed_metrics_port():
    docs = (REPO / "docs" / "INTEGRATIONS.md").read_text()
    loop = docs[docs.index("make compare-trl") :]
    assert "--metrics-port 0" in docs and "server_stats.json" in loop
