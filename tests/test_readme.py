"""Every Python example of README.md and of the library's pages (docs/library.md, docs/hugging-face.md) runs, the
interface table says what the heads return, README's commands name commands and options that exist, and its "Your
own corpus" says what the loader does."""
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from needs import HF_HOW, need_packages
from sohsm import build_head, head_names

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
LIBRARY, HUGGING_FACE = ROOT / "docs" / "library.md", ROOT / "docs" / "hugging-face.md"
#: (page, source) of every Python example of README and the library's pages
ALL_EXAMPLES = [(page, source) for page in (README, LIBRARY, HUGGING_FACE)
                for source in re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)]
#: the examples of a head in a Hugging Face model (the hf extra), each checked by what it shows
HF_EXAMPLES = [source for _, source in ALL_EXAMPLES if "import sohsm.hf" in source]
EXAMPLES = [(page, source) for page, source in ALL_EXAMPLES if "import sohsm.hf" not in source]


def test_readme_has_examples():
    assert [s for page, s in EXAMPLES if page == README], "README.md lost its Python example"
    assert [s for page, s in EXAMPLES if page == LIBRARY and "TransformerLM" in s], \
        "docs/library.md lost its transformer example"
    assert len([s for page, s in ALL_EXAMPLES if page == HUGGING_FACE and "import sohsm.hf" in s]) == 2, \
        "docs/hugging-face.md lost its Hugging Face examples (a plain loop, the Trainer)"


@pytest.mark.parametrize("page, source", EXAMPLES, ids=[f"{page.name}-{i}" for i, (page, _) in enumerate(EXAMPLES)])
def test_readme_example_runs(page, source):
    namespace: dict = {}
    exec(compile(source, str(page), "exec"), namespace)
    assert namespace["log_probs"].logsumexp(1).abs().max() < 1e-4
    assert (namespace["next_words"] == namespace["log_probs"].argmax(1)).all()
    output, target = namespace["output"], namespace["target"]
    assert output.shape == (target.numel(),) and output.view_as(target).shape == target.shape


@pytest.mark.parametrize("source", HF_EXAMPLES, ids=["loop", "trainer"][: len(HF_EXAMPLES)])
def test_readme_hugging_face_example_runs(source, tmp_path, monkeypatch):
    """Each runs where it writes (its own folder); the model it ends with has the head back from disk; the plain
    loop's greedy tokens are the argmax of its log-probabilities, the Trainer's head re-clustered."""
    need_packages("transformers", "accelerate", how=HF_HOW)
    import sohsm.hf

    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(source, str(HUGGING_FACE), "exec"), namespace)
    loaded = sohsm.hf.head_of(namespace["model"])
    # on a GPU machine the Trainer moved the head it trained to CUDA, and the head read back from disk is on the CPU
    assert type(loaded) is type(namespace["head"])
    assert torch.equal(loaded.assignment.cpu(), namespace["head"].assignment.cpu())
    if "HeadCallback" in source:
        assert [record["step"] for record in namespace["head"].history] == [4, 8, 12, 16]
    else:
        assert namespace["log_probs"].logsumexp(1).abs().max() < 1e-4
        assert (namespace["next_words"] == namespace["log_probs"].argmax(1)).all()


