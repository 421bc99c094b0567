"""benchmarks/tuning.py: every head gets the same stages, each choice is the lowest dev perplexity of the stage, the
final runs are paired seed by seed and worded by what the seeds show."""
import json
import math
from pathlib import Path

import pytest

from benchmark_scripts import load_script

tuning = load_script("tuning")


def _keep(folder: Path, head: str, seed: int, setting: dict, dev: float, test: float | None = None) -> None:
    folder.mkdir(parents=True)
    records = [{"kind": "eval", "split": "valid", "step": 5, "ppl": dev * 1.1},
               {"kind": "eval", "split": "valid", "step": 10, "ppl": dev}]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (folder / "setting.json").write_text(json.dumps({"head": head, "seed": seed, **setting}))
    if test is not None:
        (folder / "test.json").write_text(json.dumps({"ppl": test}))


def _tune(results: Path, head: str, scores: list[list[float]]) -> None:
    """Keep the stage runs of ``head`` with the given dev perplexities, stage by stage, as ``tune`` would."""
    chosen: dict = {}
    scores = iter(scores)
    for _, stage in tuning._stages_from(head):
        settings = stage(chosen)
        if not settings:  # stage A2 where stage A chose no edge
            continue
        stage_scores = next(scores, None)
        if stage_scores is None:
            return
        for setting, score in zip(settings, stage_scores):
            folder = results / "ptb" / "tune" / head / tuning.setting_name(setting)
            if not folder.exists():
                _keep(folder, head, 1, setting, score)
        chosen = settings[stage_scores.index(min(stage_scores))]


def test_every_head_has_the_same_stage_b_and_its_grid_first():
    for head in tuning.HEADS:
        grid, warmups, starts = tuning.stages(head)
        assert len(grid) == max(1, math.prod(len(v) for v in tuning.GRID[head].values()))
        assert [s["warmup"] for s in warmups] == [30, 0, 100] and [s["init_range"] for s in starts] == [0.1, 0.0625]
        # the defaults of stage B name no folder of their own: that run is the previous stage's choice
        assert tuning.setting_name({"warmup": 30, "init_range": 0.1}) == "default"


def test_a_setting_becomes_the_flags_it_names():
    flags = tuning.command("adaptive", "wikitext-2", {"cutoffs": "wide", "div_value": 2, "warmup": 0}, 3)
    assert flags[flags.index("--head") + 1] == "adaptive" and "cutoffs=[3328,13311]" in flags
    assert "div_value=2" in flags and flags[flags.index("--warmup") + 1] == "0" and flags[-1] == "3"
    so = tuning.command("self_organized", "ptb", {"div_value": None, "shortlist": 4}, 1)
    assert "div_value=null" in so and "shortlist=400" in so  # pinned: the vocabulary rule would add nothing unasked
    default = tuning.command("two_level_frequency", "ptb", {"n_clusters": 1, "div_value": None}, 1)
    assert ("--head-option" not in default and "--tie-weights" in default
            and "1" in default[default.index("--epochs") + 1])


def test_each_stage_starts_from_the_previous_choice(tmp_path):
    # stage A chose div_value=2, its grid's edge: stage A2 tries div_value=1 from there (it lost)
    _tune(tmp_path, "adaptive", [[150.0, 140.0, 145.0, 160.0], [140.0, 141.0], [140.0, 138.0, 141.0], [138.0, 139.0]])
    assert (tmp_path / "ptb" / "tune" / "adaptive" / "cutoffs=text8,div_value=1").is_dir()
    chosen = tuning._chosen_on("adaptive", "ptb", tmp_path)
    assert chosen == {"cutoffs": "text8", "div_value": 2, "warmup": 0, "init_range": 0.1}
    assert (tmp_path / "ptb" / "tune" / "adaptive" / "cutoffs=text8,div_value=2,warmup=0,init_range=0.0625").is_dir()
    # an unfinished stage chooses nothing
    _tune(tmp_path, "full", [[100.0], [101.0, 99.0]])
    assert tuning._chosen_on("full", "ptb", tmp_path) is None


def test_a_choice_at_the_grids_edge_is_tried_past_it_and_may_move():
    # adaptive softmax's choice on PTB: the widest cutoffs and the smallest div_value of its grid
    past = tuning.past_edge("adaptive", {"cutoffs": "wide", "div_value": 2})
    assert past == [{"cutoffs": "wide", "div_value": 2}, {"cutoffs": "wide", "div_value": 1},
                    {"cutoffs": "wider", "div_value": 2}, {"cutoffs": "wider", "div_value": 1}]
    assert tuning.past_edge("adaptive", {"cutoffs": "text8", "div_value": 4}) == []   # no edge: no stage A2
    assert tuning.past_edge("self_organized", {"div_value": 4, "shortlist": 4}) == []  # no values past its grid
    flags = tuning.command("adaptive", "ptb", {"cutoffs": "wider", "div_value": 1}, 1)
    assert "cutoffs=[2000,6000]" in flags and "div_value=1" in flags


