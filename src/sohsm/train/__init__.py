"""The training loop every task shares: sessions, checkpoints, budgets, signals, distribution, progress.

The loop knows no model and no data: a task (:mod:`sohsm.tasks`) supplies them
through the interface of :class:`~sohsm.train.task.Task`.

* :mod:`sohsm.train.config`: :class:`RunConfig`, the sections every task shares (:class:`HeadConfig`,
  :class:`OptimConfig`), strict parsing and overrides.
* :mod:`sohsm.train.task`: :class:`Task` and the task registry.
* :mod:`sohsm.train.loop`: :func:`train` and :func:`resume_training`; :mod:`sohsm.train.session`: the loop
  over batches (``TrainingLoop``); :mod:`sohsm.train.state`: where a run stands; :mod:`sohsm.train.step`: one
  step (DDP, ``amp``, ``compile``).
* :mod:`sohsm.train.loading`: :func:`load_run`, one loader for the runs of every task.
* :mod:`sohsm.train.distributed`: several processes under ``torchrun``; :mod:`sohsm.train.precision`: autocast
  and fp16 loss scaling.
* :mod:`sohsm.train.evaluation`: :func:`evaluate` (ppl, cluster ppl, in-cluster ppl of a task's dev data).
* :mod:`sohsm.train.checkpoint`: the files of a run directory, atomic checkpoints; :mod:`sohsm.train.rundir`:
  a run directory between sessions.
* :mod:`sohsm.train.metrics`: ``metrics.jsonl`` (and TensorBoard when installed).
* :mod:`sohsm.train.guard`: stop signals, divergence checks; :mod:`sohsm.train.lock`: one trainer per run.
* :mod:`sohsm.train.progress`: the progress bar of a training session.
* :mod:`sohsm.train.builders`: the device, the optimizer and the run's signature.
"""
from sohsm.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "sohsm.train.builders": ("build_optimizer", "run_signature"),
    "sohsm.train.checkpoint": ("format_signature", "load_checkpoint", "save_checkpoint"),
    "sohsm.train.config": ("OPTIMIZERS", "HeadConfig", "OptimConfig", "RunConfig", "apply_overrides"),
    "sohsm.train.evaluation": ("EvalResult", "evaluate"),
    "sohsm.train.loading": ("LoadedRun", "load_run"),
    "sohsm.train.loop": ("STOP_REASONS", "TrainResult", "resume_training", "train"),
    "sohsm.train.metrics": ("MetricsLog", "read_metrics"),
    "sohsm.train.task": ("Task", "register_task", "task_named"),
})
