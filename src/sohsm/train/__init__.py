"""Training language models with any head: config, loop, evaluation, checkpoints, and using finished runs.

* :mod:`sohsm.train.config`: :class:`TrainConfig` and its sections, strict overrides.
* :mod:`sohsm.train.loop`: :func:`train` and :func:`resume_training`; :mod:`sohsm.train.session`: the loop
  over batches; :mod:`sohsm.train.step`: one step (DDP, ``amp``, ``compile``).
* :mod:`sohsm.train.distributed`: several processes under ``torchrun``; :mod:`sohsm.train.precision`: autocast
  and fp16 loss scaling.
* :mod:`sohsm.train.evaluation`: :func:`evaluate` (ppl, cluster ppl, in-cluster ppl).
* :mod:`sohsm.train.checkpoint`: the files of a run directory, atomic checkpoints.
* :mod:`sohsm.train.metrics`: ``metrics.jsonl`` (and TensorBoard when installed).
* :mod:`sohsm.train.guard`: stop signals, divergence checks; :mod:`sohsm.train.lock`: one trainer per run;
  :mod:`sohsm.train.preflight`: the checks made before a run directory is written.
* :mod:`sohsm.train.run`: :func:`load_run`, :func:`evaluate_run`, :func:`generate_text`.
* :mod:`sohsm.train.clusters`: :func:`cluster_table` (the paper's Table 3).
* :mod:`sohsm.train.progress`: the start-up lines and progress bar of a training session.
* :mod:`sohsm.train.report`: :func:`summarise_run`, :func:`results_table` (a run's row in a results table).
* :mod:`sohsm.train.compare`: :func:`plan_comparison`, :func:`run_comparison` (several heads, same settings).
"""
from sohsm.train.builders import build_model_and_head, build_optimizer, run_signature
from sohsm.train.checkpoint import format_signature, load_checkpoint, save_checkpoint
from sohsm.train.clusters import ClusterSummary, cluster_of_word, cluster_table
from sohsm.train.compare import PlannedRun, RunPlan, plan_comparison, run_comparison
from sohsm.train.config import (
    OPTIMIZERS,
    RESUMABLE_FIELDS,
    DataConfig,
    HeadConfig,
    ModelConfig,
    OptimConfig,
    TrainConfig,
    apply_overrides,
)
from sohsm.train.evaluation import EvalResult, evaluate
from sohsm.train.loop import STOP_REASONS, TrainResult, resume_training, train
from sohsm.train.metrics import MetricsLog, read_metrics
from sohsm.train.report import RunSummary, results_table, summarise_run
from sohsm.train.run import Generation, LoadedRun, evaluate_run, generate_text, load_run

__all__ = [
    "ClusterSummary",
    "DataConfig",
    "EvalResult",
    "Generation",
    "HeadConfig",
    "LoadedRun",
    "MetricsLog",
    "ModelConfig",
    "OPTIMIZERS",
    "OptimConfig",
    "PlannedRun",
    "RESUMABLE_FIELDS",
    "RunPlan",
    "RunSummary",
    "STOP_REASONS",
    "TrainConfig",
    "TrainResult",
    "apply_overrides",
    "build_model_and_head",
    "build_optimizer",
    "cluster_of_word",
    "cluster_table",
    "evaluate",
    "evaluate_run",
    "format_signature",
    "generate_text",
    "load_checkpoint",
    "load_run",
    "plan_comparison",
    "read_metrics",
    "results_table",
    "resume_training",
    "run_comparison",
    "run_signature",
    "save_checkpoint",
    "summarise_run",
    "train",
]
