"""A mistake a training command can see without torch or the data is refused before either is loaded: at once, in
the words the loop would use later (:func:`sohsm.cli.train_options.refuse_early`, :mod:`sohsm.train.early`)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import sohsm
from sohsm.cli.train_options import refuse_early  # noqa: F401  (the function these tests are about)
from sohsm.tasks.lm import LMConfig
from sohsm.train import early

SRC = Path(sohsm.__file__).parent.parent

#: each mistake, and the words its one line must hold
MISTAKES = [
    (["lm", "train", "--corpus", "no/such/corpus.txt", "--head", "full", "--run-dir", "r"],
     "no/such/corpus.txt: no such file or folder"),
    (["lm", "train", "--corpus", "ptbb", "--head", "full", "--run-dir", "r"], "unknown corpus 'ptbb' (did you mean"),
    (["lm", "train", "--corpus", "ptb", "--head", "full", "--run-dir", "r", "--step-graph", "on"],
     "--step-graph 'on' captures a CUDA graph, and the run's device is cpu"),
    (["lm", "train", "--corpus", "ptb", "--head", "full", "--run-dir", "r", "--tie-weights", "--emb-size", "64"],
     "--tie-weights needs --emb-size == --hidden-size, got 64 and 512"),
    (["lm", "train", "--corpus", "ptb", "--head", "full", "--run-dir", "r", "--dropout", "1.5"],
     "--dropout must be in [0, 1), got 1.5"),
    (["lm", "train", "--run-dir", "no-such-run", "--resume"], "no-such-run holds no training run to resume"),
    (["w2v", "train", "--corpus", "nowhere.txt", "--head", "full", "--run-dir", "r"],
     "nowhere.txt: no such file or folder"),
    (["s2s", "train", "--head", "full", "--run-dir", "r", "--batch-size", "0"], "--batch-size must be >= 1, got 0"),
]


def _fresh(code: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True, text=True, timeout=120)


def test_each_mistake_is_one_line_before_torch_is_imported(tmp_path):
    """In a fresh interpreter: every refusal is exit status 2 and one line, and neither torch nor numpy (a third of
    the rest of the start-up) was ever imported."""
    code = ("import contextlib, io, json, sys\nfrom sohsm.cli.main import main\nout = []\n"
            f"for argv in {[argv for argv, _ in MISTAKES]!r}:\n"
            "    err = io.StringIO()\n"
            "    with contextlib.redirect_stderr(err):\n"
            "        out.append([main(argv), err.getvalue()])\n"
            "print(json.dumps([out, sorted({'torch', 'numpy'} & set(sys.modules))]))")
    done = _fresh(code, tmp_path)
    assert done.returncode == 0, done.stderr
    results, imported = json.loads(done.stdout)
    for (argv, words), (status, err) in zip(MISTAKES, results):
        assert status == 2 and len(err.splitlines()) == 1 and words in err, (argv, err)
    assert imported == []
    assert not (tmp_path / "r").exists()


def test_a_refusal_takes_a_fraction_of_torchs_import(tmp_path):
    """From the command to its refusal in a fresh process: well under torch's import alone (about 1.5 s unloaded, more
    on a loaded machine). 0.4 s measured on a 2-core machine; the bound is generous, for a loaded test machine."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "sohsm", "lm", "train", "--corpus", "missing.txt", "--head", "full",
                           "--run-dir", "r"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    seconds = time.perf_counter() - start
    assert done.returncode == 2 and "missing.txt: no such file or folder" in done.stderr, done.stderr
    assert seconds < 5.0, f"the refusal took {seconds:.1f} s"


def test_a_resumed_runs_own_device_is_checked_from_its_config(tmp_path, cli, monkeypatch):
    """``--resume`` without ``--device``: the device the run's config.json names."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text(json.dumps({"task": "lm", "device": "cuda:3"}), encoding="utf-8")
    monkeypatch.setattr(early, "device_refusal", lambda name: f"no {name} here")
    code, _, err = cli("lm", "train", "--run-dir", str(tmp_path / "run"), "--resume")
    assert code == 2 and err.strip().endswith("no cuda:3 here"), err


@pytest.mark.parametrize("build, nodes, refused", [
    ({"cuda": False, "hip": False}, {"/dev/nvidiactl"}, True),   # a CPU-only torch: never, whatever the machine
    ({"cuda": True, "hip": False}, set(), True),                 # a CUDA torch, no NVIDIA driver's nodes
    ({"cuda": True, "hip": False}, {"/dev/nvidiactl"}, False),   # torch decides
    ({"cuda": True, "hip": False}, {"/dev/dxg"}, False),         # WSL
    ({"cuda": False, "hip": True}, {"/dev/nvidiactl"}, True),    # a ROCm torch needs AMD's node
    ({"cuda": False, "hip": True}, {"/dev/kfd"}, False),
    (None, set(), False),                                        # torch's build unknown: torch decides
])
def test_cuda_is_refused_only_where_it_surely_is_missing(build, nodes, refused, monkeypatch):
    monkeypatch.setattr(early, "torch_build", lambda: build)
    monkeypatch.setattr(early.sys, "platform", "linux")
    monkeypatch.setattr(early.os.path, "exists", lambda path: path in nodes)
    refusal = early.device_refusal("cuda:1")
    assert (refusal == "device 'cuda:1' was requested but CUDA is not available on this machine") if refused \
        else refusal is None
    assert early.device_refusal("cpu") is None


def test_the_torch_build_read_without_importing_it_is_torchs_own():
    import torch

    assert early.torch_build() == {"cuda": torch.version.cuda is not None, "hip": torch.version.hip is not None}
    if not torch.cuda.is_available():
        assert early.device_refusal("cuda") is not None or os.path.exists("/dev/nvidiactl")


@pytest.mark.parametrize("overrides", [
    {"data.corpus": "ptb", "head.name": "full"},
    {"data.corpus": "ptb", "head.name": "adaptive", "model.architecture": "transformer", "model.hidden_size": 64},
    {"data.corpus": "ptb", "head.name": "full", "model.tie_weights": True, "model.emb_size": 64,
     "model.hidden_size": 64},
])
def test_a_draft_accepts_what_a_new_run_takes(overrides):
    """The draft (no torch) is the run's config but for tying by default, which it leaves off."""
    draft, full = LMConfig.from_overrides(overrides, draft=True), LMConfig.from_overrides(overrides)
    full.model.tie_weights = draft.model.tie_weights
    assert draft == full


@pytest.mark.parametrize("overrides", [
    {"model.dropout": 1.0}, {"step_graph": "on"}, {"model.tie_weights": True, "model.emb_size": 8}, {"bptt": 0},
    {"model.architecture": "transformer", "model.hidden_size": 60, "model.attention_heads": 8},
])
def test_a_draft_refuses_what_a_new_run_refuses_in_the_same_words(overrides):
    with pytest.raises(ValueError) as full:
        LMConfig.from_overrides(overrides)
    with pytest.raises(ValueError) as draft:
        LMConfig.from_overrides(overrides, draft=True)
    assert str(draft.value) == str(full.value)
