"""Time to train and allocation cost of a run of N tokens.

The arithmetic (no model, only bookkeeping):

    steps       = ceil(tokens / (global_batch × seq_len))
    seconds     = steps × predicted step time
    days        = seconds / 86,400
    node-hours  = nodes × seconds / 3,600, nodes = ceil(GPUs / devices per node)
    GPU-hours   = GPUs × seconds / 3,600

Centres charge allocations in node-hours of whole nodes (OLCF and NERSC charge every node of a
job for its elapsed time), hence the ceiling on nodes. The step count is a ceiling because the
last optimizer step consumes a whole global batch.
"""

from __future__ import annotations

import math
import re
import warnings
from typing import Any

from pydantic import Field, NonNegativeFloat, PositiveInt

from axoplan.errors import AxoplanError
from axoplan.inputs.plausible import TRAINING_TOKENS, PlausibilityWarning
from axoplan.inputs.schema import Frozen
from axoplan.space.layout import nodes_needed

__all__ = ["parse_tokens", "RunCost", "TrainingCost", "run_cost", "steps_for", "format_tokens", "check_max_nodes",
           "within_node_hours", "budget_checks", "cost_line", "describe_cost", "rows_within_node_hours"]

_SUFFIX = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12}
_TOKENS = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([KMBGT]?)\s*$", re.IGNORECASE)
_S_PER_DAY = 86_400.0
_S_PER_HOUR = 3_600.0


def parse_tokens(text: str) -> int:
    """A token count from `300B`, `1.5T`, `2e12` or `4096` (K, M, B/G, T are powers of 1,000)."""
    m = _TOKENS.match(text)
    if m is None:
        raise AxoplanError(f"--tokens {text!r} is not a token count; write e.g. 300B, 1.5T or 2e12")
    value = float(m.group(1)) * _SUFFIX[m.group(2).upper()]
    if value < 1:  # 1e400 is infinite: the check below calls it more than any run could use
        raise AxoplanError(f"--tokens {text!r} must be at least one token; write e.g. 300B, 1.5T or 2e12")
    most, usual = TRAINING_TOKENS.hard[1], TRAINING_TOKENS.usual[1]
    if value > most:
        raise AxoplanError(f"--tokens {text} is more than any training run could use (at most "
                           f"{format_tokens(round(most))}; the largest published runs used about 40T)")
    if value > usual:
        warnings.warn(f"--tokens {text} is more than twice the largest published training runs (about 40T); "
                      "check it", PlausibilityWarning, stacklevel=2)
    return round(value)


