"""Typed configuration of the policy loss and the entropy controller.

These are sections of the learner's config (see `stare.config`); every field has bounds and a
docstring, variants are a discriminated union on `name`, cross-field rules live in validators.
"""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Union

from annotated_types import Interval
from pydantic import AllowInfNan, BaseModel, ConfigDict, Field, Strict, StrictBool, model_validator

AggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class RolloutCorrectionConfig(_Strict):
    """Correction for the mismatch between the behaviour policy (the log-probs the rollout engine
    recorded, possibly of an older weight version) and the learner's policy at the batch start, on
    rho = exp(old_logp - rollout_logp) per token. Truncated IS multiplies each token's loss by a
    capped weight; masked IS drops tokens (token mask) or whole sequences (sequence and geometric
    masks) whose ratio is outside [mask_low, mask_high] from the loss and its normalisers. Both
    compose with STARE's omega (multiplied) and the staleness bound (system.stale_policy=importance
    needs one of them). Formulas and sources: docs/algorithm.md, "Rollout correction"."""

    is_level: Literal["token", "sequence"] | None = Field(
        None,
        description="Truncated importance sampling. token (TIS, Yao et al.): w_t = min(rho_t, is_cap). "
        "sequence: w = min(prod_t rho_t, is_cap) for every token of the sequence. None: no weight.",
    )
    is_cap: float = Field(2.0, gt=0.0, le=1e6, description="C, the truncation cap of the IS weight.")
    mask_level: Literal["token", "sequence", "geometric"] | None = Field(
        None,
        description="Masked importance sampling (rejection). token: drop tokens with rho_t outside "
        "[mask_low, mask_high]; sequence: drop sequences whose prod_t rho_t is outside it; geometric: drop "
        "sequences whose geometric mean exp(mean_t log rho_t) is outside it. None: no mask.",
    )
    mask_high: float = Field(2.0, gt=1.0, le=1e6, description="Upper threshold of the mask's ratio.")
    mask_low: float | None = Field(
        None,
        gt=0.0,
        lt=1.0,
        description="Lower threshold of the mask's ratio. None: 1 / mask_high.",
    )

    @property
    def enabled(self) -> bool:
        return self.is_level is not None or self.mask_level is not None

    @property
    def low(self) -> float:
        return 1.0 / self.mask_high if self.mask_low is None else self.mask_low


KLEstimator = Literal["k1", "k2", "k3"]


class RefKLConfig(_Strict):
    """A KL penalty to the frozen reference policy (the run's base model): coef x agg(k), k an estimate of
    KL(pi_theta || pi_ref) per response token from log r = log pi_ref - log pi_theta (J. Schulman, "Approximating
    KL Divergence", 2020): k1 = -log r, k2 = (log r)^2 / 2, k3 = (r - 1) - log r (verl's kl_loss_type kl, mse,
    low_var_kl; k3 with verl's clamps). The reference's log-probs come from the learner's no-grad pre-pass (one
    more forward per step); its weights cost one more model copy per learner rank (sharded under ZeRO-3; none
    with LoRA: the base is the policy with its adapters off). Formulas: docs/algorithm.md, "KL to a reference"."""

    coef: float = Field(
        0.001,
        ge=0.0,
        le=10.0,
        description="Weight of the KL term in the loss (verl's kl_loss_coef, 0.001 there). 0: the reference still "
        "runs and its KL is logged (metric ref_kl), nothing is added to the loss.",
    )
    estimator: KLEstimator = Field(
        "k3",
        description="k1: log pi - log pi_ref (unbiased, high variance); k2: (log pi - log pi_ref)^2 / 2 (low "
        "variance, biased); k3: r - 1 - log r with r = pi_ref / pi (unbiased, low variance, >= 0; verl's default "
        "low_var_kl).",
    )


