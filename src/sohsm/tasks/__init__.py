"""The tasks a model is trained on; each in its own package, registered with :func:`sohsm.train.task.register_task`.

A task holds together its config, its batches, its model builder, its pre-flight
checks and what loading one of its runs needs (:class:`sohsm.train.task.Task`);
the loop (:mod:`sohsm.train`) trains any of them. Importing this package
registers every task; the loop's registry does so the first time it looks a task up.
"""
from sohsm.tasks import lm, s2s, w2v  # noqa: F401  (each registers its task)
