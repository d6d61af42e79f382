"""The pipeline's own outputs: train metrics and curves (hand-computed), baselines keyed by hardware, the report,
and when a train stage re-run resumes."""

from __future__ import annotations

import json

import yaml

STEPS = [
    {"step": 0, "turns": [{"turn": 0, "kernels": 4, "correct": 1, "score_mean": 0.5, "return_mean": 0.7},
                          {"turn": 1, "kernels": 2, "correct": 2, "score_mean": 2.0, "return_mean": 2.0}],
     "verdicts": {"correct": 3, "parse_error": 3}},
    {"step": 1, "turns": [{"turn": 0, "kernels": 4, "correct": 0, "score_mean": 0.0, "return_mean": 0.1}],
     "verdicts": {"parse_error": 4}},
]


def test_train_metrics_weigh_each_turn_by_its_kernels():
    from kevin.pipeline import train_metrics

    got = train_metrics(STEPS)
    # 10 kernels, 3 correct; score: (4*0.5 + 2*2.0 + 4*0) / 10 = 0.6; turn 1: (4*0.5 + 0) / 8 = 0.25; turn 2: 2.0
    assert got == {"steps_done": 2, "kernels": 10, "correct": 3, "correct_share": 0.3, "score_mean": 0.6,
                   "score_mean_last_step": 0.0, "score_mean_turn_1": 0.25, "score_mean_turn_2": 2.0,
                   "verdicts": {"correct": 3, "parse_error": 7}}
    assert train_metrics([]) == {"steps_done": 0, "kernels": 0, "correct": 0, "correct_share": 0.0,
                                 "score_mean": 0.0, "score_mean_last_step": 0.0, "verdicts": {}}


def test_the_curve_has_a_row_per_step(tmp_path):
    from kevin.pipeline import CURVE_FIELDS, train_curve, write_csv

    rows = train_curve(STEPS)
    # step 0: score (4*0.5 + 2*2)/6 = 1.0, return (4*0.7 + 2*2)/6 = 6.8/6
    assert rows[0] == {"step": 0, "kernels": 6, "correct": 3, "correct_share": 0.5, "score_mean": 1.0,
                       "return_mean": 6.8 / 6}
    assert rows[1] == {"step": 1, "kernels": 4, "correct": 0, "correct_share": 0.0, "score_mean": 0.0,
                       "return_mean": 0.1}
    text = write_csv(tmp_path / "c.csv", rows, CURVE_FIELDS).read_text().splitlines()
    assert text[0] == "step,kernels,correct,correct_share,score_mean,return_mean"
    assert text[2] == "1,4,0,0.0,0.0,0.1"


def test_baselines_are_keyed_by_hardware_and_keep_other_machines():
    from kevin.pipeline import baseline_entry, merge_baselines

    entry = baseline_entry({"level1/b": 2.0, "level1/a": 1.5}, backend="cpu", profile="cpu", torch_version="2.13.0",
                           threads=1, timing_trials=100)
    assert list(entry["ms"]) == ["level1/a", "level1/b"]
    old = {"NVIDIA H200": {"ms": {"level1/a": 0.1}}, "Some CPU": {"ms": {"level1/a": 9.0}}}
    merged = merge_baselines(old, "Some CPU", entry)
    assert merged == {"NVIDIA H200": {"ms": {"level1/a": 0.1}}, "Some CPU": entry}


def test_a_run_with_the_same_settings_is_resumed_and_one_with_others_removed(tmp_path):
    from kevin.config import RunConfig
    from kevin.pipeline import prepare_output_dir

    out = tmp_path / "train"
    params = RunConfig.from_dict({"experiment": {"steps": 2}}).params_dict()
    assert prepare_output_dir(out, params) is False  # nothing there
    (out / "steps" / "step_000000").mkdir(parents=True)
    (out / "config.yaml").write_text(yaml.safe_dump(json.loads(json.dumps(params, default=str)), sort_keys=False))
    assert prepare_output_dir(out, params) is True and (out / "steps" / "step_000000").is_dir()
    other = RunConfig.from_dict({"experiment": {"steps": 2}, "rewards": {"gamma": 0.8}}).params_dict()
    assert prepare_output_dir(out, other) is False and not out.exists()


def test_the_report_shows_both_stages_metrics():
    from kevin.pipeline import report_markdown

    text = report_markdown({"steps_done": 2, "score_mean": 0.6, "verdicts": {"correct": 3}},
                           {"eval": {"fast_1": 0.25}}, "gamma-0.8")
    assert text.splitlines()[0] == "# gamma-0.8"
    assert "| score_mean | 0.6 |" in text and "verdicts: correct 3" in text and "| eval.fast_1 | 0.25 |" in text
    assert "the evaluate stage has not run" in report_markdown({"steps_done": 0}, None, "x")


