"""What a training session shows before and while it trains: start-up lines and a progress bar.

The lines are the task's (:meth:`sohsm.train.task.Task.startup_lines`); before the bar, a language
model's two lines on stderr say what is about to run and for how long::

    ptb: 10,000 words, 887,521 train tokens | LSTM 1×512/512 | head self_organized: 5.2M parameters,
        100 clusters, K 43 (auto, ≈8 per epoch) | 11M parameters in all | cpu
    plan: 4,437,760 tokens (5 epochs)

and once the first steps are timed, a third::

    ≈ 12 min for 4,437,760 tokens at 6,400 tok/s (training time; dev evaluations come on top)

The bar shows the mean training loss (and perplexity) of each train record; before a session's first
record, that of the steps so far after its steps 1, 2, 4, 8, ...; after it, that of the open interval
every :data:`LOSS_REFRESH_S` seconds (:meth:`wants_loss`: each a device sync, so a few). With a time
budget that ends the run before its planned tokens, the bar's total is the tokens the budget will reach
at the speed so far, so its percentage and ETA follow the budget. Where standard error is not a terminal
(a log file, a pipe), a line written beside the bar ends the bar's line instead of overwriting it with spaces.
The bar's elapsed time is the session's training time (evaluations, checkpoints and compiling left out), so the
speed its closing line gives is the one the summary prints, and so is the speed of its estimate (a rate over the
same clock and tokens, between its steps 2 and 22).
"""
from __future__ import annotations

import math
import sys
import time

import torch
from tqdm import tqdm

#: steps left out of the speed estimate (lazy initialisation, allocator warm-up) and steps timed
WARMUP_STEPS, TIMED_STEPS = 2, 20
#: seconds between the loss shown beside the bar once train records come (a train record also shows its own)
LOSS_REFRESH_S = 2.0


def count_text(n: float) -> str:
    """``5_200_000`` -> ``"5.2M"``, ``42_000`` -> ``"42k"``."""
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= limit:
            return f"{n / limit:.1f}{suffix}" if n < 100 * limit else f"{n / limit:.0f}{suffix}"
    return f"{n:.0f}"