def format_tokens(tokens: int) -> str:
    """Short label: 300B, 1.5T."""
    for suffix, scale in (("T", 10**12), ("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if tokens >= scale:
            return f"{tokens / scale:g}{suffix}"
    return str(tokens)


class RunCost(Frozen):
    """What training `tokens` tokens with one layout costs."""

    tokens: PositiveInt
    steps: PositiveInt
    nodes: PositiveInt
    gpus: PositiveInt
    seconds: NonNegativeFloat

    @property
    def days(self) -> float:
        return self.seconds / _S_PER_DAY

    @property
    def node_hours(self) -> float:
        return self.nodes * self.seconds / _S_PER_HOUR

    @property
    def gpu_hours(self) -> float:
        return self.gpus * self.seconds / _S_PER_HOUR

    def record(self) -> TrainingCost:
        """The figures written into an exported launch config."""
        return TrainingCost(tokens=self.tokens, steps=self.steps, nodes=self.nodes, seconds=self.seconds,
                            days=self.days, node_hours=self.node_hours, gpu_hours=self.gpu_hours)


class TrainingCost(Frozen):
    """What a launch config records about training `tokens` tokens with its layout (from :class:`RunCost`)."""

    tokens: PositiveInt
    steps: PositiveInt = Field(description="Optimizer steps: ceil(tokens / (global batch x sequence length)).")
    nodes: PositiveInt
    seconds: NonNegativeFloat = Field(description="steps x predicted seconds per step (no start-up margin).")
    days: NonNegativeFloat
    node_hours: NonNegativeFloat
    gpu_hours: NonNegativeFloat


def steps_for(tokens: int, global_batch: int, seq_len: int) -> int:
    """Optimizer steps that consume `tokens` tokens: ceil(tokens / (global batch x sequence length))."""
    return math.ceil(tokens / (global_batch * seq_len))


def run_cost(tokens: int, global_batch: int, seq_len: int, step_time_s: float, gpus: int,
             devices_per_node: int) -> RunCost:
    """Days, node-hours and GPU-hours of `tokens` tokens at `step_time_s` seconds per step."""
    steps = steps_for(tokens, global_batch, seq_len)
    nodes = nodes_needed(gpus, devices_per_node)
    return RunCost(tokens=tokens, steps=steps, nodes=nodes, gpus=gpus, seconds=steps * step_time_s)


def check_max_nodes(gpus: int, devices_per_node: int, max_nodes: int) -> None:
    """Refuse a GPU count needing more than `max_nodes` nodes, naming the largest that fits."""
    nodes = nodes_needed(gpus, devices_per_node)
    if nodes > max_nodes:
        raise AxoplanError(f"--gpus {gpus} needs {nodes} nodes but --max-nodes is {max_nodes}; "
                           f"the largest GPU count that fits is --gpus {max_nodes * devices_per_node}")


def within_node_hours(costs: list[RunCost], max_node_hours: float) -> int:
    """How many of `costs` (fastest first, one GPU count) fit the budget; error if none does.

    At one GPU count node-hours grow with step time, so the rows that fit are a prefix.
    """
    fits = sum(1 for c in costs if c.node_hours <= max_node_hours)
    if fits == 0 and costs:
        best = min(costs, key=lambda c: c.node_hours)
        raise AxoplanError(f"no feasible layout fits --max-node-hours {max_node_hours:g}; the cheapest feasible "
                           f"choice needs {best.node_hours:,.0f} node-hours ({best.days:.1f} days on "
                           f"{best.nodes} nodes); raise --max-node-hours or train fewer --tokens")
    return fits


def budget_checks(tokens: str | None, gpus: int, devices_per_node: int, max_nodes: int | None,
                  max_node_hours: float | None) -> int | None:
    """Parse --tokens and apply --max-nodes; --max-node-hours needs --tokens."""
    if max_node_hours is not None and tokens is None:
        raise AxoplanError("--max-node-hours needs --tokens (the run whose node-hours are counted), e.g. --tokens 300B")
    if max_nodes is not None:
        check_max_nodes(gpus, devices_per_node, max_nodes)
    return None if tokens is None else parse_tokens(tokens)


def cost_line(result: Any, index: int, tokens: int) -> str:
    """One line: what training `tokens` tokens with candidate `index` of a ranking costs."""
    c = run_cost(tokens, result.options.global_batch, result.options.seq_len,
                 float(result.column("t_step_s")[index]), result.world_size, result.machine.devices_per_node)
    return describe_cost(c)


def describe_cost(c: RunCost | TrainingCost) -> str:
    """``time to train 300B tokens: 71,526 steps, 8.3 days on 4096 nodes = 816,123 node-hours (...)``."""
    return (f"time to train {format_tokens(c.tokens)} tokens: {c.steps:,} steps, {c.days:.1f} days on {c.nodes} "
            f"nodes = {c.node_hours:,.0f} node-hours ({c.gpu_hours:,.0f} GPU-hours)")


def rows_within_node_hours(result: Any, tokens: int, max_node_hours: float) -> int:
    """How many of the fastest feasible rows fit `max_node_hours` (an error naming the cheapest if none)."""
    t_step_s = result.column("t_step_s")
    feasible = [int(i) for i in result.order[:result.num_feasible]]
    costs = [run_cost(tokens, result.options.global_batch, result.options.seq_len, float(t_step_s[i]),
                      result.world_size, result.machine.devices_per_node) for i in feasible]
    return within_node_hours(costs, max_node_hours)

