"""stare: RL post-training of LLMs on verifiable rewards with STARE.

Shared code lives here (config, wire records, transports, CLI, embedded runner); each role has its
own top-level folder, installed as a subpackage: `learner/` -> `learner`, `rollout/` ->
`rollout`, `reward/` -> `reward`, `services/` -> `services`.
"""

__version__ = "0.1.0"
