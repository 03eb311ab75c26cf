"""The multi-turn tool-use loop: generate, run the tool call in a sandbox, show the result, go on.

`ToolAgent(engine, tokenizer, sandbox, max_turns).generate(prompts, params)` has the shape of
`RolloutEngine.generate` (`params.n` results per prompt, in order) but each result is an
`AgentCompletion` whose response interleaves the model's turns with tool observations:

    prompt | turn 1 ... <tool_call>{...}</tool_call> | <tool_response>OUT</tool_response> | turn 2 ... <eos>
           |  generated: loss_mask 1, sampled logp   |  observation: loss_mask 0, logp 0.0 |  generated

A turn ends at the model's EOS/stop token, at `max_new_tokens`, or right after the first
`tool_call_close` it writes (a stop token when the tag is a single token, as in Qwen2.5 and the
bundled tiny tokenizer; otherwise the turn is cut after the tag and the rest of it discarded).
A turn that ends with a tool call gets the call parsed (Hermes style, the body between the last
`tool_call_open` and the close tag):

    {"name": "code_interpreter", "arguments": {"code": "print(123*456)"}}

the code run in the sandbox, and the observation `observation_template.format(output=...)`
appended: stdout, plus "STATUS: last line of stderr" when the run failed; the output part is cut
so the whole observation is at most `max_observation_tokens` tokens. A malformed call (no open
tag, bad JSON, an unknown tool, no "code" string) gets an observation "error: ..." instead: the
loop never raises for what the model writes. The next turn continues from the exact token ids so
far (no re-tokenisation), so every generated token's log-prob stays the one it was sampled with.

A trajectory has at most `max_turns` generated turns, so at most `max_turns - 1` tool calls run;
a call written in the last allowed turn is not run and the completion ends with finish_reason
"max_turns". A row whose context could not fit its observation and another `max_new_tokens`
within `max_context_tokens` (default: the engine's `max_model_len`) ends with "length" after its
tool call, without the observation (the call still runs).

Efficiency: turn 1 is one `engine.generate` over all prompts with `n` (the engine shares each
prompt's prefill); every later turn is one `generate` over all rows still live (n=1 each); the
turn's tool calls run concurrently on `max_workers` threads, and identical programs in the same
turn run once (`reuse_identical_calls`; harmless for deterministic code, but rows that send the
same random program share its one output).

Not covered: tools other than one Python code interpreter, parallel tool calls in one turn (the
first call is run), streaming, chat-template re-rendering between turns (the observation template
must carry any role markers the model expects).
"""

from __future__ import annotations

import dataclasses
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Literal, Protocol

from rollout.engines.base import RolloutEngine, SamplingParams, derive_seed

AgentFinishReason = Literal["stop", "length", "max_turns"]

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
OBSERVATION_TEMPLATE = "<tool_response>{output}</tool_response>"
CODE_TOOL = "code_interpreter"


class _SandboxLike(Protocol):  # stare.sandbox.Sandbox, without importing the reward role
    def run(self, code: str, *, stdin: bytes | str = b"", files=None): ...


@dataclasses.dataclass
class AgentCompletion:
    """One multi-turn response to one prompt.

    Invariants: `token_ids`, `logprobs` and `loss_mask` have the same length; `loss_mask[t]` is 1
    on tokens the model generated (with `logprobs[t]` their sampling log-prob, <= 0) and 0 on
    observation tokens (with `logprobs[t] == 0.0`); `1 <= turns <= max_turns` counts generated
    turns, so `turns - 1` tool calls were answered with an observation (`turns > 1` means the
    model used the tool).
    """

    token_ids: list[int]
    logprobs: list[float]
    loss_mask: list[int]
    finish_reason: AgentFinishReason
    turns: int


@dataclasses.dataclass
class _Row:
    context: list[int]  # prompt + response so far
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    mask: list[int] = dataclasses.field(default_factory=list)
    turns: int = 0
    finish: AgentFinishReason | None = None
    call_text: str = ""  # the text of the turn that ended with a tool call
    seed: int | None = None  # with per-prompt seeds: this row's own (its prompt's seed, sample index)

    def extend(self, tokens: list[int], logprobs: list[float], trainable: bool) -> None:
        self.context += tokens
        self.tokens += tokens
        self.logprobs += logprobs
        self.mask += [int(trainable)] * len(tokens)


