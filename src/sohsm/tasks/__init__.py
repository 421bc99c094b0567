"""The tasks a model is trained on; each in its own package, registered with :func:`sohsm.train.task.register_task`.

A task holds together its config, its batches, its model builder, its pre-flight
checks and what loading one of its runs needs (:class:`sohsm.train.task.Task`);
the loop (:mod:`sohsm.train`) trains any of them. :func:`import_tasks` registers every task; the loop's
registry calls it the first time it looks a task up. Importing this package imports none of them (nor torch):
a command's ``--help`` reads a task's config alone.
"""
import importlib

#: the module of each task that registers it
TASK_MODULES = ("sohsm.tasks.lm.task", "sohsm.tasks.s2s.task", "sohsm.tasks.w2v.task")


def import_tasks() -> None:
    """Import every task's module, which registers it (:func:`sohsm.train.task.register_task`)."""
    for module in TASK_MODULES:
        importlib.import_module(module)
