"""Acks are split to fit the server's bounds: bytes (the channel's send limit) and entries per Ack (its MAX_ACK_ENTRIES,
past which it refuses the whole ack)."""
from __future__ import annotations

from rollout_client.connection import MAX_ACK_ENTRIES, _ack_requests


def test_a_burst_of_acks_over_the_servers_entry_bound_goes_as_several_acks_each_within_it():
    refs = [(f"t{i}", 0) for i in range(2 * MAX_ACK_ENTRIES + 5)]
    requests = _ack_requests(refs, None)
    assert all(len(r.ack.trajectories) <= MAX_ACK_ENTRIES for r in requests)
    assert [(t.task_id, t.sample_index) for r in requests for t in r.ack.trajectories] == refs
