"""A reward function in verl's signature for GSM8K-style data: the answer after '####', as verl's
verl/utils/reward_score/gsm8k.py scores it, plus a small credit for using the format at all.

    reward:
      components:
        - {kind: function, path: docs/examples/gsm8k_reward.py, function: compute_score}
"""

import re

_ANSWER = re.compile(r"#### (-?[0-9.,]+)")


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """1.0 for the right number after '####', 0.1 for a wrong one, 0.0 without '####'; `acc` says
    whether the answer is right (stare's accuracy and pass@k read it)."""
    found = _ANSWER.findall(solution_str)
    if not found:
        return {"score": 0.0, "acc": False}
    answer = found[-1].replace(",", "").rstrip(".")
    right = answer == str(ground_truth).replace(",", "")
    return {"score": 1.0 if right else 0.1, "acc": right}