def test_stage_a2_can_move_the_choice_and_stage_b_starts_from_it(tmp_path):
    _tune(tmp_path, "adaptive", [[150.0, 140.0, 145.0, 139.0], [139.0, 137.0, 138.0, 140.0],
                                 [137.0, 138.0, 139.0], [137.0, 136.0]])
    chosen = tuning._chosen_on("adaptive", "ptb", tmp_path)
    assert chosen == {"cutoffs": "wide", "div_value": 1, "warmup": 30, "init_range": 0.0625}
    # an unfinished stage A2 chooses nothing (the edge's own run is not enough)
    (tmp_path / "ptb" / "tune" / "adaptive" / "cutoffs=wider,div_value=1" / "setting.json").unlink()
    assert tuning._chosen_on("adaptive", "ptb", tmp_path) is None


def test_a_corpus_not_tuned_takes_the_choice_of_the_nearest_tuned_vocabulary(tmp_path):
    _tune(tmp_path, "full", [[100.0], [101.0, 99.0, 102.0], [98.0, 97.0]])
    setting, corpus = tuning.choice("full", "text8-small", tmp_path)
    assert corpus == "ptb" and setting == {"warmup": 0, "init_range": 0.0625}
    assert tuning.choice("adaptive", "ptb", tmp_path) is None


def test_the_final_table_pairs_seeds_and_words_the_claim_by_them(tmp_path):
    _tune(tmp_path, "full", [[100.0], [100.0, 101.0, 102.0], [100.0, 101.0]])
    tests = {"full": (100.0, 110.0, 90.0), "self_organized": (99.0, 112.0, 89.0)}
    for head, values in tests.items():
        for seed, test in zip((2, 3, 4), values):
            _keep(tmp_path / "ptb" / "final" / f"seed-{seed}" / head, head, seed, {}, test * 1.05, test)
    summary = tuning.summarize(tmp_path)
    final = summary["final"]["ptb"]
    assert final["heads"]["self_organized"]["mean"] == pytest.approx(100.0)
    assert final["heads"]["full"]["metric"] == "test"
    pair = final["pairs"]["self_organized vs full"]
    assert (pair["lower"], pair["higher"], pair["seeds"]) == (2, 1, 3)
    assert pair["low_pct"] == -1.11 and pair["high_pct"] == 1.82
    words = tuning._words(pair, "self_organized", "full")
    assert words.startswith("`self_organized` against `full`: lower on 2 of 3 seeds, mean ")
    assert summary["tuning"]["ptb"]["full"]["chosen"] == "default"
    text = tuning.report(tmp_path / "tuning.md", tmp_path)
    assert "| `self_organized` | `default` | 99.00 | 112.00 | 89.00 | 100.00 |" in text
    assert "p " not in text.split("## Each head")[1]  # no p-value from three seeds


def test_the_report_says_what_stage_a2_ran_and_whether_the_choice_moved(tmp_path):
    _tune(tmp_path, "adaptive", [[150.0, 140.0, 145.0, 139.0], [139.0, 141.0]])
    words = tuning._past_edge_words(tmp_path)
    assert len(words) == 1 and "`cutoffs=wide,div_value=2` (139.00 dev)" in words[0]
    assert "`cutoffs=wide,div_value=1` 141.00" in words[0] and "not run: `cutoffs=wider,div_value=2`" in words[0]
    for name, dev in (("cutoffs=wider,div_value=2", 142.0), ("cutoffs=wider,div_value=1", 143.0)):
        _keep(tmp_path / "ptb" / "tune" / "adaptive" / name, "adaptive", 1, {}, dev)
    assert tuning._past_edge_words(tmp_path)[0].endswith("each above the choice, which stands.")
    _keep(tmp_path / "ptb" / "tune" / "adaptive" / "cutoffs=wide,div_value=3", "adaptive", 1, {}, 1.0)  # not A2's
    assert tuning._past_edge_words(tmp_path)[0].endswith("which stands.")


def test_the_report_says_whether_wikitext_2_was_tuned(tmp_path):
    results = tmp_path / "tuning"
    _tune(results, "full", [[100.0], [101.0, 99.0, 102.0], [98.0, 97.0]])
    assert "WikiText-2's dev split (not run:" in tuning.report(output=tmp_path / "t.md", results=results)
    _keep(results / "wikitext-2" / "tune" / "self_organized" / "div_value=none,shortlist=1", "self_organized", 1,
          {"div_value": None, "shortlist": 1}, 150.0)
    text = tuning.report(output=tmp_path / "t.md", results=results)
    assert "WikiText-2's dev split (begun, not finished: `self_organized` 1 run, below, seed 1" in text
    assert "## Tuning on WikiText-2 (33k words)" in text and "(chosen: `not finished`)" in text
