"""Held-out evaluation, the core's part: what is sampled and how scores add up (`heldout.py`, shared
by the in-process and the streamed evaluation so both give the same numbers) and the evaluation's
own streams (`streams.py`). The rollout side is rollout/evaluation.py; the learner's is
learner/loop/stream_evaluator.py."""
