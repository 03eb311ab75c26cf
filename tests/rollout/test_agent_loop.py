"""ToolAgent: the multi-turn tool loop, on a scripted in-memory engine and once on a real tiny model.

The scripted engine (`ScriptedEngine`, the in-memory implementation of the RolloutEngine seam)
answers each call from a script keyed by the prompt text and records every call, so each test
can state exactly which contexts the agent sent, which tokens it kept and how it masked them.
"""

from __future__ import annotations

import json

import pytest

from rollout.agent_loop import AgentCompletion, ToolAgent, parse_tool_call, render_result
from rollout.engines.base import Completion, SamplingParams
from stare.models.tiny import build_tokenizer
from stare.sandbox import InMemorySandbox, SandboxResult

OPEN, CLOSE = "<tool_call>", "</tool_call>"
R_OPEN, R_CLOSE = "<tool_response>", "</tool_response>"
CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 +-*/=#:;.,'\"()[]{}_<>!?\n"


@pytest.fixture(scope="module")
def tok():
    """The tiny char-level tokenizer; the tags are single tokens, as in the tool-arithmetic task."""
    return build_tokenizer([CHARS], whole_tokens=(OPEN, CLOSE, R_OPEN, R_CLOSE))


def call(code: str, name: str = "code_interpreter") -> str:
    return OPEN + json.dumps({"name": name, "arguments": {"code": code}}) + CLOSE


class ScriptedEngine:
    """A RolloutEngine whose completions are scripted: `script[context_text]` is a list of texts,
    one per sample (sample j of a prompt gets `texts[j % len(texts)]`); every token's logprob is
    -0.5 and EOS ends a text unless it was cut by the stop ids. It honours stop ids and
    max_new_tokens like a real engine and records (contexts, params) of every call."""

    weight_version = 0

    def __init__(self, tok, script: dict[str, list[str]], max_model_len: int = 10_000):
        self.tok, self.script, self.calls = tok, script, []
        self.max_model_len = max_model_len

    def generate(self, prompts, params):
        self.calls.append(([self.tok.decode(p) for p in prompts], params))
        stops = set(params.stop_token_ids) | {self.tok.eos_token_id}
        out = []
        for p in prompts:
            texts = self.script[self.tok.decode(p)]
            group = []
            for j in range(params.n):
                ids = self.tok.encode(texts[j % len(texts)], add_special_tokens=False) + [self.tok.eos_token_id]
                cut = next((i + 1 for i, t in enumerate(ids) if t in stops), len(ids))
                ids = ids[: min(cut, params.max_new_tokens)]
                reason = "stop" if ids[-1] in stops else "length"
                group.append(Completion(ids, [-0.5] * len(ids), reason))
            out.append(group)
        return out

    def update_weights(self, state_dict, version):
        self.weight_version = version

    def close(self):
        pass


def python_sandbox(code: str, stdin: bytes) -> SandboxResult:
    """An in-memory stand-in that understands the few programs these tests send."""
    if code.startswith("print(") and code.endswith(")"):
        expr = code[len("print(") : -1]
        if all(c in "0123456789*+ " for c in expr):
            return SandboxResult(status="ok", exit_code=0, stdout=f"{eval(expr)}\n")  # digits and + * only
    if code == "loop()":
        return SandboxResult(status="timeout", exit_code=None, limit_fired="cpu_s")
    if code == "print('x' * 500)":
        return SandboxResult(status="ok", exit_code=0, stdout="x" * 500 + "\n")
    return SandboxResult(
        status="error",
        exit_code=1,
        stderr="Traceback (most recent call last):\nNameError: name 'oops' is not defined\n",
    )


class CountingSandbox(InMemorySandbox):
    def __init__(self):
        super().__init__(python_sandbox)
        self.codes: list[str] = []

    def run(self, code, *, stdin=b"", files=None):
        self.codes.append(code)
        return super().run(code, stdin=stdin, files=files)


def agent(tok, script, **kwargs) -> tuple[ToolAgent, ScriptedEngine, CountingSandbox]:
    engine = ScriptedEngine(tok, script, max_model_len=kwargs.pop("max_model_len", 10_000))
    sandbox = CountingSandbox()
    kwargs.setdefault("max_turns", 3)
    return ToolAgent(engine, tok, sandbox, **kwargs), engine, sandbox


def params(n: int = 1, max_new_tokens: int = 200, seed: int | None = 7) -> SamplingParams:
    return SamplingParams(n=n, max_new_tokens=max_new_tokens, seed=seed)


