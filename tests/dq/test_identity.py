"""Client identities: which client a Flower node id speaks for."""

import pytest

from dq_flower.codecs import PayloadError
from dq_flower.dq.server.federation import ClientIdentities, reply_identity


def test_a_reply_names_its_identity_by_partition_id_else_by_node_id():
    assert reply_identity({"partition-id": 3}, 101) == 3
    assert reply_identity({"num-examples": 5}, 101) == 101
    assert reply_identity(None, 2**64 - 1) == 2**64 - 1
    for bad in (-1, 2**64, 1.5, "3", True):
        with pytest.raises(PayloadError, match="partition-id"):
            reply_identity({"partition-id": bad}, 101)


def test_an_identity_moves_to_a_new_node_id_only_once_the_old_one_is_gone():
    ids = ClientIdentities()
    ids.observe([101, 102])
    ids.check(1, 101, 0)
    ids.claim(1, 101, 0)
    with pytest.raises(PayloadError, match="contested this round by nodes 101 and 102"):
        ids.check(1, 102, 0)
    ids.bind(101, 0)
    with pytest.raises(PayloadError, match="belongs to node 101, which is still connected"):
        ids.check(2, 102, 0)
    ids.check(2, 101, 0)  # its own node, again
    ids.observe([201, 102])  # node 101 restarted as 201
    ids.check(3, 201, 0)
    ids.bind(201, 0)
    assert ids.of(201) == 0 and ids.of(101) is None and ids.node_of == {0: 201}
    # a node that starts speaking for another identity leaves its old one free
    ids.bind(201, 5)
    assert ids.node_of == {5: 201} and ids.identity_of == {201: 5}


def test_a_round_splits_nodes_into_named_ones_and_those_with_a_table():
    ids = ClientIdentities()
    ids.bind(101, 0)
    ids.bind(102, 1)
    ids.observe([101, 301, 302, 303])  # node 102 is gone; three new node ids
    split = ids.split([101, 301, 302, 303], known={0, 1, 2})
    assert split.known == {101: 0} and split.unknown == [301, 302, 303]
    assert split.free == [1, 2]  # 0 is held by the connected node 101
    assert split.spare == [-1]  # one new node more than known free identities
    assert split.keys == [0, 1, 2, -1]
    assert ids.split([101], known={0, 1, 2}).keys == [0]  # no new node: no table


def test_bindings_survive_a_checkpoint():
    ids = ClientIdentities()
    ids.bind(101, 0)
    ids.bind(2**63 + 5, 7)
    again = ClientIdentities()
    again.load_state(ids.state())
    assert again.identity_of == ids.identity_of and again.node_of == ids.node_of
    again.load_state(None)  # an older checkpoint: no bindings
    assert again.identity_of == {} and again.node_of == {}


def test_a_bound_node_cannot_hop_to_another_identity():
    ids = ClientIdentities()
    ids.observe([101, 102])
    ids.bind(101, 0)
    with pytest.raises(PayloadError, match="node 101 is client 0: a node cannot change"):
        ids.check(2, 101, 5)  # an identity nobody holds: still not 101's to take
    ids.check(2, 101, 0)
    ids.check(2, 102, 5)  # a node not yet bound may claim a free identity


def test_a_contest_is_reported_for_its_round_only():
    ids = ClientIdentities()
    ids.observe([101, 102])
    ids.check(1, 101, 3)
    ids.claim(1, 101, 3)
    with pytest.raises(PayloadError, match="contested"):
        ids.check(1, 102, 3)
    assert ids.contested(1) == {3} and ids.contested(2) == set()


def test_under_node_binding_an_identity_never_leaves_its_node():
    """``identity-binding = "node"``: with SuperNode authentication, bound to the node's key."""
    ids = ClientIdentities(permanent=True)
    ids.observe([101, 102])
    ids.bind(101, 0)
    ids.observe([102, 201])  # node 101 gone: under "connected" 201 could now take 0
    for node in (102, 201):
        with pytest.raises(PayloadError, match="belongs to node 101 for good"):
            ids.check(2, node, 0)
    split = ids.split([201], known={0, 1})
    assert split.free == [1]  # 0 is not offered to a new node
    ids.observe([101, 102])  # an authenticated SuperNode restarts under its own node id
    ids.check(3, 101, 0)
    connected = ClientIdentities()  # the default, for contrast
    connected.bind(101, 0)
    connected.observe([102, 201])
    connected.check(2, 201, 0)
    assert connected.split([201], known={0, 1}).free == [0, 1]


def test_identity_binding_is_a_checked_knob():
    from dq_flower import DQStrategy
    from dq_flower.dq.config import DQConfig

    assert DQConfig(identity_binding="node").identity_binding == "node"
    with pytest.raises(ValueError, match="identity-binding"):
        DQConfig(identity_binding="key")
    import torch  # PyTorch: the strategy needs a model

    strategy = DQStrategy.from_run_config(torch.nn.Linear(4, 2),
                                          {"identity-binding": "node"})
    assert strategy.identities.permanent


def test_a_claim_that_cannot_be_granted_keeps_the_reply_under_its_own_node_id():
    ids = ClientIdentities()
    ids.observe([101, 102, 103])
    ids.prescan(1, [(101, 1), (102, 1), (103, 2)])  # 101 squats identity 1, read first
    assert ids.resolve(1, 101, 1)[0] == 101
    identity, why = ids.resolve(1, 102, 1)
    assert identity == 102 and "claimed by two or more nodes" in why
    assert ids.resolve(1, 103, 2) == (2, "")
    for node, identity in ((101, 101), (102, 102), (103, 2)):
        ids.bind(node, identity)
    # later rounds: both stay themselves, whatever they claim; nobody holds identity 1
    assert ids.resolve(2, 102, 1) == (102, "") and ids.resolve(2, 101, 1) == (101, "")
    assert 1 not in ids.node_of
    # an identity a connected node holds: the newcomer is kept as itself, not rejected
    ids.observe([101, 102, 103, 104])
    assert ids.resolve(3, 104, 2)[0] == 104
    # hopping is still refused
    with pytest.raises(PayloadError, match="cannot change its client identity"):
        ids.resolve(3, 103, 7)
    again = ClientIdentities()
    again.load_state(ids.state())
    assert again.as_itself == {101, 102, 104} and again.resolve(4, 102, 1) == (102, "")
