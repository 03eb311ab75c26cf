import pytest
from pydantic import ValidationError

from learner.algorithm.entropy_controller import EntropyController
from stare.config.algo import ControllerConfig


def test_threshold_gate_is_entropy_below_target():
    c = EntropyController(ControllerConfig(target=0.3))
    assert [c.decide(h) for h in (0.5, 0.29, 0.3, 0.1)] == [False, True, False, True]


def test_band_gate_has_hysteresis():
    c = EntropyController(ControllerConfig(target=0.3, band=(0.25, 0.35)))
    # starts off; 0.3 inside the band keeps off; 0.2 < low turns on; 0.3 keeps on; 0.4 > high turns off
    assert [c.decide(h) for h in (0.3, 0.2, 0.3, 0.34, 0.4, 0.3, 0.26, 0.24)] == [
        False,
        True,
        True,
        True,
        False,
        False,
        False,
        True,
    ]


def test_adaptive_schedule_moves_w_and_m_by_alpha_and_clips():
    cfg = ControllerConfig(target=0.3, w=1.1, m=0.9, adaptive=True, alpha=0.2, w_max=1.5, m_min=0.5)
    c = EntropyController(cfg)
    trace = []
    for h in (0.1, 0.1, 0.1, 0.3, 0.5, 0.5, 0.5, 0.5):
        c.update(h)
        trace.append((round(c.w, 10), round(c.m, 10)))
    # below target: W up 0.2 (1.3, 1.5, clip 1.5), M down (0.7, 0.5, clip 0.5); at target: unchanged;
    # above: W down to 1.3, 1.1, then clipped at 1.0; M up 0.7, 0.9, then clipped at 1.0.
    assert trace == [(1.3, 0.7), (1.5, 0.5), (1.5, 0.5), (1.5, 0.5), (1.3, 0.7), (1.1, 0.9), (1.0, 1.0), (1.0, 1.0)]


def test_proportional_schedule_sets_w_and_m_from_the_error_alone():
    cfg = ControllerConfig(target=0.3, adaptive=True, schedule="proportional", gain=10.0, w_max=5.0, m_min=0.2)
    c = EntropyController(cfg)
    trace = []
    for h in (0.25, 0.1, 0.3, 0.4, 0.28):
        c.update(h)
        trace.append((round(c.w, 10), round(c.m, 10)))
    # u = clip(10 (0.3 - H), 0, 1): 0.5 -> W 3, M 0.6; 2 -> full tilt (5, 0.2); 0 and < 0 -> (1, 1); 0.2 -> (1.8, 0.84)
    assert trace == [(3.0, 0.6), (5.0, 0.2), (1.0, 1.0), (1.0, 1.0), (1.8, 0.84)]


def test_sign_schedule_is_the_default():
    assert ControllerConfig().schedule == "sign"


def test_non_adaptive_controller_keeps_w_and_m():
    c = EntropyController(ControllerConfig(w=1.2, m=0.8))
    c.update(0.0)
    assert (c.w, c.m) == (1.2, 0.8)


def test_target_change_applies_at_the_next_decision():
    c = EntropyController(ControllerConfig(target=0.3))
    assert c.decide(0.35) is False
    c.set_target(0.4)
    assert c.decide(0.35) is True


def test_set_target_validates_band_order():
    c = EntropyController(ControllerConfig(target=0.3))
    with pytest.raises(ValidationError, match="band"):
        c.set_target(0.3, (0.35, 0.25))
    assert c.target == 0.3


def test_state_dict_round_trip_continues_identically():
    cfg = ControllerConfig(target=0.3, band=(0.2, 0.4), adaptive=True, alpha=0.05, w_max=2.0, m_min=0.5)
    a = EntropyController(cfg)
    for h in (0.5, 0.1, 0.3):
        a.decide(h)
        a.update(h)
    b = EntropyController(ControllerConfig())
    b.load_state_dict(a.state_dict())
    for h in (0.35, 0.45, 0.15):
        assert a.decide(h) == b.decide(h)
        a.update(h)
        b.update(h)
        assert (a.w, a.m) == (b.w, b.m)
    assert a.state_dict() == b.state_dict()


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(w=0.9), "w"),
        (dict(m=1.2), "m"),
        (dict(w=2.0, w_max=1.5), "w_max"),
        (dict(target=0.3, band=(0.4, 0.5)), "band"),
        (dict(target=-1.0), "target"),
    ],
)
def test_bad_controller_values_name_the_field(kwargs, field):
    with pytest.raises(ValidationError, match=field):
        ControllerConfig(**kwargs)


def test_reconfigure_clips_current_w_into_new_bounds():
    c = EntropyController(ControllerConfig(target=0.3, w=1.4, w_max=1.5))
    c.reconfigure(w_max=1.2)
    assert c.w == 1.2