def encode(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def check_invariants(c: AgentCompletion) -> None:
    assert len(c.token_ids) == len(c.logprobs) == len(c.loss_mask)
    for lp, m in zip(c.logprobs, c.loss_mask):
        assert (m == 1 and lp == -0.5) or (m == 0 and lp == 0.0)


# --- one tool call, then the answer ------------------------------------------------------------


def test_tool_call_runs_and_its_output_is_a_masked_observation(tok):
    turn1, turn2 = call("print(12*34)"), "#408"
    obs = f"{R_OPEN}408{R_CLOSE}"
    ag, engine, sandbox = agent(tok, {"Q:": [turn1 + "never seen"], "Q:" + turn1 + obs: [turn2]})
    [[c]] = ag.generate([encode(tok, "Q:")], params())
    check_invariants(c)
    t1, o, t2 = encode(tok, turn1), encode(tok, obs), encode(tok, turn2) + [tok.eos_token_id]
    assert c.token_ids == t1 + o + t2  # the text after the close tag was cut
    assert c.loss_mask == [1] * len(t1) + [0] * len(o) + [1] * len(t2)
    assert c.turns == 2 and c.finish_reason == "stop"
    assert sandbox.codes == ["print(12*34)"]
    assert engine.calls[1][0] == ["Q:" + turn1 + obs]  # turn 2 continues from everything so far


def test_one_token_close_tag_is_a_stop_token_on_every_turn(tok):
    ag, engine, _ = agent(tok, {"Q:": [call("print(1)")], "Q:" + call("print(1)") + f"{R_OPEN}1{R_CLOSE}": ["#1"]})
    ag.generate([encode(tok, "Q:")], params())
    close_id = tok.convert_tokens_to_ids(CLOSE)
    assert [p.stop_token_ids for _, p in engine.calls] == [(close_id,), (close_id,)]


def test_multi_token_close_tag_is_cut_after_the_tag(tok):
    # "END" is three tokens here: no stop id, the turn is cut post hoc right after the tag.
    text = 'x <tool_call>{"name": "code_interpreter", "arguments": {"code": "print(2*3)"}}END trailing'
    ag, engine, _ = agent(
        tok, {"Q:": [text], "Q:" + text[: text.index("END") + 3] + f"{R_OPEN}6{R_CLOSE}": ["#6"]}, tool_call_close="END"
    )
    [[c]] = ag.generate([encode(tok, "Q:")], params())
    assert engine.calls[0][1].stop_token_ids == ()
    assert tok.decode(c.token_ids) == text[: text.index("END") + 3] + f"{R_OPEN}6{R_CLOSE}#6<eos>"
    assert c.turns == 2


# --- when the loop ends ------------------------------------------------------------------------


def test_answer_without_tool_call_is_one_turn(tok):
    ag, engine, sandbox = agent(tok, {"Q:": ["#5"]})
    [[c]] = ag.generate([encode(tok, "Q:")], params())
    assert (c.turns, c.finish_reason, c.loss_mask) == (1, "stop", [1, 1, 1])
    assert len(engine.calls) == 1 and sandbox.codes == []


def test_call_in_the_last_allowed_turn_is_not_run(tok):
    # max_turns=2: one call runs; the second call (turn 2) ends the trajectory unanswered.
    c1, c2 = call("print(1)"), call("print(2)")
    ag, _, sandbox = agent(tok, {"Q:": [c1], "Q:" + c1 + f"{R_OPEN}1{R_CLOSE}": [c2 + "#2"]}, max_turns=2)
    [[c]] = ag.generate([encode(tok, "Q:")], params())
    assert (c.turns, c.finish_reason) == (2, "max_turns")
    assert sandbox.codes == ["print(1)"]
    assert tok.decode(c.token_ids).endswith(c2)


def test_max_turns_one_never_runs_a_tool(tok):
    ag, engine, sandbox = agent(tok, {"Q:": [call("print(1)")]}, max_turns=1)
    [[c]] = ag.generate([encode(tok, "Q:")], params())
    assert (c.turns, c.finish_reason, sandbox.codes, len(engine.calls)) == (1, "max_turns", [], 1)


def test_length_cut_turn_ends_with_length(tok):
    ag, _, _ = agent(tok, {"Q:": ["#123456789"]})
    [[c]] = ag.generate([encode(tok, "Q:")], params(max_new_tokens=4))
    assert (c.finish_reason, len(c.token_ids)) == ("length", 4)


def test_row_that_cannot_fit_another_turn_ends_with_length(tok):
    c1 = call("print(1)")
    max_new = len(encode(tok, c1)) + 1
    context = len(encode(tok, "Q:" + c1 + f"{R_OPEN}1{R_CLOSE}"))
    ag, engine, _ = agent(tok, {"Q:": [c1]}, max_model_len=context + max_new - 1)
    [[c]] = ag.generate([encode(tok, "Q:")], params(max_new_tokens=max_new))
    assert (c.finish_reason, c.turns, len(engine.calls)) == ("length", 1, 1)
    assert c.loss_mask == [1] * len(c.token_ids) and tok.decode(c.token_ids) == c1  # ends at the call
    ag, engine, _ = agent(tok, {"Q:": [c1], "Q:" + c1 + f"{R_OPEN}1{R_CLOSE}": ["#1"]}, max_model_len=context + max_new)
    [[c]] = ag.generate([encode(tok, "Q:")], params(max_new_tokens=max_new))
    assert (c.finish_reason, c.turns) == ("stop", 2)  # one more token of room: the turn fits


# --- malformed calls and failed runs -----------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (OPEN + "{not json" + CLOSE, "not valid JSON"),
        (OPEN + '["a list"]' + CLOSE, "JSON object"),
        (call("print(1)", name="web_search"), "unknown tool 'web_search'"),
        (OPEN + '{"name": "code_interpreter", "arguments": {"cmd": "ls"}}' + CLOSE, '"code" string'),
        (OPEN + '{"name": "code_interpreter", "arguments": "not json"}' + CLOSE, "not a JSON object"),
        ("no open tag" + CLOSE, "without a <tool_call>"),
    ],
)
def test_malformed_call_gets_an_error_observation(tok, text, error):
    code, why = parse_tool_call(text)
    assert code is None and error in why
    ag, engine, sandbox = agent(
        tok, {"Q:": [text], "Q:" + text + f"{R_OPEN}error: {why}{R_CLOSE}": ["#0"]}, max_observation_tokens=500
    )
    [[c]] = ag.generate([encode(tok, "Q:")], params())
    assert sandbox.codes == [] and c.turns == 2 and c.finish_reason == "stop"
    assert f"{R_OPEN}error: {why}{R_CLOSE}" in tok.decode(c.token_ids)