class SurrogateConfig(_Strict):
    """The clipped PPO/GRPO surrogate shared by every policy loss.

    A loss's config subclasses this with its `name` and its `--algo` presets: preset name -> what it
    changes in the config (its `loss` entries apply on top of the loss's own name)."""

    presets: ClassVar[dict[str, dict[str, Any]]] = {}

    eps_low: float = Field(0.2, ge=0.0, lt=1.0, description="Lower clip: ratio >= 1 - eps_low.")
    eps_high: float = Field(0.28, ge=0.0, description="Upper clip (DAPO clip-higher): ratio <= 1 + eps_high.")
    dual_clip_c: float | None = Field(
        10.0, gt=1.0, description="Dual-clip bound c for negative advantages (None disables it)."
    )
    agg_mode: AggMode = Field("token-mean", description="How per-token losses become one number.")
    norm_length: int | None = Field(
        None, ge=1, description="Constant divisor for seq-mean-token-sum-norm (Dr. GRPO): the max response length."
    )
    rollout_correction: RolloutCorrectionConfig = Field(
        default_factory=RolloutCorrectionConfig,
        description="Truncated and masked importance sampling against the rollout log-probs. The old key "
        "loss.tis_cap: C still works (a warning): it is rollout_correction {is_level: token, is_cap: C}.",
    )
    ref_kl: RefKLConfig | None = Field(
        None,
        description="KL to the frozen reference policy (the base model), added to every loss (STARE too) as "
        "coef x the estimator aggregated like the loss. None (the paper's recipes, verl's use_kl_loss false): no "
        "reference model is loaded.",
    )
    entropy_coef: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="Entropy bonus added to every loss (STARE too): loss - entropy_coef x agg(entropy of the "
        "training forward), aggregated like the loss (verl's entropy_coeff). The entropy-bonus loss has its own "
        "coef instead.",
    )

    @model_validator(mode="before")
    @classmethod
    def _legacy_tis_cap(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "tis_cap" not in data:
            return data
        data = dict(data)
        cap = data.pop("tis_cap")
        if cap is None:
            return data
        given = data.get("rollout_correction")
        given = given.model_dump() if isinstance(given, BaseModel) else dict(given or {})
        if given.get("is_level") is not None:
            raise ValueError(
                "loss.tis_cap and loss.rollout_correction.is_level are both set: drop loss.tis_cap "
                "(it is rollout_correction {is_level: token, is_cap: C})"
            )
        warnings.warn(
            f"loss.tis_cap is deprecated: read as loss.rollout_correction {{is_level: token, is_cap: {cap}}}; "
            "write that instead",
            FutureWarning,
            stacklevel=2,
        )
        data["rollout_correction"] = {**given, "is_level": "token", "is_cap": cap}
        return data

    @model_validator(mode="after")
    def _norm_length_for_sum_norm(self) -> SurrogateConfig:
        if self.agg_mode == "seq-mean-token-sum-norm" and self.norm_length is None:
            raise ValueError(
                "loss.norm_length is required with agg_mode 'seq-mean-token-sum-norm': "
                "set it to the maximum response length"
            )
        return self


class GrpoLossConfig(SurrogateConfig):
    """Plain GRPO (also DAPO's loss, with eps_high > eps_low and token-mean)."""

    name: Literal["grpo"] = "grpo"
    # What each preset sets (docs/algorithm.md, "Presets"); everything else is the config's.
    # grpo: vanilla GRPO, the symmetric clip of verl's default (clip_ratio 0.2), no dynamic sampling.
    # grpo-matched: the config's own surrogate (clip range, aggregation, dual clip) without STARE's reweighting:
    #   the control that differs from STARE only by the reweighting (what `grpo` was before it became vanilla:
    #   scripts/results.sh's `grpo` rows ran it).
    # grpo-ds: grpo-matched with dynamic sampling: the STARE paper's GRPO-ds baseline (its configs clip 0.2/0.28).
    # dapo: DAPO (Yu et al. 2025): clip-higher 0.2/0.28, token-mean, dynamic sampling, and the soft overlong
    #   punishment over the last 20% of the response length ("overlong": L_cache / L_max, DAPO's 4,096 of 20,480;
    #   stare.config.train adds it after --set overrides, to the config's reward or the task's own verifier).
    # dapo-no-overlong: dapo without the overlong punishment (what `dapo` was before: the recorded `dapo` rows).
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "grpo": {"loss": {"eps_low": 0.2, "eps_high": 0.2}, "data": {"dynamic_sampling": False}},
        "grpo-matched": {"data": {"dynamic_sampling": False}},
        "grpo-ds": {"data": {"dynamic_sampling": True}},
        "dapo": {
            "loss": {"eps_low": 0.2, "eps_high": 0.28, "agg_mode": "token-mean"},
            "data": {"dynamic_sampling": True},
            "overlong": 0.2,
        },
        "dapo-no-overlong": {
            "loss": {"eps_low": 0.2, "eps_high": 0.28, "agg_mode": "token-mean"},
            "data": {"dynamic_sampling": True},
        },
    }


