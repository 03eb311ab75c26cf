"""THE training loop of a run (`TrainingSession` in `session.py`), the same for `stare train` and
`stare learner`: what differs between the two is passed in as `SessionSeams`. Complete groups of
scored trajectories (`group_collector.py`), held-out evaluation through the streams
(`stream_evaluator.py`) and how a session ended (`run_outcome.py`)."""