def test_arguments_as_a_json_string_are_accepted():
    text = OPEN + json.dumps({"name": "code_interpreter", "arguments": json.dumps({"code": "print(1)"})}) + CLOSE
    assert parse_tool_call(text) == ("print(1)", None)


def test_failed_runs_show_status_and_last_stderr_line():
    err = SandboxResult(status="error", exit_code=1, stdout="partial\n", stderr="Traceback:\n  x\nValueError: bad\n")
    timeout = SandboxResult(status="timeout", exit_code=None, limit_fired="cpu_s")
    assert render_result(err) == "partial\nerror: ValueError: bad"
    assert render_result(timeout) == "timeout: cpu_s"
    assert render_result(SandboxResult(status="ok", exit_code=0, stdout="42\n\n")) == "42"


def test_long_output_is_truncated_to_max_observation_tokens(tok):
    c1 = call("print('x' * 500)")
    obs = R_OPEN + "x" * 8 + R_CLOSE  # 10 tokens: the tags are one token each
    ag, _, _ = agent(tok, {"Q:": [c1], "Q:" + c1 + obs: ["#1"]}, max_observation_tokens=10)
    [[c]] = ag.generate([encode(tok, "Q:")], params())
    assert c.loss_mask.count(0) == 10 and obs in tok.decode(c.token_ids)


# --- batching ----------------------------------------------------------------------------------


def test_rows_of_a_batch_advance_together_and_keep_their_order(tok):
    # Prompt A: sample 0 calls the tool, sample 1 answers at once. Prompt B: both call the tool.
    ca, cb = call("print(2*2)"), call("print(3*3)")
    script = {
        "A:": [ca, "#4"],
        "B:": [cb],
        "A:" + ca + f"{R_OPEN}4{R_CLOSE}": ["#4"],
        "B:" + cb + f"{R_OPEN}9{R_CLOSE}": ["#9"],
    }
    ag, engine, sandbox = agent(tok, script)
    out = ag.generate([encode(tok, "A:"), encode(tok, "B:")], params(n=2))
    assert [[c.turns for c in g] for g in out] == [[2, 1], [2, 2]]
    assert [[tok.decode(c.token_ids).endswith("<eos>") for c in g] for g in out] == [[True] * 2] * 2
    # Turn 1: both prompts with n=2 in one call; turn 2: the three live rows in one call, n=1.
    assert [len(ctx) for ctx, _ in engine.calls] == [2, 3]
    assert engine.calls[0][1].n == 2 and engine.calls[1][1].n == 1
    # Identical programs in one turn run once.
    assert sorted(sandbox.codes) == ["print(2*2)", "print(3*3)"]