def parse_tool_call(
    text: str, open_tag: str = TOOL_CALL_OPEN, close_tag: str = TOOL_CALL_CLOSE, tool_name: str = CODE_TOOL
) -> tuple[str | None, str | None]:
    """(code, None) for a well-formed call to `tool_name` in `text`, else (None, why not).

    The call is the JSON object between the last `open_tag` before the first `close_tag` and that
    close tag; "arguments" may be an object or a JSON string holding one (both occur in the wild).
    """
    end = text.find(close_tag)
    if end < 0:
        return None, f"no {close_tag}"
    start = text.rfind(open_tag, 0, end)
    if start < 0:
        return None, f"{close_tag} without a {open_tag} before it"
    body = text[start + len(open_tag) : end].strip()
    try:
        call = json.loads(body)
    except ValueError as err:
        return None, f"the tool call is not valid JSON ({err})"
    if not isinstance(call, dict):
        return None, 'the tool call must be a JSON object {"name": ..., "arguments": {...}}'
    if call.get("name") != tool_name:
        return None, f"unknown tool {call.get('name')!r}; the only tool is {tool_name!r}"
    args = call.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None, "arguments is a string that is not a JSON object"
    if not isinstance(args, dict) or not isinstance(args.get("code"), str):
        return None, 'arguments must be an object with a "code" string'
    return args["code"], None


def render_result(result) -> str:
    """What the model sees of a sandbox run: stdout (trailing whitespace dropped), then, if the run
    failed, "STATUS: " and the last line of stderr (or the limit that fired)."""
    out = result.stdout.rstrip()
    if result.status == "ok":
        return out
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    why = lines[-1].strip() if lines else (result.limit_fired or result.detail or "failed")
    return f"{out}\n{result.status}: {why}" if out else f"{result.status}: {why}"


