"""Workflows (issue 34) through the real broker core, in-process (emq_django.testing):
signatures, chain, group, chord, nesting, failures, on_error, cancel, refusals."""

from __future__ import annotations

import json

import pytest

import emq_django as emq
from emq_django.client import get_client
from emq_django.protocol.workflow import (
    MAX_WORKFLOW_DEPTH,
    WORKFLOW_QUEUE,
    WorkflowError,
)

runs: list[str] = []


@emq.task
def add(x: int, y: int) -> int:
    runs.append(f"add({x}, {y})")
    return x + y


@emq.task
def double(x: int) -> int:
    runs.append(f"double({x})")
    return 2 * x


@emq.task
def total(values: list[int]) -> int:
    runs.append("total")
    return sum(values)


@emq.task
def outcomes(values: list[object]) -> list[object]:
    runs.append("outcomes")
    return values


@emq.task
def boom(x: int) -> int:
    runs.append(f"boom({x})")
    raise ValueError(f"boom at {x}")


@emq.task
def note(values: list[object], tag: str) -> str:
    runs.append(f"note {tag}")
    return tag


@emq.task
def counting(x: int) -> int:
    for i in range(2):
        emq.partial(f"{i} of {x}")
    return x + 1


@emq.task(guarantee=True)
def kept(x: int) -> int:
    return x


def test_a_workflow_with_a_guaranteed_step_is_sent_as_guaranteed():
    from emq_django.protocol.workflow import check_graph, guaranteed

    assert guaranteed(check_graph(emq.chain(add.s(1, 2), kept.s()).graph()["root"]))
    assert not guaranteed(
        check_graph(emq.chain(add.s(1, 2), kept.s().set(guarantee=False)).graph()["root"])
    )


@pytest.fixture(autouse=True)
def _clear_runs():
    runs.clear()


# ---- signatures ---------------------------------------------------------------------


def test_a_signature_keeps_its_task_arguments_and_options_and_round_trips_as_json():
    sig = add.s(1, y=2).set(queue="maths", retries=3, timeout=5)

    data = json.loads(json.dumps(sig.to_dict()))
    again = emq.Signature.from_dict(data)

    assert again.name == add.name
    assert (again.args, again.kwargs, again.options) == ([1], {"y": 2}, sig.options)
    assert not again.immutable and add.si(1, 2).immutable


def test_a_signature_with_arguments_json_cannot_carry_raises_where_it_is_made():
    with pytest.raises(TypeError, match="JSON"):
        add.s(object(), 2)


def test_a_signature_of_an_unregistered_task_raises_where_it_is_made():
    with pytest.raises(emq.TaskNotFound, match="not a registered task"):
        emq.signature("nowhere.nothing", (1,))


def test_a_step_option_that_a_workflow_cannot_honour_is_refused_with_a_reason():
    with pytest.raises(ValueError, match="countdown"):
        add.s(1, 2).set(countdown=5)
    with pytest.raises(TypeError, match="guarantee"):
        kept.s(1).set(guarantee="yes")


# ---- refusals -----------------------------------------------------------------------


def test_an_empty_group_and_a_chord_without_callback_are_refused_at_the_call_site():
    with pytest.raises(ValueError, match="empty group"):
        emq.group([])
    with pytest.raises(ValueError, match="without a callback"):
        emq.chord([add.s(1, 2)])


def test_a_workflow_nested_deeper_than_the_limit_is_refused_at_the_call_site():
    flow: emq.Workflow = emq.chain(add.s(1, 2))
    for _ in range(MAX_WORKFLOW_DEPTH):
        flow = emq.group(flow)

    with pytest.raises(WorkflowError, match=f"deeper than {MAX_WORKFLOW_DEPTH}"):
        flow.graph()


def test_the_broker_refuses_a_malformed_workflow_with_a_reason(emq_broker):
    client = get_client()
    body = json.dumps({"workflow": 1, "root": {"group": []}}).encode()
    job_id = client.send(WORKFLOW_QUEUE, b"reply-requested", body)

    with pytest.raises(emq.JobRefused, match="workflow refused: root: an empty group"):
        emq.result(job_id).get()
    assert emq_broker.counters["refused_bad_workflow"] == 1


# ---- running ------------------------------------------------------------------------


def test_a_chain_passes_each_result_on_and_returns_the_last(emq_broker):
    result = emq.chain(add.s(1, 2), double.s(), add.s(10)).delay()
    emq_broker.run()

    assert result.get() == 16  # (1 + 2) * 2, then add(6, 10)
    assert runs == ["add(1, 2)", "double(3)", "add(6, 10)"]
    assert [s.get() for s in result.steps] == [3, 6, 16]


def test_a_chains_stream_gives_each_steps_start_partials_and_end_then_its_value(emq_broker):
    result = emq.chain(add.s(1, 2), counting.s(), double.s()).delay()
    emq_broker.run()

    events = list(result.stream())

    assert events[-1] == 8  # (1 + 2 + 1) * 2
    name = f"{__name__}.{{}}".format
    assert [(e.kind, e.step, e.task, e.value) for e in events[:-1]] == [
        ("start", "root.0", name("add"), None),
        ("end", "root.0", name("add"), 3),
        ("start", "root.1", name("counting"), None),
        ("partial", "root.1", name("counting"), "0 of 3"),
        ("partial", "root.1", name("counting"), "1 of 3"),
        ("end", "root.1", name("counting"), 4),
        ("start", "root.2", name("double"), None),
        ("end", "root.2", name("double"), 8),
    ]
    assert list(result.stream()) == [8]  # once the result is in: the value only


