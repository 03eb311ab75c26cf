"""The `stare learner` process: its seams over Redis and the weight broadcast (`role.py`), several
learner ranks (`ranks.py`, `rank_launch.py`) and the learner's side of the colocated node
(`colocation.py`)."""
