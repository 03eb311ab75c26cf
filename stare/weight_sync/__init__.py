"""Weight sync: the learner publishes versioned weights, rollout engines take them in place.

`base.py` is the protocol; `in_memory.py` hands the state dict over inside one process (embedded).
"""
