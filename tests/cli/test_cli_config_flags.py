"""Flags generated from the config dataclasses: one per field, help from its comment, the real defaults, --config."""
from __future__ import annotations

import json

import pytest

from sohsm.cli.config_file import read_config_file
from sohsm.cli.config_flags import config_flags, field_comments
from sohsm.cli.main import build_parser
from sohsm.tasks.lm import DataConfig, LMConfig
from sohsm.tasks.s2s import S2SConfig
from sohsm.tasks.w2v import W2VConfig
from sohsm.train.config import OptimConfig


@pytest.mark.parametrize("config_class", [LMConfig, S2SConfig, W2VConfig])
def test_every_field_has_a_flag_with_help(config_class):
    flags = config_flags(config_class)
    paths = {f.path for f in flags}
    assert paths == set(config_class().flat()) - {"task"}
    assert all(f.help for f in flags), [f.path for f in flags if not f.help]


def test_the_flags_of_earlier_versions_keep_their_names():
    names = {f.option for f in config_flags(LMConfig)}
    for old in ("--corpus", "--data-dir", "--cache-dir", "--min-count", "--max-size", "--text-mode", "--clusters-from",
                "--clusters-format", "--clusters-cut", "--emb-size", "--hidden-size", "--layers", "--dropout",
                "--tie-weights", "--head", "--update-every", "--head-option", "--optimizer", "--lr", "--clip",
                "--weight-decay", "--lr-decay", "--lr-decay-after", "--bptt", "--batch-size", "--eval-batch-size",
                "--epochs", "--max-tokens", "--time-budget", "--eval-every", "--checkpoint-every", "--log-every",
                "--seed", "--device", "--amp", "--compile"):
        assert old in names, old
    s2s = {f.option for f in config_flags(S2SConfig)}
    for old in ("--dataset", "--symbols", "--train-pairs", "--valid-pairs", "--pairs-seed", "--extra", "--lr",
                "--weight-decay", "--clip", "--batch-size", "--eval-batch-size", "--epochs", "--device"):
        assert old in s2s, old


def test_help_comes_from_the_field_comment_and_shows_the_real_default():
    assert field_comments(OptimConfig)["weight_decay"].startswith("weight decay on the LSTMs")
    parser = build_parser()
    for task, config_class in (("lm", LMConfig), ("s2s", S2SConfig)):
        sub = parser._subparsers._group_actions[0].choices[task]._subparsers._group_actions[0].choices["train"]
        text = sub.format_help().replace("\n", " ")
        default = config_class()
        for path in ("batch_size", "epochs", "eval_every", "model.hidden_size"):
            if default.get(path) is None:  # the comment says what unset means instead
                assert "none: four times an epoch" in " ".join(text.split()), (task, path)
            else:
                shown = f"(default: {default.get(path)}"  # then ")", or "; --model transformer: ..." (the LM's)
                assert shown + ")" in " ".join(text.split()) or shown + "; --model" in " ".join(text.split()), \
                    (task, path)


def test_a_config_file_in_yaml_or_json_and_a_runs_own_config(tmp_path):
    (tmp_path / "c.yaml").write_text("data:\n  corpus: ptb\nhead:\n  name: full\nepochs: 2\n")
    assert read_config_file(str(tmp_path / "c.yaml"), LMConfig) == {"data.corpus": "ptb", "head.name": "full",
                                                                    "epochs": 2}
    full = LMConfig(data=DataConfig(corpus="ptb")).to_dict()
    (tmp_path / "config.json").write_text(json.dumps(full))
    assert read_config_file(str(tmp_path / "config.json"), LMConfig)["data.corpus"] == "ptb"
    (tmp_path / "bad.yaml").write_text("model:\n  hidden_size: big\n")
    with pytest.raises(ValueError, match="model.hidden_size must be int"):
        read_config_file(str(tmp_path / "bad.yaml"), LMConfig)
    (tmp_path / "s2s.json").write_text(json.dumps(S2SConfig().to_dict()))
    with pytest.raises(ValueError, match="'s2s' task"):
        read_config_file(str(tmp_path / "s2s.json"), LMConfig)


def test_train_from_a_config_file_with_flags_overriding_it(tmp_path, ptb_slice, small, cli, private_env, one_thread):
    config = tmp_path / "run.yaml"
    config.write_text(f"data:\n  corpus: {ptb_slice}\nhead:\n  name: two_level_frequency\nmodel:\n  hidden_size: 24\n")
    code, _, err = cli("lm", "train", "--config", config, "--run-dir", tmp_path / "a", *small, "--max-tokens", 2000)
    assert code == 0, err
    saved = json.loads((tmp_path / "a" / "config.json").read_text())
    assert saved["head"]["name"] == "two_level_frequency" and saved["model"]["hidden_size"] == 32  # small sets 32
    # the run's own config.json, accepted back as it is: the same run again
    code, _, err = cli("lm", "train", "--config", tmp_path / "a" / "config.json", "--run-dir", tmp_path / "b",
                       "--quiet")
    assert code == 0, err
    again = json.loads((tmp_path / "b" / "config.json").read_text())
    assert again == saved
    code, _, err = cli("lm", "train", "--config", config, "--run-dir", tmp_path / "c", "--hidden-size", 0)
    assert code == 2 and "--hidden-size must be >= 1" in err and not (tmp_path / "c").exists()


@pytest.mark.parametrize("text, value", [("100000", 100_000), ("1e5", 100_000), ("2.5e6", 2_500_000),
                                         ("100_000", 100_000)])
def test_an_integer_budget_may_be_written_as_a_float_is(text, value, tmp_path):
    """--max-tokens 1e5, as budgets are written; a value that is no whole number is still refused."""
    parser = build_parser(["lm"])
    args = parser.parse_args(["lm", "train", "--run-dir", "r", "--max-tokens", text, "--batch-size", text])
    assert args.max_tokens == value and args.batch_size == value
    (tmp_path / "s.yaml").write_text(f"max_tokens: {text}\nlog_every: 1.0e2\n")
    assert read_config_file(str(tmp_path / "s.yaml"), LMConfig) == {"max_tokens": value, "log_every": 100}


def test_a_budget_that_is_no_whole_number_is_refused(cli):
    code, _, err = cli("lm", "train", "--corpus", "ptb", "--head", "full", "--run-dir", "r", "--max-tokens", "2.5")
    assert code == 2 and "--max-tokens: invalid int value: '2.5'" in err


@pytest.mark.parametrize("command, flag, path, default", [
    (["s2s", "train"], "--max-size", "data.max_size", 69_000),
    (["w2v", "train"], "--row-cap", "row_cap", 4.0),
    (["lm", "train"], "--clip", "optim.clip", None),
])
def test_none_typed_for_a_flag_makes_its_field_none_even_where_the_default_is_not(command, flag, path, default):
    """``--max-size none`` used to read as "not given" (argparse's None), so s2s kept its 69,000 words."""
    from sohsm.cli.config_flags import typed_fields

    parser = build_parser()
    args = parser.parse_args([*command, "--run-dir", "r", flag, "none"])
    config_class = {"s2s": S2SConfig, "w2v": W2VConfig, "lm": LMConfig}[command[0]]
    fields = typed_fields(args, config_flags(config_class))
    assert path in fields and fields[path] is None
    assert default is None or config_class().flat()[path] == default  # the field's own default is not None
    not_given = parser.parse_args([*command, "--run-dir", "r"])
    assert path not in typed_fields(not_given, config_flags(config_class))  # not given: left out