class StareLossConfig(SurrogateConfig):
    """STARE: reweight the highest-surprisal tokens inside each advantage sign (W on L+, M on L-)."""

    name: Literal["stare"] = "stare"
    presets: ClassVar[dict[str, dict[str, Any]]] = {"stare": {}}
    variant: Literal["O1", "C2"] = Field("O1", description="O1: W on L+ only. C2: W on L+ and M on L-.")
    top_fraction: float = Field(
        0.1, ge=0.0, le=1.0, description="P: the fraction of each advantage-sign subset taken as entropy-critical."
    )
    selection_keys: Literal["learner", "rollout"] = Field(
        "learner",
        description="Whose log-probs rank the surprisal: learner (the reference: the learner's pre-pass) or rollout "
        "(the engine's, recorded while sampling; the step runs no pre-pass: docs/algorithm.md, 'Selection keys').",
    )


class EntropyBonusLossConfig(SurrogateConfig):
    """GRPO minus coef x (aggregated token entropy)."""

    name: Literal["entropy-bonus"] = "entropy-bonus"
    presets: ClassVar[dict[str, dict[str, Any]]] = {"entropy-bonus": {}}
    coef: float = Field(0.001, ge=0.0, le=1.0, description="Entropy bonus coefficient.")

    @model_validator(mode="after")
    def _one_entropy_coefficient(self) -> EntropyBonusLossConfig:
        if self.entropy_coef != 0.0:
            raise ValueError(
                "loss.entropy_coef is for the other losses: the entropy-bonus loss has loss.coef; set that instead"
            )
        return self


class ClipCovLossConfig(SurrogateConfig):
    """Clip-Cov (Cui et al. 2025): detach the gradient of a random `clip_ratio` fraction of tokens
    whose centred covariance A x logp lies in (cov_lb, cov_ub)."""

    name: Literal["clip-cov"] = "clip-cov"
    presets: ClassVar[dict[str, dict[str, Any]]] = {"clip-cov": {}}
    clip_ratio: float = Field(2e-4, gt=0.0, le=1.0, description="Fraction of tokens to detach.")
    cov_lb: float = Field(1.0, description="Lower covariance bound (exclusive).")
    cov_ub: float = Field(5.0, description="Upper covariance bound (exclusive).")

    @model_validator(mode="after")
    def _bounds_ordered(self) -> ClipCovLossConfig:
        if not self.cov_lb < self.cov_ub:
            raise ValueError("loss.cov_lb must be < loss.cov_ub")
        return self


class KLCovLossConfig(SurrogateConfig):
    """KL-Cov (Cui et al. 2025): add kl_coef x |logp - old_logp| on the top `kl_ratio` tokens by
    centred covariance A x logp; no ratio clipping."""

    name: Literal["kl-cov"] = "kl-cov"
    presets: ClassVar[dict[str, dict[str, Any]]] = {"kl-cov": {}}
    kl_ratio: float = Field(2e-4, gt=0.0, le=1.0, description="Fraction of tokens that get the KL penalty.")
    kl_coef: float = Field(1.0, ge=0.0, description="Coefficient of the |log-ratio| penalty.")