def duration_text(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def parameter_count(*modules: torch.nn.Module) -> int:
    """Parameters of ``modules``, each counted once (a tied weight belongs to two)."""
    return sum(p.numel() for p in {id(p): p for m in modules for p in m.parameters()}.values())


class _EstimatingBar(tqdm):
    """A tqdm bar of tokens that, after its first steps, prints how long the rest will take.

    ``clock``: seconds of training so far (evaluations excluded), which a time budget counts; ``time_left``:
    the budget's seconds left when the bar starts.
    """

    total: int  # tqdm's: the planned tokens, which a time budget may lower (:meth:`_follow_time_budget`)

    def __init__(self, *args, time_left: float | None = None, cuda: bool = False, clock=time.perf_counter,
                 units: tuple[str, str] = ("tokens", "tok"), **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._units = units
        self._time_left, self._cuda, self._updates = time_left, cuda, 0
        self._mark: tuple[float, float] | None = None
        self._clock, self._planned = clock, self.total
        self._clock_born, self._left_out = clock(), 0
        self._budget_end = None if time_left is None else clock() + time_left
        self._clock_mark: tuple[float, float] | None = None
        self._shown_record, self._shown_at = False, -math.inf

    @property
    def format_dict(self):
        """tqdm's fields, with the session's seconds of training as its elapsed time (evaluations, checkpoints and
        compiling left out, as the summary's speed leaves them): the closing line's average speed is the summary's."""
        fields = super().format_dict
        if hasattr(self, "_clock_born"):  # (tqdm sets disable before its closing line)
            fields["elapsed"] = max(self._clock() - self._clock_born, 0.0)
            fields["initial"] = fields.get("initial", 0) + self._left_out  # tqdm's rate: (n - initial) / elapsed
        return fields

    def leave_out(self, tokens: int) -> None:
        """Count ``tokens`` trained outside the clock (a step that compiled) out of the speed shown."""
        self._left_out += tokens

    def show_loss(self, nll: float, is_nll: bool, record: bool = True) -> None:
        """Show a mean training loss in nats (and its perplexity, where it is a log-likelihood) beside the bar;
        ``record``: a train record's, after which :meth:`wants_loss` asks every :data:`LOSS_REFRESH_S` seconds."""
        self._shown_record = self._shown_record or record
        self._shown_at = time.perf_counter()
        self.set_postfix(loss=f"{nll:.3f}", ppl=f"{math.exp(min(nll, 700.0)):.1f}" if is_nll else "-", refresh=False)

    def wants_loss(self, session_steps: int) -> bool:
        """Whether to show the loss so far after the session's ``session_steps``-th step: before its first train
        record at steps 1, 2, 4, 8, ...; after it, once :data:`LOSS_REFRESH_S` seconds have passed since the
        last loss shown (the loss between records would otherwise stand still for ``log_every`` steps)."""
        if self.disable:
            return False
        if not self._shown_record:
            return session_steps & (session_steps - 1) == 0
        return time.perf_counter() - self._shown_at >= LOSS_REFRESH_S

    def _follow_time_budget(self) -> None:
        """With a time budget, make the total the tokens the budget will reach at the speed so far (never more
        than planned), so that the percentage and the ETA are the budget's, not those of tokens it never reaches."""
        if self._budget_end is None:
            return
        now = self._clock()
        if self._clock_mark is None:
            if self._updates >= WARMUP_STEPS:
                self._clock_mark = (now, self.n)
            return
        spent = now - self._clock_mark[0]
        if spent > 0:
            rate = (self.n - self._clock_mark[1]) / spent
            reach = self.n + rate * max(self._budget_end - now, 0.0)
            self.total = max(self.n, min(self._planned, round(reach)))

    def clear(self, nolock: bool = False) -> None:
        """Make room for a line written beside the bar: on a terminal, tqdm's way (the bar overwritten with
        spaces, then redrawn below the line); elsewhere a line break, so a log holds no line of spaces."""
        if self.disable or _is_terminal(self.fp):
            return super().clear(nolock)
        self.fp.write("\n")

    def update(self, n: float = 1) -> bool | None:
        shown = super().update(n)
        if self.disable:
            return shown
        self._updates += 1
        self._follow_time_budget()
        if self._updates in (WARMUP_STEPS, WARMUP_STEPS + TIMED_STEPS):
            if self._cuda:
                torch.cuda.synchronize()
            now, trained = self._clock(), self.n - self._left_out  # training time and its tokens, as the summary's
            if self._mark is None:
                self._mark = (now, trained)
            else:
                self._estimate((trained - self._mark[1]) / max(now - self._mark[0], 1e-9), now - self._clock_born)
        return shown

    def _estimate(self, rate: float, spent: float) -> None:
        planned = self._planned
        left = max(planned - self.n, 0) / rate
        units, per_second = self._units
        what = f"{planned:,} {units}" if self.initial == 0 else \
            f"the remaining {planned - self.initial:,} of {planned:,} {units}"
        line = f"≈ {duration_text(left + spent)} for {what} at {rate:,.0f} {per_second}/s"
        compiling = ", compiling not counted" if self._left_out else ""
        if self._time_left is not None and left + spent > self._time_left:
            reach = self.n + rate * max(self._time_left - spent, 0)
            line = (f"≈ {duration_text(self._time_left)} (the time budget) for about {reach:,.0f} of {planned:,} "
                    f"planned {units} at {rate:,.0f} {per_second}/s")
        self.write(line + f" (training time{compiling}; dev evaluations come on top)", file=sys.stderr)


def _is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no such method, or a closed file
        return False


def progress_bar(lines: list[str], planned_tokens: int, done_tokens: int, elapsed_s: float,
                 time_budget: float | None, device: torch.device, enabled: bool, clock=time.perf_counter,
                 unit: tuple[str, str] = ("tokens", "tok")) -> tqdm:
    """Print a task's start-up ``lines`` (when ``enabled``) and return the session's tqdm bar of tokens.

    The bar prints an estimate of the session's training time once it has timed
    :data:`TIMED_STEPS` steps; with a time budget its total follows the budget (``clock``: the seconds of
    training the budget counts); ``unit``: what it counts, in words and per second (:attr:`sohsm.train.task.Task.unit`).
    """
    if enabled:
        for line in lines:
            print(line, file=sys.stderr, flush=True)
    time_left = None if time_budget is None else max(time_budget - elapsed_s, 0.0)
    return _EstimatingBar(total=planned_tokens, initial=min(done_tokens, planned_tokens), unit=unit[1], units=unit,
                          unit_scale=True, dynamic_ncols=True, disable=not enabled, desc="train", smoothing=0.05,
                          time_left=time_left, cuda=device.type == "cuda", clock=clock)
