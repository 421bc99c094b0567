"""Fixtures shared by every test."""
import os

import pytest
import torch

# Without a GPU, Triton kernels (sohsm.heads.two_level.ops.triton_kernels) run under Triton's interpreter. The flag
# must be set before Triton is first imported, and torch._dynamo imports it: so here, before any test module.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Nothing is downloaded at test time: a known corpus missing from the data directory is not fetched on
# first use (the tests that need it are skipped with the reason instead, see needs.py). Set here, at
# collection, so that subprocesses the tests start inherit it.
os.environ["SOHSM_OFFLINE"] = "1"


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The tests' tensors are small: one intra-op thread is faster, and far faster when another
    process is busy on the machine's cores (OpenMP workers then wait on each other)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