def test_identical_programs_run_per_row_when_reuse_is_off(tok):
    cb = call("print(3*3)")
    ag, _, sandbox = agent(tok, {"B:": [cb], "B:" + cb + f"{R_OPEN}9{R_CLOSE}": ["#9"]}, reuse_identical_calls=False)
    ag.generate([encode(tok, "B:")], params(n=3))
    assert sandbox.codes == ["print(3*3)"] * 3


def test_later_turns_get_their_own_seed_and_unseeded_stays_unseeded(tok):
    c1 = call("print(1)")
    script = {"Q:": [c1], "Q:" + c1 + f"{R_OPEN}1{R_CLOSE}": ["#1"]}
    ag, engine, _ = agent(tok, script)
    ag.generate([encode(tok, "Q:")], params(seed=7))
    assert [p.seed for _, p in engine.calls] == [7, 7 + 1_000_003]
    ag, engine, _ = agent(tok, script)
    ag.generate([encode(tok, "Q:")], params(seed=None))
    assert [p.seed for _, p in engine.calls] == [None, None]


def test_bad_construction_is_refused(tok):
    engine = ScriptedEngine(tok, {})
    with pytest.raises(ValueError, match="max_turns"):
        ToolAgent(engine, tok, CountingSandbox(), max_turns=0)
    with pytest.raises(ValueError, match="output"):
        ToolAgent(engine, tok, CountingSandbox(), max_turns=2, observation_template="<r></r>")
    with pytest.raises(ValueError, match="max_observation_tokens"):
        ToolAgent(engine, tok, CountingSandbox(), max_turns=2, max_observation_tokens=1)


# --- a real model ------------------------------------------------------------------------------


def test_real_tiny_model_with_the_process_sandbox(tmp_path):
    """A random-init tiny Qwen2 with the tool-arithmetic tokenizer, forced (by a one-hot bias on
    the LM head) to write a fixed tool call: the real HFEngine and ProcessSandbox run the loop."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from rollout.engines.hf_engine import HFEngine
    from stare.data.tasks.tool_arithmetic import ALPHABET, ToolArithmeticTask
    from stare.sandbox import ProcessSandbox, SandboxConfig, best_isolation

    task = ToolArithmeticTask()
    tok = build_tokenizer([ALPHABET], whole_tokens=task.whole_tokens)
    path = tmp_path / "m"
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(path)
    GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id).save_pretrained(path)
    engine = HFEngine(str(path))
    sandbox = ProcessSandbox(SandboxConfig(isolation=best_isolation()))
    ag = ToolAgent(engine, tok, sandbox, max_turns=2, max_observation_tokens=16)
    prompt = encode(tok, "12*34=")
    free = ag.generate([prompt], SamplingParams(n=4, max_new_tokens=8, seed=0))
    for c in free[0]:  # random weights: whatever it writes, the records hold their invariants
        assert len(c.token_ids) == len(c.logprobs) == len(c.loss_mask) and 1 <= c.turns <= 2

    # Now script the model: logits that depend on the position only, so greedy decoding writes
    # `script` after the prompt and <eos> after that (turn 2 is just <eos>).
    script = encode(tok, call("print(12*34)"))
    base_forward = engine.model.forward

    def forward(*args, position_ids=None, **kwargs):
        out = base_forward(*args, position_ids=position_ids, **kwargs)
        logits = torch.full_like(out.logits[:, -1], -1e4)  # [R, V]
        for r, p in enumerate(position_ids[:, -1].tolist()):
            k = p + 1 - len(prompt)
            logits[r, script[k] if k < len(script) else tok.eos_token_id] = 0.0
        out.logits = logits[:, None, :].expand(-1, out.logits.shape[1], -1).clone()
        return out

    engine.model.forward = forward
    [[c]] = ag.generate([prompt], SamplingParams(n=1, max_new_tokens=40, temperature=0.0))
    text = tok.decode(c.token_ids, skip_special_tokens=True)
    assert text.startswith(call("print(12*34)") + f"{R_OPEN}408{R_CLOSE}"), text
    assert (c.turns, c.finish_reason) == (2, "stop")
    n_obs = len(encode(tok, f"{R_OPEN}408{R_CLOSE}"))
    assert c.loss_mask == [1] * len(script) + [0] * n_obs + [1] * (len(c.token_ids) - len(script) - n_obs)
    assert all(lp == 0.0 for lp, m in zip(c.logprobs, c.loss_mask) if m == 0)
    engine.close()
