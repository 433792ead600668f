"""A node's configuration error stops the run at once, with one line naming the knob."""

import pytest
from flwr.app import Message, RecordDict

from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.server.common import ClientFailureError, NodeConfigurationError
from dq_flower.server.pipeline import FailureWatch
from dq_flower.wire.node_errors import MARKER, NodeConfigError, node_config_problem
from dq_flower.wire.partition import names_partition

PROBLEM = "scorer='loss' needs the model: pass model= (your nn.Module) to dq_train"


def _reason_as_flower_writes_it(where: str) -> str:
    """The error reply's reason for a ``NodeConfigError`` raised in a ClientApp."""
    text = str(NodeConfigError(PROBLEM))
    if where == "supernode":  # flwr/supernode/runtime/run_clientapp.py
        return f"<class 'dq_flower.wire.node_errors.NodeConfigError'>:<'{text}'>"
    # the simulation engine wraps it in ClientAppException, traceback first
    return ("<class 'flwr.clientapp.client_app.ClientAppException'>:<'\nException "
            "ClientAppException occurred. Message: Traceback (most recent call last):\n"
            '  File "client.py", line 3, in train\n'
            f"dq_flower.wire.node_errors.NodeConfigError: {text}\n'>")


@pytest.mark.parametrize("where", ["supernode", "simulation"])
def test_the_problem_is_read_back_from_flowers_reason(where):
    assert node_config_problem(_reason_as_flower_writes_it(where)) == PROBLEM


def test_other_errors_carry_no_problem():
    assert node_config_problem("<class 'ValueError'>:<'local label 12 is outside'>") is None
    assert node_config_problem(MARKER) is None  # a marker with nothing after it


def _round(grid: InProcessGrid, nodes: list[int]) -> list[Message]:
    return grid.send_and_receive(
        [Message(RecordDict(), dst_node_id=n, message_type="train") for n in nodes])


def test_a_configuration_error_stops_at_the_first_round_other_errors_count():
    @names_partition  # as dq_train: its errors name the node's partition
    def client(msg, context):
        if int(context.node_config["partition-id"]) == 0:
            raise ValueError("disk full")
        raise NodeConfigError(PROBLEM)

    grid = InProcessGrid(client, 2)
    first, second = sorted(grid.get_node_ids())
    watch = FailureWatch(limit=3, name="dq")
    watch.observe(_round(grid, [first]))  # an ordinary failure: counted, the run goes on
    assert watch.streak == 1
    with pytest.raises(NodeConfigurationError) as info:
        watch.observe(_round(grid, [first, second]))
    assert str(info.value) == (f"[dq] node {second} (partition 1) cannot run as configured: "
                               f"{PROBLEM}")
    assert isinstance(info.value, ClientFailureError)  # what the commands already report
