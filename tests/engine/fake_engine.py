"""An engine without a model, for the batcher's and the GPU loop's CPU tests: a ScriptRunner stands in
for engine.runner.ModelRunner and answers each StepPlan with scripted tokens (a sequence's next token
is its script's next entry), so a test knows every token before it is chosen; the KV cache is a real
MLACache of one layer and one value per position (its slot list is what capacity counts)."""
from __future__ import annotations

import types

import torch

from pegainfer.engine.admission import admit
from pegainfer.engine.contract import Admit
from pegainfer.engine.engine import RequestError
from pegainfer.engine.kv_cache import MLACache
from pegainfer.engine.sequence import Sequence
from pegainfer.engine.step_plan import Fork, StepPlan, StepResult, fed_order

EOS = 2
VOCAB = 1000


def default_script(seq: Sequence, n: int) -> int:
    """Token n of a sequence without a script: never EOS, different per choice."""
    return 10 + 100 * seq.index + n


class ScriptRunner:
    """Draw i's token is the next entry of its sequence's script (scripts: request id or (request id,
    choice index) -> tokens); requests in fail_draws / fail_rows fail their draws / prompt rows as
    engine.request_guard reports them; `fault` (a device fault) is raised by the next step. Every plan it
    was given is kept, and every fork it copied."""

    samples_on_device = False  # sampled steps run one at a time (ModelRunner.samples_on_device)

    def __init__(self, scripts: dict | None = None):
        self.scripts = scripts or {}
        self.fail_draws: dict[str, str] = {}
        self.fail_rows: dict[str, str] = {}
        self.fault: Exception | None = None
        self.plans: list[StepPlan] = []
        self.forks: list[Fork] = []
        self._last_launched: StepPlan | None = None

    def token(self, seq: Sequence, ahead: int = 0) -> int:
        n = len(seq.output_ids) + ahead
        script = self.scripts.get(seq.key, self.scripts.get(seq.request_id))
        return script[n] if script is not None and n < len(script) else default_script(seq, n)

    def run(self, plan: StepPlan, meter=None) -> StepResult:
        self.plans.append(plan)
        if self.fault is not None:
            raise self.fault
        assert len(plan.owners) == plan.num_draws
        failed = {i: self.fail_draws[s.request_id] for i, s in enumerate(plan.owners)
                  if s.request_id in self.fail_draws}
        tokens = [-1 if i in failed else self.token(s) for i, s in enumerate(plan.owners)]
        failed_rows = {r: self.fail_rows[plan.seqs[r].request_id] for r in plan.prompt_wants
                       if plan.seqs[r].request_id in self.fail_rows}
        # a prompt entry's log-prob is the token it is for, so that tests can join the chunks
        prompt = {r: [None] * w.first + [(float(t), ()) for t in w.targets] for r, w in plan.prompt_wants.items()
                  if r not in failed_rows}
        self.forks += [f for f in plan.forks if f.row not in failed_rows and not any(d in failed for d in f.draws)]
        n = len(tokens)
        return StepResult(tokens, [None] * n, [()] * n, prompt, plan.draws is not None, failed, failed_rows)

    def launch(self, plan: StepPlan, meter=None) -> list[int]:
        """A launched step's tokens (one per draw) are known at once; a fed row's input is its
        sequence's token of the step launched before, not yet given to it (one ahead): feed j names
        that step's j-th row, its one-token rows first, then its prompt rows."""
        self.plans.append(plan)
        if self.fault is not None:
            raise self.fault
        assert plan.launchable and plan.draws is None and not plan.forks
        fed = set()
        if plan.feed is not None:
            last = self._last_launched
            order = fed_order(last.rows, last.seqs)
            for s, j in zip(plan.seqs, plan.feed):
                if j >= 0:
                    assert order[j] is s
                    fed.add(s.key)
        self._last_launched = plan
        return [self.token(s, int(s.key in fed)) for s in plan.owners]

    def collect(self, launched: list[int]) -> StepResult:
        return StepResult.greedy(launched)


class Backend:
    """The EP backend's part the loop calls: rank checks while idle."""

    def __init__(self):
        self.checks = 0
        self.failure: Exception | None = None

    def check_ranks(self) -> None:
        self.checks += 1
        if self.failure is not None:
            raise self.failure



class Counters:
    """The engine's step counters (none kept)."""

    def take(self):
        return None

    def mark(self):
        return lambda: None


class FakeEngine:
    """What engine.loop, engine.admission and engine.batcher read of an Engine."""

    def __init__(self, slots: int = 4, max_len: int = 64, scripts: dict | None = None, *,
                 kv_tokens: int | None = None, page_size: int = 8, prefix_caching: bool = False):
        # default: every slot can hold max_len at once, plus the admission watermark's page
        pages = slots * (max_len // page_size) + 1 if kv_tokens is None else kv_tokens // page_size
        self.cache = MLACache(1, slots, max_len, 1, "cpu", torch.float32, num_pages=pages, page_size=page_size,
                              prefix_caching=prefix_caching)
        self.runner = ScriptRunner(scripts)
        self.backend = Backend()
        self.counters = Counters()
        self.spec = types.SimpleNamespace(device="cpu")
        self.cfg = types.SimpleNamespace(vocab_size=VOCAB)
        self.eos_id = EOS
        self.max_model_len = max_len

    def check_request(self, prompt_ids: list[int], max_tokens: int) -> None:
        if not prompt_ids or len(prompt_ids) + max_tokens > self.max_model_len:
            raise RequestError("outside the fake engine's limits")

    def sequence(self, cmd: Admit) -> Sequence:
        """The request's first sequence (its siblings in .forks), as the GPU loop admits it."""
        return admit(cmd, self)
