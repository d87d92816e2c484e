"""`stockade.testing` as a consumer's tests use it: the `stockade_mock` fixture over a
real `stockade serve --mock` (STOCKADE_BIN). Run by tests/e2e/clients.rs."""

import time

import pytest

from stockade import Exit, Output, StockadeError
from stockade.testing import MockServer

DEADLINE_S = 20.0


def dispatch(client, key, argv, *, poll_s=0.02, on_poll=None):
    """A dispatcher's loop: start a detached job, poll its status until it is no longer
    running (or the deadline), and answer its final state."""
    job = client.start(key, argv)
    end = time.monotonic() + DEADLINE_S
    polls = 0
    while True:
        state = client.status(key, job)
        polls += 1
        if state.state != "running":
            return state
        if on_poll is not None:
            on_poll(polls)
        assert time.monotonic() < end, "the job never left running"
        time.sleep(poll_s)


def test_a_scripted_command_answers_its_outcome_and_the_trace_shows_the_fence(stockade_mock):
    stockade_mock.script([{"argv": ["sh", "-c", "exit 3"], "exit_code": 3, "stderr": "three\n"}])
    out = stockade_mock.exec("ci", ["sh", "-c", "exit 3"], grant=[{"host": "pypi.org"}])
    assert (out.exit_code, out.stderr) == (3, b"three\n")
    assert stockade_mock.ops("ci") == ["ensure", "apply-grant", "run", "kill-all", "revoke-grant"]
    # Unscripted: the built-in vocabulary.
    assert stockade_mock.exec("ci", ["echo", "hi"]).stdout == b"hi\n"


def test_a_dispatcher_poll_loop_sees_gone_after_an_injected_fault(stockade_mock):
    # The container becomes unreachable at the dispatcher's third poll.
    def arm(polls):
        if polls == 2:
            stockade_mock.fault("process-status", "unreachable", key="job-1")

    state = dispatch(stockade_mock, "job-1", ["python3", "worker.py"], on_poll=arm)
    assert str(state) == "gone(container-unreachable)"
    assert stockade_mock.ops("job-1") == ["ensure", "start-process"] + ["process-status"] * 3


def test_a_scripted_detached_life_ends_with_its_code(stockade_mock):
    stockade_mock.script([{"argv": ["worker", "*"], "match": "glob",
                           "detached": {"runs_ms": 200, "exit_code": 4}}])
    assert str(dispatch(stockade_mock, "job-2", ["worker", "--once"])) == "exited(4)"


def test_output_chunks_stream_in_order(stockade_mock):
    stockade_mock.script([{"argv": ["make"], "match": "prefix", "exit_code": 2, "chunks": [
        {"at_ms": 0, "stdout": "cc a.c\n"}, {"at_ms": 100, "stderr": "a.c:1: error\n"}]}])
    events = list(stockade_mock.exec_stream("ci", ["make", "all"]))
    assert [e for e in events if isinstance(e, Output)] == [
        Output("stdout", b"cc a.c\n"), Output("stderr", b"a.c:1: error\n")]
    assert isinstance(events[-1], Exit) and events[-1].exit_code == 2


def test_faults_for_the_next_calls_then_the_api_heals(stockade_mock):
    stockade_mock.fault("ensure", "over-capacity", times=2)
    for _ in range(2):
        with pytest.raises(StockadeError) as e:
            stockade_mock.exec("ci", ["true"])
        assert (e.value.status, e.value.code) == (429, "over-capacity")
    assert stockade_mock.exec("ci", ["true"]).exit_code == 0


def test_bad_input_to_the_mock_routes_is_a_typed_400_and_changes_nothing(stockade_mock):
    stockade_mock.script([{"argv": ["x"], "exit_code": 5}])
    with pytest.raises(StockadeError) as e:
        stockade_mock.script([{"argv": ["x"], "exit": 6}])
    assert (e.value.status, e.value.code) == (400, "invalid-input")
    with pytest.raises(StockadeError) as e:
        stockade_mock.fault("fork", "failed")
    assert (e.value.status, e.value.code) == (400, "invalid-input")
    assert stockade_mock.exec("ci", ["x"]).exit_code == 5


def test_an_artifact_a_test_puts_is_read_back(stockade_mock):
    stockade_mock.control("put-artifact", key="ci", name="report.txt", bytes="hello")
    assert stockade_mock.read_artifact("ci", "report.txt") == b"hello"


def test_a_script_at_start_without_the_fixture():
    with MockServer(script={"default": {"exit_code": 9}}) as sb:
        assert sb.exec("ci", ["anything"]).exit_code == 9
