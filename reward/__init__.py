"""Reward role: verifiers that turn a response into a scalar reward, and the sandbox they use.

- `sandbox`: run untrusted Python under limits (`ProcessSandbox`, `SandboxConfig`,
  `SandboxResult`); `sandbox_cli` is `stare sandbox run FILE.py`.
- `math`, `code`, `format`, `overlong`: the verifiers (pure functions with pydantic configs).
- `compose`: `RewardConfig` (weighted components) and `compute_reward` -> `RewardResult`.
- `worker_pool`: `ScoringPool`, verification in processes with a hard per-item timeout.
- `timeouts`: an in-thread timeout that works off the main thread.

Nothing is imported here, so `import reward.x` pays only for x. See docs/reward.md.
"""