class ToolAgent:
    """Drives a `RolloutEngine` through tool-using turns; see the module docstring."""

    def __init__(
        self,
        engine: RolloutEngine,
        tokenizer,
        sandbox: _SandboxLike,
        max_turns: int,
        tool_call_open: str = TOOL_CALL_OPEN,
        tool_call_close: str = TOOL_CALL_CLOSE,
        *,
        tool_name: str = CODE_TOOL,
        observation_template: str = OBSERVATION_TEMPLATE,
        max_observation_tokens: int = 64,
        max_context_tokens: int | None = None,
        max_workers: int = 2,
        reuse_identical_calls: bool = True,
    ) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1 (1 = no tool call is ever run), got {max_turns}")
        if observation_template.count("{output}") != 1:
            raise ValueError(f"observation_template must contain '{{output}}' once, got {observation_template!r}")
        self.engine, self.tokenizer, self.sandbox = engine, tokenizer, sandbox
        self.max_turns = max_turns
        self.open_tag, self.close_tag, self.tool_name = tool_call_open, tool_call_close, tool_name
        prefix, suffix = observation_template.split("{output}")
        self._obs_prefix = self._encode(prefix)
        self._obs_suffix = self._encode(suffix)
        if max_observation_tokens < len(self._obs_prefix) + len(self._obs_suffix):
            raise ValueError(
                f"max_observation_tokens={max_observation_tokens} cannot hold the observation template's "
                f"{len(self._obs_prefix) + len(self._obs_suffix)} tokens; raise it"
            )
        self.max_observation_tokens = max_observation_tokens
        self.max_context_tokens = max_context_tokens or getattr(engine, "max_model_len", None)
        self.max_workers = max_workers
        self.reuse_identical_calls = reuse_identical_calls
        close_ids = self._encode(tool_call_close)
        # A one-token close tag stops generation in the engine; otherwise turns are cut post hoc.
        self._close_id: int | None = close_ids[0] if len(close_ids) == 1 else None

    @property
    def weight_version(self) -> int:
        return self.engine.weight_version

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False) if text else []

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    # --- the loop ----------------------------------------------------------------------------

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[AgentCompletion]]:
        """`params.n` multi-turn completions per prompt; `params.max_new_tokens` bounds each turn."""
        stops = params.stop_token_ids + ((self._close_id,) if self._close_id is not None else ())
        first = self.engine.generate(prompts, dataclasses.replace(params, stop_token_ids=stops))
        rows = []
        seeds = params.seeds_for(len(prompts))
        for i, (prompt, group) in enumerate(zip(prompts, first)):
            for j, c in enumerate(group):
                row = _Row(context=list(prompt), seed=None if seeds is None else derive_seed(seeds[i], j))
                self._take_turn(row, c.token_ids, c.logprobs, c.finish_reason)
                rows.append(row)
        for turn in range(1, self.max_turns):
            live = [r for r in rows if r.finish is None]
            if not live:
                break
            for r, obs in zip(live, self._observe(live)):
                limit = self.max_context_tokens
                if limit is not None and len(r.context) + len(obs) + params.max_new_tokens > limit:
                    r.finish = "length"  # no room for the observation and another turn
                else:
                    r.extend(obs, [0.0] * len(obs), trainable=False)
            live = [r for r in live if r.finish is None]
            if not live:
                break
            seed = None if params.seed is None else (params.seed + turn * 1_000_003) % (1 << 63)
            live_seeds = None if seeds is None else tuple(derive_seed(r.seed, turn) for r in live)
            turn_params = dataclasses.replace(params, n=1, seed=seed, stop_token_ids=stops, prompt_seeds=live_seeds)
            outputs = self.engine.generate([r.context for r in live], turn_params)
            for r, (c,) in zip(live, outputs):
                self._take_turn(r, c.token_ids, c.logprobs, c.finish_reason)
        n = params.n
        return [
            [AgentCompletion(r.tokens, r.logprobs, r.mask, r.finish or "max_turns", r.turns) for r in rows[i : i + n]]
            for i in range(0, len(rows), n)
        ]

    def _take_turn(self, row: _Row, tokens: list[int], logprobs: list[float], finish: str) -> None:
        """Append one generated turn, cut after a tool call; decide whether the row goes on."""
        cut = self._call_end(tokens)
        if cut is not None:
            tokens, logprobs = tokens[:cut], logprobs[:cut]
        row.extend(list(tokens), list(logprobs), trainable=True)
        row.turns += 1
        if cut is None:
            row.finish = "stop" if finish == "stop" else "length"
        elif row.turns >= self.max_turns:
            row.finish = "max_turns"
        else:
            row.call_text = self._decode(tokens)

    def _call_end(self, tokens: list[int]) -> int | None:
        """Index just past the first tool-call close tag in `tokens`, or None if there is none."""
        if self._close_id is not None:
            return tokens.index(self._close_id) + 1 if self._close_id in tokens else None
        if self.close_tag not in self._decode(tokens):
            return None
        lo, hi = 1, len(tokens)  # the shortest prefix whose text holds the tag: binary search
        while lo < hi:
            mid = (lo + hi) // 2
            if self.close_tag in self._decode(tokens[:mid]):
                hi = mid
            else:
                lo = mid + 1
        return lo

    def _observe(self, rows: list[_Row]) -> list[list[int]]:
        """Run the rows' tool calls (concurrently, identical code once); their observations' tokens."""
        parsed = [parse_tool_call(r.call_text, self.open_tag, self.close_tag, self.tool_name) for r in rows]
        codes = [code for code, _ in parsed if code is not None]
        unique = list(dict.fromkeys(codes)) if self.reuse_identical_calls else codes
        if unique:
            with ThreadPoolExecutor(max_workers=max(1, min(self.max_workers, len(unique)))) as pool:
                results = list(pool.map(self.sandbox.run, unique))
        else:
            results = []
        by_code = dict(zip(unique, results)) if self.reuse_identical_calls else None
        done = iter(results)
        observations = []
        for row, (code, error) in zip(rows, parsed):
            if code is None:
                text = f"error: {error}"
            else:
                text = render_result(by_code[code] if by_code is not None else next(done))
            observations.append(self._observation_tokens(text))
            row.call_text = ""
        return observations

    def _observation_tokens(self, output: str) -> list[int]:
        room = self.max_observation_tokens - len(self._obs_prefix) - len(self._obs_suffix)
        body = self._encode(output)[:room]
        return self._obs_prefix + body + self._obs_suffix


def build_tool_agent(config, engine: RolloutEngine, tokenizer) -> ToolAgent:
    """The ToolAgent that a `stare.config.ToolUseSection` describes, over a real `ProcessSandbox`
    (checked once here, so a sandbox that cannot work on this machine fails the run at start with
    the fix in the message, not every tool call later)."""
    from stare.sandbox import ProcessSandbox

    sandbox = ProcessSandbox(config.sandbox)
    sandbox.check()
    return ToolAgent(
        engine,
        tokenizer,
        sandbox,
        config.max_turns,
        config.tool_call_open,
        config.tool_call_close,
        observation_template=config.observation_template,
        max_observation_tokens=config.max_observation_tokens,
        max_workers=config.max_workers,
        reuse_identical_calls=config.reuse_identical_calls,
    )