def test_a_failed_chains_stream_ends_with_the_steps_error_then_raises_it(emq_broker):
    result = emq.chain(add.s(1, 2), boom.s(), double.s()).delay()
    emq_broker.run()

    events = result.stream()
    assert [e.kind for e in (next(events), next(events), next(events))] == ["start", "end", "start"]
    end = next(events)
    assert (end.kind, end.step, end.value) == ("end", "root.1", None)
    assert end.error is not None and end.error.type == "ValueError"
    with pytest.raises(emq.TaskFailed, match=r"step root\.1 .*boom.* failed: boom at 3"):
        next(events)


def test_an_immutable_step_does_not_take_the_previous_result(emq_broker):
    result = emq.chain(add.s(1, 2), add.si(5, 5)).delay()
    emq_broker.run()

    assert result.get() == 10


def test_a_group_returns_its_members_results_in_order(emq_broker):
    result = emq.group(add.s(i, i) for i in range(5)).delay()
    emq_broker.run()

    assert result.get() == [0, 2, 4, 6, 8]


def test_a_chord_runs_its_callback_once_with_every_members_result(emq_broker):
    result = emq.chord([add.s(i, 1) for i in range(10)], total.s()).delay()
    emq_broker.run()

    assert result.get() == sum(range(1, 11))
    assert runs.count("total") == 1


def test_a_failed_step_ends_the_chain_and_later_steps_never_run(emq_broker):
    result = emq.chain(add.s(1, 2), boom.s(), double.s()).delay()
    emq_broker.run()

    with pytest.raises(emq.TaskFailed, match=r"step root\.1 .*boom.* failed: boom at 3") as failed:
        result.get()
    assert failed.value.type == "ValueError"
    assert runs == ["add(1, 2)", "boom(3)"]


def test_a_chord_with_a_failed_member_gives_its_callback_the_error_and_runs_on_error_once(
    emq_broker,
):
    header = [add.s(1, 1), boom.s(7), add.s(2, 2)]
    result = emq.chord(header, outcomes.s(), on_error=note.s("cleanup")).delay()
    emq_broker.run()

    first, failed, last = result.get()
    assert (first, last) == (2, 4)
    assert failed["error"]["type"] == "ValueError"
    assert failed["error"]["message"] == "boom at 7"
    assert failed["error"]["step"] == "root.1"
    assert (runs.count("outcomes"), runs.count("note cleanup")) == (1, 1)


def test_on_error_does_not_run_when_every_member_succeeded(emq_broker):
    result = emq.chord([add.s(1, 1)], total.s(), on_error=note.s("cleanup")).delay()
    emq_broker.run()

    assert result.get() == 2
    assert "note cleanup" not in runs


def test_workflows_nest_a_chain_in_a_group_and_a_group_in_a_chain(emq_broker):
    inner = emq.group(emq.chain(add.s(1), double.s()), add.s(10))
    result = emq.chain(add.s(0, 1), inner, total.s()).delay()
    emq_broker.run()

    # each member of the group gets add(0, 1) = 1 as its first argument
    assert result.get() == (1 + 1) * 2 + (1 + 10)
    assert runs == ["add(0, 1)", "add(1, 1)", "add(1, 10)", "double(2)", "total"]


def test_a_cancelled_workflow_starts_no_further_step_and_get_raises_cancelled(emq_broker):
    result = emq.chain(add.s(1, 2), double.s()).delay()

    assert result.cancel()
    emq_broker.run()

    with pytest.raises(emq.Cancelled):
        result.get()
    assert "double(3)" not in runs


def test_the_monitor_counts_workflows_running_finished_and_failed(emq_broker):
    done = emq.chain(add.s(1, 2)).delay()
    bad = emq.chain(boom.s(1)).delay()
    emq_broker.run()
    done.get()
    with pytest.raises(emq.TaskFailed):
        bad.get()

    counts = emq_broker.core.workflows.counts
    assert (counts["running"], counts["finished"], counts["failed"]) == (0, 1, 1)


@pytest.mark.parametrize(
    ("root", "reason"),
    [
        ({"chain": []}, "an empty chain"),
        ({"chord": {"header": [{"chain": [{"step": {}}]}]}}, "without a callback"),
        ({"loop": []}, "unknown node kind 'loop'"),
        ({"step": {"path": "m", "callable": "f", "queue": "a b"}}, "whitespace"),
        ({"step": {"path": "m", "callable": "f", "queue": "q", "args": {}}}, "'args' is a list"),
        (
            {"step": {"path": "m", "callable": "f", "queue": "q", "headers": "timeout:-1"}},
            "timeout",
        ),
    ],
)
def test_the_broker_refuses_each_bad_graph_with_the_reason(emq_broker, root, reason):
    body = json.dumps({"workflow": 1, "root": root}).encode()
    job_id = get_client().send(WORKFLOW_QUEUE, b"reply-requested", body)

    with pytest.raises(emq.JobRefused, match=reason):
        emq.result(job_id).get()


def test_a_workflow_id_too_long_for_its_steps_ids_is_refused(emq_broker):
    flow = emq.chain(add.s(1, 2))
    with pytest.raises(ValueError, match="at most 64 bytes"):
        flow.apply_async(job_id="w" * 65)

    body = json.dumps(flow.graph()).encode()
    job_id = get_client().send(WORKFLOW_QUEUE, b"reply-requested", body, job_id="w" * 65)
    with pytest.raises(emq.JobRefused, match="at most 64 bytes"):
        emq.result(job_id).get()


def test_the_broker_refuses_a_workflow_body_that_is_not_json(emq_broker):
    job_id = get_client().send(WORKFLOW_QUEUE, b"reply-requested", b"\xff not json")

    with pytest.raises(emq.JobRefused, match="must be JSON"):
        emq.result(job_id).get()
