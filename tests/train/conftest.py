"""One torch thread for these small tests: tiny tensors gain nothing from a second thread, and on a busy
2-core machine two threads make them many times slower."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
