import json

import numpy as np
import pytest
from record_helpers import make_trajectory

from reward.worker import RewardWorker
from stare.data.tasks.registry import build_task
from stare.transport.in_memory import MemoryStream
from stare.transport.records import SCHEMA_VERSION, PromptTask, RecordError, Trajectory


def test_trajectory_round_trips_through_packed_fields():
    t = make_trajectory(reward=1.0, reward_info={"correct": True})
    fields = t.to_fields()
    assert fields["response_logprobs"] == np.array([-0.5, -1.25], dtype="<f4").tobytes()  # packed, not JSON
    back = Trajectory.from_fields(fields)
    assert back.trajectory_id == "t1" and back.reward == 1.0 and back.reward_info == {"correct": True}
    assert np.array_equal(back.response_logprobs, t.response_logprobs)
    assert np.array_equal(back.loss_mask, t.loss_mask) and back.loss_mask.dtype == np.uint8


def test_mismatched_lengths_name_the_field():
    with pytest.raises(RecordError, match="response_logprobs"):
        make_trajectory(response_logprobs=np.array([-0.5], dtype=np.float32)).validate()


def test_positive_logprob_is_rejected():
    with pytest.raises(RecordError, match="response_logprobs"):
        make_trajectory(response_logprobs=np.array([0.5, -1.0], dtype=np.float32)).validate()


def test_wrong_schema_version_is_rejected():
    fields = make_trajectory().to_fields()
    fields["json"] = fields["json"].replace(f'"schema": {SCHEMA_VERSION}'.encode(), b'"schema": 99')
    with pytest.raises(RecordError, match="schema"):
        Trajectory.from_fields(fields)


def test_per_token_versions_round_trip_and_expand():
    t = make_trajectory(
        response_token_ids=np.arange(5, dtype=np.int32),
        response_logprobs=np.full(5, -1.0, np.float32),
        loss_mask=np.ones(5, np.uint8),
        weight_version=2,
        version_starts=[[1, 3], [4, 5]],
    )
    back = Trajectory.from_fields(t.to_fields())
    assert back.version_starts == [[1, 3], [4, 5]] and back.newest_version == 5
    assert back.token_versions().tolist() == [2, 3, 3, 3, 5]
    assert make_trajectory(weight_version=4).token_versions().tolist() == [4, 4]  # one version: every token


@pytest.mark.parametrize("starts", [[[0, 3]], [[2, 3]], [[1, 2]], [[1, 4], [1, 5]], [[1, 5], [1, 4]], [[1]]])
def test_version_starts_out_of_order_or_out_of_range_name_the_field(starts):
    # response of 2 tokens at version 2: an index must be in (0, 2), versions above 2 and increasing
    with pytest.raises(RecordError, match="version_starts"):
        make_trajectory(weight_version=2, version_starts=starts).validate()


def test_a_schema_2_trajectory_still_reads_with_one_version():
    fields = make_trajectory(weight_version=7).to_fields()
    header = json.loads(fields["json"])
    del header["version_starts"]
    fields["json"] = json.dumps({**header, "schema": 2}).encode()  # written by the previous build
    back = Trajectory.from_fields(fields)
    assert back.schema == SCHEMA_VERSION and back.version_starts == [] and back.token_versions().tolist() == [7, 7]


def test_prompt_task_round_trips():
    p = PromptTask(
        run_id="r",
        group_id="g",
        prompt="1+2=",
        prompt_token_ids=[1, 2],
        answer="3",
        problem_id="x",
        data_source="d",
        group_size=4,
    )
    assert PromptTask.from_fields(p.to_fields()) == p


def test_prompt_task_keeps_its_minimum_weight_version_and_refuses_unknown_fields():
    p = PromptTask(
        run_id="r",
        group_id="g",
        prompt="1+2=",
        prompt_token_ids=[1, 2],
        answer="3",
        problem_id="x",
        data_source="d",
        group_size=4,
        min_weight_version=3,
    )
    assert PromptTask.from_fields(p.to_fields()).min_weight_version == 3
    fields = json.loads(p.to_fields()["json"])
    with pytest.raises(RecordError, match="PromptTask fields do not match schema"):
        PromptTask.from_fields({"json": json.dumps({**fields, "surprise": 1}).encode()})


def test_reward_worker_dead_letters_invalid_records_with_reason_and_scores_the_rest():
    raw, scored = MemoryStream("raw"), MemoryStream("scored")
    bad = make_trajectory(trajectory_id="bad", loss_mask=np.array([1], dtype=np.uint8))
    good = make_trajectory(trajectory_id="good")
    raw.publish([bad, good])
    RewardWorker(build_task("arithmetic"), raw, scored, name="w").run_once()
    assert len(raw.dead) == 1 and "loss_mask" in raw.dead[0][2]
    delivered = scored.consume("learner", 10)
    assert [d.record.trajectory_id for d in delivered] == ["good"]
    assert raw.backlog() == 0  # nothing left pending, nothing lost


def test_verifier_crash_gives_zero_reward_with_reason():
    class Exploding:
        name = "boom"

        def reward(self, problem, completion):
            raise RuntimeError("verifier died")

    raw, scored = MemoryStream("raw"), MemoryStream("scored")
    raw.publish([make_trajectory()])
    RewardWorker(Exploding(), raw, scored, name="w").run_once()
    t = scored.consume("l", 1)[0].record
    assert t.reward == 0.0 and "verifier died" in t.reward_info["error"]


def test_verifier_timeout_gives_zero_reward_and_the_worker_carries_on():
    import time

    from stare.runtime.timeouts import call_with_timeout

    class Slow:
        name = "slow"

        def reward(self, problem, completion):
            def spin():  # Python-level work: interruptible (a C call is bounded only by ScoringPool)
                deadline = time.monotonic() + 5.0
                while time.monotonic() < deadline:
                    pass

            return call_with_timeout(spin, 0.2)

    raw, scored = MemoryStream("raw"), MemoryStream("scored")
    raw.publish([make_trajectory(trajectory_id="a"), make_trajectory(trajectory_id="b")])
    t0 = time.monotonic()
    RewardWorker(Slow(), raw, scored, name="w").run_once()
    assert time.monotonic() - t0 < 3.0  # bounded by the timeout, not by the sleep
    out = [d.record for d in scored.consume("l", 10)]
    assert [t.trajectory_id for t in out] == ["a", "b"]
    assert all(t.reward == 0.0 and "Timeout" in t.reward_info["error"] for t in out)


def test_a_rows_extra_info_and_prompt_travel_with_the_trajectory():
    extra = {"split": "train", "index": 7, "question": "What is 2+2?", "tags": ["a", 1.5]}
    back = Trajectory.from_fields(make_trajectory(prompt="2+2=", extra_info=extra).to_fields())
    assert (back.prompt, back.extra_info) == ("2+2=", extra)
    task = PromptTask(run_id="r", group_id="g", prompt="2+2=", prompt_token_ids=[1], answer="4", problem_id="p",
                      data_source="d", group_size=2, extra_info=extra)  # fmt: skip
    assert PromptTask.from_fields(task.to_fields()).extra_info == extra


def test_a_schema_3_trajectory_reads_without_row_fields():
    fields = make_trajectory().to_fields()
    header = json.loads(fields["json"])
    del header["prompt"], header["extra_info"]
    fields["json"] = json.dumps({**header, "schema": 3}).encode()  # written by the previous build
    back = Trajectory.from_fields(fields)
    assert (back.schema, back.prompt, back.extra_info) == (SCHEMA_VERSION, "", {})
