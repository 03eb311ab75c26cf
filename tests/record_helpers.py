"""A valid Trajectory with any field changed (the wire-record tests and the collector tests)."""

import numpy as np

from stare.transport.records import Trajectory


def make_trajectory(**changes) -> Trajectory:
    base = dict(
        run_id="r",
        trajectory_id="t1",
        group_id="g1",
        group_size=2,
        weight_version=3,
        prompt_token_ids=np.array([5, 6, 7], dtype=np.int32),
        response_token_ids=np.array([8, 9], dtype=np.int32),
        response_logprobs=np.array([-0.5, -1.25], dtype=np.float32),
        loss_mask=np.array([1, 0], dtype=np.uint8),
        finish_reason="stop",
        answer="13",
        problem_id="p",
        data_source="stare/arithmetic",
        response_text="#13",
    )
    base.update(changes)
    return Trajectory(**base)