class HighEntropyLossConfig(SurrogateConfig):
    """The 80/20 update (Wang et al. 2025): only the top `top_fraction` highest-entropy tokens of the
    step get a policy gradient; the loss is normalised over those tokens."""

    name: Literal["80-20"] = "80-20"
    presets: ClassVar[dict[str, dict[str, Any]]] = {"80-20": {}}
    top_fraction: float = Field(0.2, gt=0.0, le=1.0, description="Fraction of tokens (by entropy) that train.")


LOSS_CONFIGS: dict[str, type[SurrogateConfig]] = {
    cls.model_fields["name"].default: cls
    for cls in (
        StareLossConfig,
        GrpoLossConfig,
        EntropyBonusLossConfig,
        ClipCovLossConfig,
        KLCovLossConfig,
        HighEntropyLossConfig,
    )
}
"""The loss registry's config half: loss name -> config class (with its `--algo` presets). The
learner's half (the loss function and its step-global selection, `@register_loss` in
learner/algorithm/losses/) is checked to name the same losses (tests/learner/test_loss_registry.py);
the config union, the docs and the presets read this one."""

if TYPE_CHECKING:
    # A type checker cannot evaluate the union built from the registry below ("invalid type alias"), so it
    # reads the same union spelled out; tests/core/test_config_unions.py keeps the two equal.
    LossConfig = Annotated[
        StareLossConfig
        | GrpoLossConfig
        | EntropyBonusLossConfig
        | ClipCovLossConfig
        | KLCovLossConfig
        | HighEntropyLossConfig,
        Field(discriminator="name"),
    ]
else:
    LossConfig = Annotated[Union[tuple(LOSS_CONFIGS.values())], Field(discriminator="name")]  # noqa: UP007


# Physical ranges of the controller (the API, the learner and checkpoint loads all check them).
# Entropy in nats is at most ln V; ln 2^32 (22.18) bounds every vocabulary, the learner checks its model's ln V.
MAX_ENTROPY_NATS = math.log(2**32)
MAX_W = 10.0  # W and w_max: a 10x weight on a token class is far past any useful setting
MAX_ALPHA = 1.0  # the sign schedule's step on W (W lives in [1, w_max])
MAX_GAIN = 1000.0  # full tilt 1 mnat under the target
# Strict numbers: a JSON true or "0.3" is refused (ints are accepted for floats); never NaN or infinite.
Num = Annotated[float, Strict(), AllowInfNan(False)]
Entropy = Annotated[float, Strict(), AllowInfNan(False), Interval(gt=0.0, le=MAX_ENTROPY_NATS)]