def test_reconfigure_is_all_or_nothing():
    c = EntropyController(ControllerConfig(target=0.3))
    with pytest.raises(ValidationError):
        c.reconfigure(target=0.5, band=(0.1, 0.2))
    assert (c.target, c.band) == (0.3, None)


def test_a_saturated_proportional_schedule_stays_inside_its_bounds_and_its_state_loads():
    cfg = ControllerConfig(target=0.24, adaptive=True, schedule="proportional", gain=10.0, w_max=10.0, m_min=0.1)
    controller = EntropyController(cfg)
    controller.decide(0.0)
    controller.update(0.0)  # far below target: u = 1, W and M at their bounds exactly
    assert (controller.w, controller.m) == (10.0, 0.1)
    restored = EntropyController(cfg)
    restored.load_state_dict(controller.state_dict())  # a resumed run restores it
    assert (restored.w, restored.m) == (10.0, 0.1)


@pytest.mark.parametrize("schedule", ["sign", "proportional"])
@pytest.mark.parametrize("order", ["reference", "lagged"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_entropy_skips_the_step_and_keeps_gate_w_and_m(schedule, order, bad):
    cfg = ControllerConfig(
        target=0.3,
        band=(0.2, 0.4),
        adaptive=True,
        schedule=schedule,
        order=order,
        alpha=0.1,
        gain=10.0,
        w_max=5.0,
        m_min=0.2,
    )
    c = EntropyController(cfg)
    c.begin_step(0.1, 0.1)  # below the band: gate on, W and M tilted
    c.end_step(0.1)
    kept = (c.gate, c.w, c.m, c.last_entropy)
    assert c.begin_step(bad, bad) is True and c.skipped
    c.end_step(bad)
    assert (c.gate, c.w, c.m, c.last_entropy) == kept
    assert c.begin_step(bad, 0.1) is True and c.skipped  # either input non-finite skips the step
    assert (c.gate, c.w, c.m) == kept[:3]
    restored = EntropyController(cfg)
    restored.load_state_dict(c.state_dict())  # the checkpoint holds no NaN, so it loads
    assert (restored.gate, restored.w, restored.m) == kept[:3]
    c.begin_step(0.5, 0.5)  # a finite step afterwards clears the flag and moves on
    assert not c.skipped and c.gate is False


def test_reference_order_trains_with_w_and_m_updated_from_this_steps_entropy():
    cfg = ControllerConfig(target=0.3, w=1.1, m=0.9, adaptive=True, alpha=0.1, w_max=1.5, m_min=0.5)
    ref, lag = EntropyController(cfg), EntropyController(cfg.model_copy(update={"order": "lagged"}))
    used_ref, used_lag = [], []
    for h in (0.1, 0.1, 0.5):
        for c, used in ((ref, used_ref), (lag, used_lag)):
            gate = c.begin_step(h, h)
            used.append((gate, round(c.w, 10), round(c.m, 10)))  # what step k's loss reads
            c.end_step(h)
    # reference: 0.1 -> (1.2, 0.8) used at once, 0.1 -> (1.3, 0.7), 0.5 -> (1.2, 0.8);
    # lagged: step k uses the values from H_(k-1): the initial (1.1, 0.9), then (1.2, 0.8), (1.3, 0.7)
    assert used_ref == [(True, 1.2, 0.8), (True, 1.3, 0.7), (False, 1.2, 0.8)]
    assert used_lag == [(True, 1.1, 0.9), (True, 1.2, 0.8), (False, 1.3, 0.7)]


def test_reference_order_is_the_default():
    assert ControllerConfig().order == "reference"


def test_ema_smooths_the_entropy_the_schedule_reads_and_survives_a_checkpoint():
    cfg = ControllerConfig(target=0.3, adaptive=True, schedule="proportional", gain=10.0, w_max=5.0, m_min=0.2, ema=0.5)
    c = EntropyController(cfg)
    trace = []
    for h in (0.2, 0.3, 0.1):
        c.begin_step(h, h)
        trace.append(round(c.w, 10))
    # s = 0.2 (first), 0.5*0.2+0.5*0.3 = 0.25, 0.5*0.25+0.5*0.1 = 0.175; u = 10 (0.3 - s) = 1, 0.5, 1 (clipped 1.25)
    assert trace == [5.0, 3.0, 5.0]
    restored = EntropyController(cfg)
    restored.load_state_dict(c.state_dict())
    c.begin_step(0.3, 0.3)
    restored.begin_step(0.3, 0.3)  # s = 0.2375 on both: u = 0.625, W = 3.5
    assert restored.w == c.w == pytest.approx(3.5)
