"""Every Python example in README.md runs."""
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
EXAMPLES = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_examples():
    assert EXAMPLES, "README.md lost its Python examples"


@pytest.mark.parametrize("source", EXAMPLES)
def test_readme_example_runs(source):
    namespace: dict = {}
    exec(compile(source, str(README), "exec"), namespace)
    assert namespace["log_probs"].logsumexp(1).abs().max() < 1e-4
    assert (namespace["next_words"] == namespace["log_probs"].argmax(1)).all()