class ControllerConfig(_Strict):
    """The closed-loop entropy gate and the optional adaptive W/M schedule. Every number is finite and
    inside its physical range: target and band in (0, ln V] nats, 1 <= W <= w_max <= 10, M and m_min in
    (0, 1], alpha in [0, 1], gain in [0, 1000]."""

    target: Entropy = Field(0.3, description="H_tgt: target batch-mean token entropy (nats), in (0, ln V].")
    band: tuple[Entropy, Entropy] | None = Field(
        None,
        description="Optional [low, high] band with hysteresis: the gate turns on below low, off above high, "
        "and keeps its state in between. None: gate = entropy < target.",
    )
    w: Num = Field(1.1, ge=1.0, le=MAX_W, description="W: weight on L+ (positive advantage, high surprisal).")
    m: Num = Field(0.9, gt=0.0, le=1.0, description="M: weight on L- (negative advantage, high surprisal; C2).")
    adaptive: StrictBool = Field(False, description="Adapt W and M after every step (see schedule).")
    schedule: Literal["sign", "proportional"] = Field(
        "sign",
        description="Adaptive schedule. sign (the paper's): W <- clip(W + alpha sgn(target - H), 1, w_max), "
        "M <- clip(M - alpha sgn(target - H), m_min, 1). proportional: no memory; the tilt u = clip(gain "
        "(target - H), 0, 1) sets W = 1 + u (w_max - 1) and M = 1 - u (1 - m_min) for the next step.",
    )
    alpha: Num = Field(0.01, ge=0.0, le=MAX_ALPHA, description="Adaptive step size (schedule sign).")
    gain: Num = Field(
        10.0,
        ge=0.0,
        le=MAX_GAIN,
        description="Proportional gain (schedule proportional): full tilt when the "
        "entropy is 1/gain nats below the target.",
    )
    w_max: Num = Field(1.5, ge=1.0, le=MAX_W, description="Upper bound of W under the adaptive schedule.")
    m_min: Num = Field(0.5, gt=0.0, le=1.0, description="Lower bound of M under the adaptive schedule.")
    order: Literal["reference", "lagged"] = Field(
        "reference",
        description="reference (the reference implementation's): W and M are updated from this step's entropy "
        "H_k before step k's loss, which then uses them. lagged: step k's loss uses the W and M set from H_(k-1); "
        "the update from H_k runs after the optimizer step (this learner's order before session 5).",
    )
    ema: Num = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="Smoothing of the entropy the adaptive W/M schedule reads: "
        "s_k = ema s_(k-1) + (1 - ema) H_k (s starts at the first H). 0: no smoothing (the reference). "
        "The gate reads the raw entropy.",
    )
    entropy_source: Literal["prepass", "lagged"] = Field(
        "prepass",
        description="prepass: the gate reads this step's entropy from the pre-step no-grad pass (exact). "
        "lagged: it reads the entropy measured during the previous step's training forward.",
    )

    @model_validator(mode="after")
    def _check(self) -> ControllerConfig:
        if self.band is not None:
            low, high = self.band
            if not (0.0 < low <= self.target <= high):
                raise ValueError(
                    f"controller.band must satisfy 0 < low <= target <= high, got band={self.band} target={self.target}"
                )
        if self.w > self.w_max:
            raise ValueError(f"controller.w ({self.w}) must be <= controller.w_max ({self.w_max})")
        if self.m < self.m_min:
            raise ValueError(f"controller.m ({self.m}) must be >= controller.m_min ({self.m_min})")
        return self


def clip_number(value: Any, low: Any, high: Any) -> Any:
    """min(max(value, low), high) when all are numbers; otherwise unchanged (validation names the bad one)."""
    if all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (value, low, high)):
        return min(max(value, low), high)
    return value


def check_entropy_range(cfg: ControllerConfig, max_entropy: float | None) -> ControllerConfig:
    """`cfg` if its target and band lie within (0, max_entropy] (ln V of the model), else ValueError
    naming the field. None: only the config's own bound applies."""
    if max_entropy is not None:
        for name, value in (("target", cfg.target), *((("band", cfg.band[1]),) if cfg.band else ())):
            if value > max_entropy:
                raise ValueError(
                    f"controller.{name}: {value} nats is above ln V = {max_entropy:.4g}, the largest "
                    "entropy of this model's vocabulary; send a smaller value"
                )
    return cfg


def merge_config(
    current: dict[str, Any], changes: dict[str, Any], max_entropy: float | None = None
) -> ControllerConfig:
    """`current` (a config dump with the live W and M) with `changes`, validated as a whole (raises
    pydantic's ValidationError, or ValueError when target or band exceed `max_entropy`, ln V). W and
    M, when given, replace the current values; otherwise the current values are clipped into the
    (new) bounds. The learner and the control plane's validation both use this, so they cannot
    disagree on what a change means."""
    merged = {**current, **changes}
    if "w" not in changes:
        merged["w"] = clip_number(merged["w"], 1.0, merged["w_max"])
    if "m" not in changes:
        merged["m"] = clip_number(merged["m"], merged["m_min"], 1.0)
    if isinstance(merged.get("band"), list):  # anything else is left for validation to name
        merged["band"] = tuple(merged["band"])
    return check_entropy_range(ControllerConfig.model_validate(merged), max_entropy)
