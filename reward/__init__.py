"""Reward role: verifiers that turn a response into a scalar reward, and the sandbox they use.

- `sandbox`: run untrusted Python under limits (`ProcessSandbox`, `SandboxConfig`,
  `SandboxResult`); `sandbox_cli` is `stare sandbox run FILE.py`.
- `verifiers/`: `math`, `code`, `format`, `overlong` (one registry entry per kind, `@register_verifier`)
  and `compose`: `compute_reward` -> `RewardResult` over the weighted components of `RewardConfig`.
- `worker`: `RewardWorker` and `score_response`, the one scoring function of both reward workers.
- `scoring_pool`: `ScoringPool`, verification in processes with a hard per-item timeout.
- `timeouts`: an in-thread timeout that works off the main thread.

Nothing is imported here, so `import reward.x` pays only for x. See docs/reward.md.
"""