def test_the_report_says_in_words_what_happened():
    from kevin.pipeline import report_markdown, what_happened

    train = {"steps_done": 2, "kernels": 16, "correct": 3, "verdicts": {"correct": 3, "compile_error": 13}}
    steps = [{"step": "0", "score_mean": "0.125"}, {"step": "1", "score_mean": "0.3"}]
    evaluation = {"kernels": 4, "correct_kernels": 1, "geomean_speedup": 0.42}
    sft = {"enabled": True, "examples": 13, "steps": 156, "train_loss": 0.0712, "prebuilt": "data/warmstart/prebuilt/cpu"}
    assert what_happened(train, evaluation, sft=sft, steps=steps) == [
        "- Warm start: 13 answers learned (156 steps, loss 0.0712); reused the one built earlier in "
        "`data/warmstart/prebuilt/cpu`.",
        "- Training: 2 steps, 16 kernels judged, 3 correct (19%). Mean kernel score per step: 0.125, 0.300 "
        "(last - first: +0.175).",
        "- Evaluation: 4 kernels judged, 1 correct (25%), geomean speedup of the correct ones 0.42x."]
    trained = dict(sft, prebuilt=None, seconds=1534.4)
    assert what_happened(train, None, sft=trained)[0].endswith("; trained in 1534 s.")
    assert what_happened(train, None, sft={"enabled": False})[0].startswith("- Warm start: off")
    nothing = what_happened({"steps_done": 2, "kernels": 16, "correct": 0}, None)
    assert nothing[1].startswith("- No training kernel was correct: every score was 0, so every advantage was 0")
    text = report_markdown(train, evaluation, "cpu-demo", sft=sft, steps=steps)
    assert text.splitlines()[:4] == ["# cpu-demo", "", "## What happened", ""]


def test_the_headline_holds_the_few_figures_an_ablation_is_compared_by():
    from kevin.pipeline import headline_metrics

    train = {"steps_done": 2, "kernels": 16, "correct": 8, "correct_share": 0.5, "score_mean": 0.376,
             "score_mean_last_step": 0.526, "score_mean_turn_1": 0.54, "verdicts": {"correct": 8}}
    evaluation = {"tasks": 3, "kernels": 12, "best_at_1/correct": 0.2, "best_at_2/correct": 0.5,
                  "best_at_2/perf": 0.4, "best_at_2/fast_1": 0.1, "best_at_2/fast_2": 0.0, "avg_at_2/correct": 0.25,
                  "avg_at_2/perf": 0.2, "avg_at_2/fast_1": 0.05, "turn_1/best_at_2/correct": 0.3}
    assert headline_metrics(train, evaluation) == {
        "train": {"steps_done": 2, "correct_share": 0.5, "score_mean": 0.376, "score_mean_last_step": 0.526},
        "evaluation": {"tasks": 3, "k": 2, "best_correct": 0.5, "best_perf": 0.4, "best_fast_1": 0.1,
                       "avg_correct": 0.25, "avg_perf": 0.2, "avg_fast_1": 0.05}}
    assert headline_metrics(train, None) == {"train": {"steps_done": 2, "correct_share": 0.5, "score_mean": 0.376,
                                                       "score_mean_last_step": 0.526}}


def test_kevin_report_is_titled_and_opened_by_the_run_settings_and_writes_the_headline(tmp_path):
    from typer.testing import CliRunner

    from kevin_cli import app
    from tests.conftest import REPO

    train = tmp_path / "train.json"
    train.write_text(json.dumps({"steps_done": 2, "kernels": 16, "correct": 8, "correct_share": 0.5,
                                 "score_mean": 0.25, "score_mean_last_step": 0.5, "verdicts": {"correct": 8}}))
    result = CliRunner().invoke(app, ["report", "--params", str(REPO / "params.yaml"), "--params",
                                      str(REPO / "configs" / "cpu.yaml"), "--train", str(train), "--out",
                                      str(tmp_path / "report"), "--headline", str(tmp_path / "m" / "headline.json")])
    assert result.exit_code == 0, result.output
    page = (tmp_path / "report" / "report.md").read_text()
    assert page.startswith("# cpu-demo\n\n| setting | value |")
    assert "| training | 2 steps x 2 tasks x 2 trajectories x 2 turns, 384 response tokens, T 0.5 |" in page
    assert "| reward | gamma 0.4, sum of the turn scores |" in page
    assert json.loads((tmp_path / "m" / "headline.json").read_text()) == {"headline": {
        "train": {"steps_done": 2, "correct_share": 0.5, "score_mean": 0.25, "score_mean_last_step": 0.5}}}


def test_step_folders_are_read_in_step_order_without_half_written_ones(tmp_path):
    from kevin.pipeline import read_step_summaries, step_dirs, step_index

    # Step 10 sorts after step 9 by number (a name sort agrees only while the zero padding holds).
    for name, summary in (("step_000010", {"step": 10}), ("step_9", {"step": 9}), ("step_000002", None),
                          ("step_000003.tmp", {"step": 3}), ("step_x", {"step": -1})):
        (tmp_path / "steps" / name).mkdir(parents=True)
        if summary is not None:
            (tmp_path / "steps" / name / "summary.json").write_text(json.dumps(summary))
    assert [d.name for d in step_dirs(tmp_path)] == ["step_000002", "step_9", "step_000010"]
    assert [step_index(d) for d in step_dirs(tmp_path)] == [2, 9, 10]
    assert step_index(tmp_path / "checkpoints" / "step_000029") == 29
    # A step without its summary (not finished) is not a finished step.
    assert read_step_summaries(tmp_path) == [{"step": 9}, {"step": 10}]
    assert step_dirs(tmp_path / "no_run") == []
