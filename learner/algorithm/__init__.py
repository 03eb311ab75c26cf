"""The algorithm: pure tensor functions with shapes in comments, no distributed calls, no logging, no
host synchronisation. STARE's selection, weights and gate, the baselines' losses (one registry entry
per loss in `losses.py`), GRPO advantages, the per-step plan every micro-batch shares, the entropy
controller, rollout correction and the four-quadrant diagnostics."""
