"""Fixtures shared by every test."""
import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The tests' tensors are small: one intra-op thread is faster, and far faster when another
    process is busy on the machine's cores (OpenMP workers then wait on each other)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
