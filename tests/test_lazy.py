"""sohsm.lazy: work put off until a module is imported (torch.compile's marks on the heads' methods)."""
from __future__ import annotations

import sys

import pytest

from sohsm.lazy import after_import
from test_imports import _python


def test_a_callback_runs_once_the_module_is_imported_and_at_once_where_it_is(tmp_path, monkeypatch):
    (tmp_path / "sohsm_lazy_probe.py").write_text("VALUE = 41\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "sohsm_lazy_probe", raising=False)
    seen = []
    after_import("sohsm_lazy_probe", lambda: seen.append(sys.modules["sohsm_lazy_probe"].VALUE + 1))
    after_import("sohsm_lazy_probe", lambda: seen.append("second"))
    assert seen == []
    import sohsm_lazy_probe

    assert seen == [42, "second"] and sohsm_lazy_probe.__loader__.__class__.__name__ == "SourceFileLoader"
    assert not [f for f in sys.meta_path if type(f).__name__ == "_AfterImport" and f.module == "sohsm_lazy_probe"]
    after_import("sohsm_lazy_probe", lambda: seen.append("now"))
    assert seen[-1] == "now"
    monkeypatch.delitem(sys.modules, "sohsm_lazy_probe")


@pytest.mark.parametrize("compiler_first", [False, True])
def test_heads_import_and_build_without_the_compiler_and_are_marked_once_it_comes(compiler_first):
    """``@torch.compiler.disable`` on a method imported torch's compiler with the head (over a second); the mark
    now comes when the compiler does, before it can trace anything, whichever is imported first."""
    out = _python("import sys\n"
                  + ("import torch._dynamo\n" if compiler_first else "")
                  + "import sohsm\n"
                  "sohsm.build_head('self_organized', 8, 50, counts=list(range(50, 0, -1)))\n"
                  "sohsm.build_head('nce', 8, 50, counts=list(range(50, 0, -1)))\n"
                  "heavy = ('triton', 'transformers', 'matplotlib', 'numba', 'scipy', 'sympy')\n"
                  "print(sorted({m.split('.')[0] for m in sys.modules if m.split('.')[0] in heavy}\n"
                  "             | {m for m in sys.modules if m == 'torch._dynamo'}))\n"
                  "import torch._dynamo\n"
                  "from sohsm.heads.two_level.softmax import TwoLevelSoftmax\n"
                  "from sohsm.heads.sampled import NCESoftmax\n"
                  "print([getattr(m, '_torchdynamo_disable', False) for m in (TwoLevelSoftmax._score_eagerly,\n"
                  "                                                          NCESoftmax.noise_samples)])")
    loaded, marked = out.strip().splitlines()
    if not compiler_first:  # (the compiler itself imports triton and sympy)
        assert loaded == "[]", loaded
    assert marked == "[True, True]"
