"""The CPU threads a run takes: the user's number, else OMP_NUM_THREADS, else the cores free at its start."""
from __future__ import annotations

import pytest
import torch

from sohsm.train import threads
from sohsm.train.threads import choose_threads, cpu_threads


@pytest.fixture
def machine(monkeypatch):
    """A machine of ``cores`` cores under a one-minute load of ``load``, without OMP_NUM_THREADS."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)

    def set_machine(cores: int, load: float) -> None:
        monkeypatch.setattr(threads, "usable_cores", lambda: cores)
        monkeypatch.setattr(threads.os, "getloadavg", lambda: (load, load, load))

    return set_machine


@pytest.mark.parametrize("cores, load, expected", [(2, 0.1, 2), (2, 1.2, 1), (2, 5.0, 1), (16, 3.6, 12)])
def test_the_free_cores_are_taken(machine, cores, load, expected):
    machine(cores, load)
    chosen, why = choose_threads(None)
    assert chosen == expected and why.startswith(f"{cores} cores, {min(round(load), cores)} busy")


def test_each_process_takes_its_share_and_the_user_decides(machine, monkeypatch):
    machine(16, 0.0)
    assert choose_threads(None, processes=4)[0] == 4 and choose_threads(None, processes=32)[0] == 1
    assert choose_threads(3) == (3, "--threads")
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    assert choose_threads(None) == (5, "OMP_NUM_THREADS") and choose_threads(2) == (2, "--threads")


def test_the_process_gets_its_threads_back(machine):
    machine(2, 0.0)
    before = torch.get_num_threads()
    with cpu_threads(1, torch.device("cpu")) as said:
        assert torch.get_num_threads() == 1 and said == "1 CPU thread (--threads)"
    assert torch.get_num_threads() == before
    with cpu_threads(1, torch.device("cuda")) as said:
        assert said is None and torch.get_num_threads() == before