@pytest.mark.parametrize("source", HF_EXAMPLES, ids=["loop", "trainer"][: len(HF_EXAMPLES)])
def test_readme_hugging_face_example_runs_without_a_warning(source, tmp_path):
    """Pasted into a fresh interpreter, an example prints no warning: transformers said its small vocabulary's
    special ids were out of range and that generate had no attention mask, torch that memory was pinned without a
    GPU. Its progress bars and the Trainer's closing record are what it shows."""
    need_packages("transformers", "accelerate", how=HF_HOW)
    (tmp_path / "example.py").write_text(source)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(README.parent / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    said = [line for line in re.split(r"[\r\n]", done.stdout + done.stderr)
            if re.search(r"warn|\[transformers\]|unexpected behavior", line, flags=re.I)]
    assert not said, said


def test_the_table_says_output_comes_back_flattened():
    row = next(line for line in LIBRARY.read_text().splitlines() if line.startswith("| `head(hidden, target)`"))
    assert "`[*, d]`" in row and "flattened, `[prod(*)]`" in row


@pytest.mark.parametrize("name", [name for name in head_names() if name != "tree_file"])  # tree_file: a file
@pytest.mark.parametrize("training", [True, False])
def test_every_head_flattens_its_output_as_the_table_says(name, training):
    d, n_words = 32, 40
    head = build_head(name, d, n_words, counts=torch.arange(n_words, 0, -1))
    optimizer = torch.optim.SGD(head.parameters(), lr=0.1)  # attach holds it weakly: keep it alive
    head.attach(optimizer)
    head.train(training)
    output, loss = head(torch.randn(2, 3, d), torch.randint(0, n_words, (2, 3)))
    assert output.shape == (6,) and loss.shape == ()



def test_the_set_up_is_the_core_and_an_extra_per_need():
    """`pip install -e .` is enough for the core; Triton, Numba, gensim, transformers, quicktok and pytest come with
    the extra that needs them, and README's first screen gives the two set-up commands, which work as pasted (no
    variable a new shell leaves unset)."""
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((README.parent / "pyproject.toml").read_text())["project"]
    names = lambda requirements: {re.split(r"[<>=\[ ]", r)[0] for r in requirements}  # noqa: E731
    assert not names(project["dependencies"]) & {"triton", "numba", "gensim", "pytest", "scipy", "transformers",
                                                 "tokenizers", "accelerate", "quicktok-v1"}
    extras = project["optional-dependencies"]
    assert names(extras["gpu"]) == {"triton"} and names(extras["w2v"]) == {"numba", "gensim"}
    assert names(extras["hf"]) == {"transformers", "tokenizers", "accelerate"}
    assert names(extras["tokenizers"]) == {"quicktok-v1"}
    assert "pytest>=7" in extras["dev"] and "sohsm[gpu,w2v,hf,tokenizers]" in extras["dev"]
    first_screen = README.read_text().split("## Which head to pick", 1)[0]
    set_up = first_screen.split("```bash\n", 1)[1].split("```", 1)[0]
    assert re.search(r"^pip install torch==2\.13\.0\s", set_up, flags=re.M), set_up
    assert re.search(r"^pip install -e \.\s", set_up, flags=re.M), set_up
    assert "$" not in set_up.split("#")[0] and all("$" not in line.split("#")[0] for line in set_up.splitlines())


def test_the_op_counts_readme_and_gpu_md_quote_are_those_of_step_ops_md():
    """which-head.md's, gpu.md's and (where they quote them) README's and the guides' (docs/*.md: scale.md) op counts
    of a step are step-ops.md's (written by benchmarks/step_ops.py): the page and its quotes cannot drift apart."""
    docs = README.parent / "docs" / "benchmarks"
    rows = {}
    for line in (docs / "step-ops.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| `") and len(cells) >= 6:
            rows[cells[0].strip("`")] = cells
    default, every, adaptive, full = (rows["self_organized --head-option backend=triton"],
                                      rows["self_organized --head-option backend=triton --head-option div_value=null"],
                                      rows["adaptive"], rows["full"])
    quote = f"the default {default[1]} ops against adaptive softmax's {adaptive[1]} and the full softmax's {full[1]}"
    which_head = README.parent / "docs" / "results" / "which-head.md"
    assert quote in " ".join(which_head.read_text().split())
    quoting = [page for page in (README, *sorted((ROOT / "docs").glob("*.md")))
               if "ops against adaptive softmax's" in " ".join(page.read_text().split())]
    assert ROOT / "docs" / "scale.md" in quoting, "docs/scale.md no longer quotes the op counts of a step"
    for page in quoting:
        assert quote in " ".join(page.read_text().split()), page.relative_to(ROOT)
    gpu = " ".join((docs / "gpu.md").read_text().split())
    assert (f"the default {default[1]} ops a step, every word at d {every[1]}, adaptive softmax {adaptive[1]}, "
            f"the full softmax {full[1]}") in gpu
    assert f"{default[-1]} a step captured as one graph" in gpu


# ---- README's commands, and its "Your own corpus" ------------------------------------------------------------------


def _parser():
    from sohsm.cli.main import build_parser

    return build_parser()


def _children(parser) -> dict:
    import argparse

    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return actions[0].choices if actions else {}


def command_problems(code: str, parser) -> list[str]:
    """What in ``code`` (a ``sohsm`` command line, or an inline ``sohsm A | B`` of alternatives) names a command or
    an option that ``sohsm`` lacks."""
    groups, current = [], []
    for word in shlex.split(code.replace("|", " | "), comments=True)[1:]:
        if word == "|":
            groups.append(current)
            current = []
        else:
            current.append(word)
    groups.append(current)
    problems, chain = [], [parser]
    for word in groups[0]:
        if word not in _children(chain[-1]):
            break
        chain.append(_children(chain[-1])[word])
    if len(chain) == 1 and not (groups[0] and groups[0][0].startswith("-") and len(groups) == 1):
        return [f"«{code}»: no command {groups[0][:1]}"]
    found = [(chain[-1], groups[0])]  # `sohsm --help`: the options of sohsm itself
    for group in groups[1:]:  # alternatives: siblings of the deepest subcommand named
        siblings = _children(chain[-2])
        if not group or group[0] not in siblings:
            problems.append(f"«{code}»: no subcommand {group[:1]} beside {chain[-1].prog!r}")
        else:
            found.append((siblings[group[0]], group))
    for command, words in found:
        problems += [f"«{code}»: {command.prog} has no option {word.split('=')[0]}" for word in words
                     if word.startswith("--") and word.split("=")[0] not in command._option_string_actions]
    return problems


def readme_commands(text: str) -> list[str]:
    """The ``sohsm`` command lines of markdown ``text``'s bash blocks (continuation lines joined) and its inline code
    spans that start with ``sohsm `` and name a command (not a placeholder such as COMMAND)."""
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        lines += [line.strip() for line in block.replace("\\\n", " ").splitlines() if line.strip().startswith("sohsm ")]
    spans = [span for span in re.findall(r"`(sohsm [^`]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
             if not span.split()[1].isupper()]
    return lines + spans


GUIDES = sorted((ROOT / "docs").glob("*.md"))


@pytest.mark.parametrize("page", [README, *GUIDES], ids=[p.name for p in [README, *GUIDES]])
def test_readme_commands_name_commands_and_options_that_exist(page):
    """README's and the guides' (docs/*.md) `sohsm` commands, in bash blocks and inline."""
    commands = readme_commands(page.read_text())
    if page == README:
        assert len(commands) >= 15, commands
    parser = _parser()
    problems = [problem for code in commands for problem in command_problems(code, parser)]
    assert not problems, "\n".join(problems)


def test_the_command_check_finds_a_missing_command_subcommand_or_option():
    parser = _parser()
    assert command_problems("sohsm lm train --corpus ptb --run-dir r", parser) == []
    assert command_problems("sohsm w2v train | export | neighbours", parser) == []
    assert command_problems("sohsm lm train --corpus ptb --no-such-option 1", parser)
    assert command_problems("sohsm lm train | evaluate", parser)
    assert command_problems("sohsm nonsense --help", parser)
    assert command_problems("sohsm --help", parser) == [] and command_problems("sohsm --no-such-option", parser)


def _section(title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", README.read_text(), flags=re.M | re.S)
    assert match, f"README.md has no '## {title}' section"
    return match.group(1)


def test_your_own_corpus_names_options_of_lm_train():
    """Every option the section names (outside its commands) is one of `sohsm lm train`'s."""
    from sohsm.cli.main import subcommand_parser

    train = subcommand_parser(_parser(), ["lm", "train"])
    text = re.sub(r"```.*?```", "", _section("Your own corpus"), flags=re.S)
    named = set(re.findall(r"`(--[a-z-]+)", text))
    assert {"--corpus", "--max-size", "--min-count", "--text-mode", "--tokenizer", "--data-dir",
            "--cache-dir"} <= named, named
    assert not named - set(train._option_string_actions), named - set(train._option_string_actions)
    assert "$SOHSM_DATA" in text and "$SOHSM_CACHE" in text


def test_your_own_corpus_says_what_the_loader_does(tmp_path):
    """The section's rules, as it words them, and the loader doing each: a file's last 10% of lines are valid and
    there is no test; a folder's files are found by name (hidden ones ignored); <eos> after every line, an empty
    line a lone <eos>; the vocabulary keeps every training word unless capped, the cap counting <unk> and <eos>;
    words train lacks and a literal <unk> are <unk>."""
    from sohsm.data.loading import load_corpus

    said = " ".join(_section("Your own corpus").split())
    for claim in ("its last 10% of lines are the dev split (`valid`), the rest `train`; there is no `test`",
                  "one file whose name contains `train`, and optionally one whose name contains `valid` (or `dev`) "
                  "and one with `test` (hidden files are ignored;",
                  "`<eos>` is added after each line (an empty line is a lone `<eos>`)",
                  "By default your text keeps every word it has; `--max-size N` caps it at N entries (`<unk>` and "
                  "`<eos>` among them), keeping the most frequent",
                  "Cut words, words that `valid` or `test` have and `train` lacks, and a literal `<unk>` in your text "
                  "all become `<unk>`"):
        assert claim in said, claim
    cache = tmp_path / "cache"
    lines = [f"w{i} common" for i in range(18)] + ["", "late <unk>"]  # 20 lines: the last 2 are valid
    (tmp_path / "mine.txt").write_text("\n".join(lines) + "\n")
    corpus = load_corpus(tmp_path / "mine.txt", cache_dir=cache, use_cache=False)
    words = lambda ids: [corpus.vocab.itos[i] for i in ids.tolist()]  # noqa: E731
    assert corpus.test is None and words(corpus.train)[-3:] == ["w17", "common", "<eos>"]
    assert words(corpus.valid) == ["<eos>", "<unk>", "<unk>", "<eos>"]          # "late" is not in train
    assert len(corpus.vocab) == 18 + 3                                           # w0..w17, common, <eos>, <unk>

    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "my-Train.txt").write_text("a b\nb c\n")
    (folder / "dev.txt").write_text("c a\n")
    (folder / "test.txt").write_text("b\n")
    (folder / ".valid.txt").write_text("hidden\n")
    corpus = load_corpus(folder, cache_dir=cache, use_cache=False, max_size=3)
    assert [corpus.vocab.itos[i] for i in corpus.valid.tolist()] == ["<unk>", "<unk>", "<eos>"]
    assert sorted(corpus.vocab.itos) == ["<eos>", "<unk>", "b"] and corpus.test.numel() == 2

