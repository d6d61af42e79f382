"""Collapse monitors: hand-computed metric values, calibration, and the alert rules of CollapseMonitor."""

from __future__ import annotations

import json
import math

import pytest

from kevin.monitor import (
    Alert,
    char_run_share,
    script_mix_share,
    tail_loop_share,
    CollapseMonitor,
    JunkBreakdown,
    MonitorConfig,
    Severity,
    calibrate_opening,
    first_words,
    forgotten_share,
    junk_breakdown,
    solved_tasks,
    junk_score,
    longest_repeat_run,
    nonprintable_share,
    not_okay_ratio,
    plot_history,
    repeated_ngram_share,
    starts_with_opening,
    text_metrics,
)
from tests.monitor_texts import PROSE, fence, honest_with_three_copies, junk_responses, solution

NORMAL = (
    "Okay, so I need to write a fused ReLU kernel. The reference applies torch.relu to a float tensor "
    "of shape (16, 16384). Each thread can handle one element: read x, write max(x, 0). I will launch "
    "256 threads per block and enough blocks to cover every element, then check the bounds inside."
)
CODE = '''```python
import torch
from torch.utils.cpp_extension import load_inline

src = """
__global__ void relu_kernel(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}
"""
```'''
COPY_PASTE = NORMAL + " " + NORMAL + " " + NORMAL  # the same paragraph three times
STUTTER = "Okay, " + "the " * 60


# ---------------------------------------------------------------------------------------------------
# Not-Okay Ratio


def test_not_okay_ratio_three_of_four_okay_is_a_quarter():
    texts = ["Okay, so the kernel...", "Okay, let me think.", "Hmm, the tensor...", "Okay, first..."]
    assert not_okay_ratio(texts, "Okay,") == 0.25


def test_not_okay_ratio_normalises_the_start_and_counts_empty_as_not_okay():
    texts = [
        "<think>\n\nOkay, so",     # the tag some templates leave in the response
        "   \n Okay,\tthen",       # leading whitespace, tab after the opening
        "Okay，so",                # full-width comma (NFKC maps it to ',')
        "okay, so",                # case counts: the habit is "Okay,"
        "Okay so",                 # punctuation counts too
        "",                        # no reasoning at all
    ]
    assert [starts_with_opening(t, "Okay,") for t in texts] == [True, True, True, False, False, False]
    assert not_okay_ratio(texts, "Okay,") == 0.5


def test_opening_match_respects_word_boundaries():
    assert starts_with_opening("I need to", "I")
    assert not starts_with_opening("In this kernel", "I")
    assert starts_with_opening("Okay, so", "Okay")  # "," ends the word
    assert not starts_with_opening("Okayish", "Okay")
    assert starts_with_opening("Let me  think about it", "Let me")  # multi-word, inner spaces collapsed


def test_not_okay_ratio_rejects_an_empty_batch_and_an_empty_opening():
    with pytest.raises(ValueError, match="at least one"):
        not_okay_ratio([], "Okay,")
    with pytest.raises(ValueError, match="opening is empty"):
        starts_with_opening("Okay,", "  ")


# ---------------------------------------------------------------------------------------------------
# Calibration


def test_calibrate_picks_the_most_common_normalised_first_word():
    batch = ["Okay, so", "<think>Okay, let", "Alright, the", "  Okay, first", "Hmm.", ""]
    assert calibrate_opening(batch) == "Okay,"
    assert first_words("<think>\n Okay,  so I", 2) == "Okay, so"
    assert calibrate_opening(["Let me see", "Let me think", "Let us go"], n_words=2) == "Let me"


def test_calibrate_ties_go_to_the_first_seen_and_empty_texts_get_no_vote():
    # "Sure," and "Okay," both have 2 votes; "Sure," appears first. The three empties would win otherwise.
    batch = ["", "Sure, a", "   ", "Okay, b", "Okay, c", "Sure, d", "\n"]
    assert calibrate_opening(batch) == "Sure,"
    # Texts shorter than n_words have no opening of that length.
    assert calibrate_opening(["Okay,", "Okay, so", "Hmm so"], n_words=2) == "Okay, so"


def test_calibrate_on_only_empty_texts_says_what_to_do():
    with pytest.raises(ValueError, match="expected_opening"):
        calibrate_opening(["", "  ", "\n"])


# ---------------------------------------------------------------------------------------------------
# Junk score


def test_junk_breakdown_exact_on_a_tiny_example():
    # words: a b c a b c x
    # bigrams ab bc ca ab bc cx: 6 total, 4 distinct -> repeated share 2/6
    # "a b c" repeated back to back (period 3, 3 matches) covers 6 of 7 words
    b = junk_breakdown("a b c a b c x", ngram_size=2, max_period=8)
    assert b == JunkBreakdown(ngram_repeat=pytest.approx(1 / 3), run_share=pytest.approx(6 / 7), nonprintable=0.0)
    assert b.score == pytest.approx(6 / 7)


def test_repeat_run_needs_the_whole_block_to_repeat():
    # "a" matches at distance 3 once, but "x b" does not repeat: a coincidence, not a run.
    assert longest_repeat_run("a x b a y c".split(), 8) == 0
    assert longest_repeat_run("the the".split(), 8) == 2
    assert longest_repeat_run("q a b a b a b r".split(), 8) == 6
    # Blocks longer than max_period are left to the n-gram measure.
    assert longest_repeat_run("a b c a b c".split(), 2) == 0


def test_repeated_ngram_share_and_nonprintable_share_exact():
    assert repeated_ngram_share("the the the the the the".split(), 4) == pytest.approx(2 / 3)
    assert repeated_ngram_share("too short".split(), 4) == 0.0
    assert nonprintable_share("ab\x00\ufffd") == 0.5
    assert nonprintable_share("line\n\tindent\r\n") == 0.0  # ordinary whitespace is not junk
    assert nonprintable_share("") == 0.0


def test_junk_score_orders_normal_below_copy_paste_below_stutter():
    normal, code, copied, stutter = (junk_score(t) for t in (NORMAL, CODE, COPY_PASTE, STUTTER))
    assert normal < 0.05 and code < 0.05
    pasted = junk_breakdown(COPY_PASTE)
    assert pasted.ngram_repeat == pytest.approx(2 / 3, abs=0.02)  # three copies of prose: ~2/3 of the 4-grams repeat
    assert pasted.tail_loop == 1.0 and copied == 1.0  # and they run back to back to the end: a loop
    assert stutter > 0.95
    assert max(normal, code) < copied
    assert junk_score("") == 0.0
    assert junk_score("The the THE") == 1.0  # casefolded


@pytest.mark.parametrize("kernel", ["cuda/level1/21_conv2d", "cuda/level2/01_linear_relu_add_bias",
                                    "cuda/level2/13_linear_groupnorm_swish", "cpu/level2/20_conv2d_groupnorm_relu"])
def test_honest_responses_that_repeat_their_kernel_are_not_junk(kernel):
    # ~450 words of reasoning and the kernel three times (draft, revision, final): the old score read such a
    # response as 0.6-0.65, junk, and with patience 1 a batch of them stopped a healthy run.
    text = honest_with_three_copies(solution(kernel))
    assert junk_score(text) < 0.2
    assert junk_breakdown(text.replace("</think>", fence(solution(kernel)) + "\n</think>")).ngram_repeat > 0.2  # a 4th copy counts
    monitor = CollapseMonitor(MonitorConfig(expected_opening="Okay,", min_steps=0))
    monitor.observe(0, [text] * 8, turns=[0, 1, 2, 3] * 2)
    assert not monitor.should_stop and not any(a.metric.startswith("junk") for a in monitor.alerts)


def test_honest_language_mixing_and_symbols_are_not_junk():
    zh = "我们需要计算每个输出元素的位置，然后累加输入通道和卷积核窗口的乘积。使用shared memory来tile输入"
    assert junk_score(f"{PROSE} {zh} 然后 每个 thread 计算 一个 output 元素。") < 0.05  # two scripts, even within words
    assert junk_score(PROSE + " Let α = 0.5 and β = 1 − α; then y = α x + β z. " + "# " + "=" * 70) < 0.05


@pytest.mark.parametrize("kind", sorted(junk_responses()))
def test_collapse_junk_of_every_kind_is_junk(kind):
    assert junk_score(junk_responses()[kind]) >= MonitorConfig().junk_response_threshold


def test_new_measures_exact():
    assert char_run_share("ab" + "!" * 32 + "cd") == pytest.approx(32 / 36)
    assert char_run_share("x" + " " * 40 + "y") == 0.0  # indentation is not junk
    assert char_run_share("ab" + "!" * 31) == 0.0  # under 32 characters
    # "x y" five times at the end: 8 matches at period 2 cover 10 words of a 12-word window.
    assert tail_loop_share("q r a x y x y x y x y x y".split(), max_period=4, tail_words=12) == pytest.approx(10 / 12)
    assert tail_loop_share("x y x y x y end".split(), max_period=4) == 0.0  # the loop ended: not a tail loop
    # Windows of 8 words: words 0-7 and 1-8 hold Latin, CJK and Cyrillic; words 2-9 only two: 9 of 10 marked.
    words = "latin 数据 хорош ok ok ok ok ok ok ok".split()
    assert script_mix_share(" ".join(words), tail_words=100) == pytest.approx(9 / 10)
    assert script_mix_share("数据 latin 数据 latin", tail_words=100) == 0.0  # two scripts never count
    assert repeated_ngram_share("a b a b a b".split(), 2, in_code=[True] * 6, code_copies=3) == 0.0
    assert repeated_ngram_share("a b a b a b".split(), 2, in_code=[True] * 6, code_copies=2) == pytest.approx(1 / 5)


# ---------------------------------------------------------------------------------------------------
# Batch metrics


def test_text_metrics_exact():
    responses = ["Okay, ab", "Hmm, abcdef", STUTTER, "Okay, " + "x y " * 10]
    m = text_metrics(responses, opening="Okay,", truncated_flags=[False, False, True, True], token_counts=[10, 20, 30, 40],
                     turns=[0, 0, 1, 1])
    assert m["not_okay_ratio"] == 0.25
    assert m["truncated_share"] == 0.5
    assert m["mean_tokens"] == 25.0
    assert m["mean_chars"] == sum(map(len, responses)) / 4
    assert m["junk_share"] == 0.5  # the stutter and the "x y x y ..." loop
    assert m["junk_max"] == pytest.approx(60 / 61)  # the stutter: 60 of its 61 words are one run
    assert m["junk_mean"] == pytest.approx((60 / 61 + 20 / 21) / 4)  # the two short texts score 0
    assert m["not_okay_ratio/turn0"] == 0.5 and m["not_okay_ratio/turn1"] == 0.0
    assert m["junk_share/turn0"] == 0.0 and m["junk_share/turn1"] == 1.0
    assert m["junk_share/last_turn"] == 1.0 and m["not_okay_ratio/last_turn"] == 0.0


def test_text_metrics_leaves_out_what_it_cannot_compute():
    assert text_metrics([], opening="Okay,") == {}
    m = text_metrics(["Okay, a"], opening=None)
    assert "not_okay_ratio" not in m and "truncated_share" not in m and "mean_tokens" not in m
    with pytest.raises(ValueError, match="one per response"):
        text_metrics(["a", "b"], opening=None, truncated_flags=[True])


# ---------------------------------------------------------------------------------------------------
# Config


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_thresholds": {"not_ok_ratio": 0.2}}, "unknown metric 'not_ok_ratio'"),
        ({"stop_on": ["entropy"]}, "add it to max_thresholds or min_thresholds"),
        ({"stop_on": "junk_share"}, "must be a list"),
        ({"max_thresholds": {"junk_share": 10}}, "give a value in \\[0, 1\\]"),
        ({"max_thresholds": {"grad_norm": float("nan")}}, "finite number"),
        ({"min_thresholds": {"entropy": 2.0}, "max_thresholds": {"entropy": 1.0}}, "must be below"),
        ({"expected_opening": "   "}, "None to calibrate"),
        ({"patience": 0}, "patience must be"),
        ({"min_steps": -1}, "min_steps must be"),
        ({"junk_response_threshold": 0.0}, "junk_response_threshold"),
        ({"max_thresholds": {"junk_mean/turn3": 0.2}}, "per turn, e.g. 'junk_share/turn3'"),
        ({"max_thresholds": {"junk_share/turnX": 0.2}}, "unknown metric 'junk_share/turnX'"),
        ({"max_thresholds": {"junk_share/last_turn": 2.0}}, "give a value in \\[0, 1\\]"),
        ({"stop_on": ["junk_share/turn3"]}, "add it to max_thresholds"),
        ({"code_copies": 0}, "code_copies must be"),
    ],
)
def test_config_validation_says_what_to_do(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MonitorConfig(**kwargs)


def test_config_from_dict_round_trip_and_unknown_keys():
    cfg = MonitorConfig(expected_opening="Okay,", stop_on=["junk_share", "not_okay_ratio"], patience=2)
    assert MonitorConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    with pytest.raises(ValueError, match="unknown monitor settings"):
        MonitorConfig.from_dict({"treshold": 1})


def test_per_turn_thresholds_alert_and_stop():
    """Junk shows first in the last turn: a per-turn threshold sees it while the batch share stays low."""
    cfg = MonitorConfig(expected_opening="Okay,", max_thresholds={"junk_share": 0.5, "junk_share/turn3": 0.4},
                        stop_on=["junk_share/turn3"], min_steps=0)
    honest = "Okay, I will write one loop over the elements and check the bounds."
    junk = junk_responses()["sentence loop until the limit"]
    responses = [honest] * 12 + [honest, junk, junk, honest]  # turns 0-2 clean, half of turn 3 junk
    turns = [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4
    monitor = CollapseMonitor(cfg)
    (alert,) = monitor.observe(0, responses, turns=turns)
    assert monitor.history[-1]["junk_share"] == pytest.approx(2 / 16)  # the batch share is under its threshold
    assert (alert.metric, alert.value, alert.threshold, alert.should_stop) == ("junk_share/turn3", 0.5, 0.4, True)
    assert alert.severity is Severity.CRITICAL and "(turn3)" in alert.message and monitor.should_stop


def test_last_turn_threshold_follows_the_highest_turn_and_is_a_default_warning():
    assert MonitorConfig().max_thresholds["junk_share/last_turn"] == 0.2
    monitor = CollapseMonitor(MonitorConfig(expected_opening="Okay,", min_steps=0))
    junk = junk_responses()["gibberish"]
    # An 8-turn evaluation: 2 junk responses of 24 (under the batch threshold 0.1), but half of the last turn.
    alerts = monitor.observe(0, ["Okay, fine."] * 22 + [junk] * 2, turns=[0] * 20 + [7] * 4)
    (alert,) = [a for a in alerts if a.metric == "junk_share/last_turn"]
    assert alert.value == 0.5 and not alert.should_stop and alert.severity is Severity.WARNING
    assert "junk_share/last_turn" in {a.metric for a in monitor.alerts} and not monitor.should_stop


# ---------------------------------------------------------------------------------------------------
# CollapseMonitor


def okay_batch(n_okay: int, n_other: int) -> list[str]:
    return [f"Okay, attempt {i}" for i in range(n_okay)] + [f"Hmm, attempt {i}" for i in range(n_other)]


def test_crossing_raises_the_right_alert_once_per_step():
    cfg = MonitorConfig(expected_opening="Okay,", max_thresholds={"not_okay_ratio": 0.2}, stop_on=[], min_steps=0)
    mon = CollapseMonitor(cfg)
    assert mon.observe(0, okay_batch(4, 0)) == []
    alerts = mon.observe(1, okay_batch(1, 3))  # ratio 0.75 > 0.2
    assert len(alerts) == 1
    a = alerts[0]
    assert (a.metric, a.value, a.threshold, a.step, a.bound) == ("not_okay_ratio", 0.75, 0.2, 1, "max")
    assert (a.severity, a.should_stop, a.consecutive) == (Severity.WARNING, False, 1)
    assert "step 1: not_okay_ratio 0.75 > 0.2" in a.message and "'Okay,'" in a.message
    second = mon.observe(2, okay_batch(2, 2))  # still above: one alert, the streak grows
    assert [(x.step, x.consecutive) for x in second] == [(2, 2)]
    assert "2nd step in a row" in second[0].message
    assert mon.observe(3, okay_batch(4, 1)) == []  # 0.2 is not above 0.2
    assert mon.observe(4, okay_batch(0, 1))[0].consecutive == 1  # the streak restarted
    assert [x.step for x in mon.alerts] == [1, 2, 4]
    assert not mon.should_stop


def test_min_steps_holds_alerts_back():
    cfg = MonitorConfig(expected_opening="Okay,", max_thresholds={"not_okay_ratio": 0.2}, stop_on=[], min_steps=2)
    mon = CollapseMonitor(cfg)
    assert mon.observe(0, okay_batch(0, 4)) == []
    assert mon.observe(1, okay_batch(0, 4)) == []
    alerts = mon.observe(2, okay_batch(0, 4))
    assert [(a.step, a.consecutive) for a in alerts] == [(2, 1)]  # held-back steps do not count toward streaks
    assert [row["not_okay_ratio"] for row in mon.history] == [1.0, 1.0, 1.0]  # but they are recorded


def test_stop_flag_after_patience():
    cfg = MonitorConfig(expected_opening="Okay,", max_thresholds={"junk_share": 0.1, "not_okay_ratio": 0.2},
                        stop_on=["junk_share"], patience=2, min_steps=0)
    mon = CollapseMonitor(cfg)
    junky = ["Okay, fine"] * 3 + [STUTTER]  # junk share 0.25, Not-Okay 0
    first = mon.observe(0, junky)
    assert [(a.metric, a.severity, a.should_stop) for a in first] == [("junk_share", Severity.WARNING, False)]
    assert not mon.should_stop and mon.stop_alert is None
    second = mon.observe(1, junky)
    assert [(a.metric, a.severity, a.should_stop) for a in second] == [("junk_share", Severity.CRITICAL, True)]
    assert second[0].message.endswith("Stopping training.")
    assert mon.should_stop and mon.stop_alert == second[0]
    mon.observe(2, ["Okay, fine"] * 4)
    assert mon.should_stop  # sticky


def test_train_metrics_min_bounds_and_non_finite_values():
    cfg = MonitorConfig(expected_opening="Okay,", max_thresholds={"grad_norm": 1.0}, min_thresholds={"entropy": 0.1},
                        stop_on=["grad_norm"], min_steps=0)
    mon = CollapseMonitor(cfg)
    assert mon.observe(0, ["Okay, a"], [False], {"grad_norm": 0.5, "entropy": 0.3, "loss": 1.25}) == []
    assert mon.history[0]["loss"] == 1.25 and mon.history[0]["truncated_share"] == 0.0
    alerts = mon.observe(1, ["Okay, a"], [False], {"grad_norm": float("nan"), "entropy": 0.05})
    by_metric = {a.metric: a for a in alerts}
    assert set(by_metric) == {"grad_norm", "entropy"}
    assert math.isnan(by_metric["grad_norm"].value) and by_metric["grad_norm"].should_stop
    assert by_metric["entropy"].bound == "min" and "0.05 < 0.1" in by_metric["entropy"].message
    with pytest.raises(TypeError, match="must be a number"):
        mon.observe(2, ["Okay, a"], None, {"entropy": "high"})
    with pytest.raises(ValueError, match="clashes"):
        mon.observe(3, ["Okay, a"], None, {"junk_share": 0.0})
    assert len(mon.history) == 2  # rejected calls leave no trace


def test_a_rejected_first_call_does_not_calibrate():
    mon = CollapseMonitor(MonitorConfig(min_steps=0))
    with pytest.raises(ValueError, match="one per response"):
        mon.observe(0, ["Hmm, a", "Hmm, b"], [True])
    assert mon.opening is None and mon.history == []
    mon.observe(0, ["Okay, a", "Okay, b"], [False, False])
    assert mon.opening == "Okay," and mon.opening_share == 1.0


def test_calibrates_on_the_first_batch_then_measures_against_it():
    mon = CollapseMonitor(MonitorConfig(max_thresholds={"not_okay_ratio": 0.3}, stop_on=[], min_steps=1))
    assert mon.observe(0, ["", "Alright, x", "Alright, y", "Alright, z", "Sure, w"]) == []
    assert mon.opening == "Alright," and mon.opening_share == pytest.approx(0.6)
    assert mon.history[0]["not_okay_ratio"] == pytest.approx(0.4)
    alerts = mon.observe(1, ["Alright, a", "Hmm", "Hmm", "Hmm"])
    assert [(a.metric, a.value) for a in alerts] == [("not_okay_ratio", 0.75)]


def test_weak_calibration_gives_an_info_alert_and_silences_not_okay():
    mon = CollapseMonitor(MonitorConfig(max_thresholds={"not_okay_ratio": 0.3}, stop_on=[], min_steps=0, min_opening_share=0.5))
    first = mon.observe(0, ["A, 1", "A, 2", "B, 3", "C, 4", "D, 5"])
    assert [(a.metric, a.severity, a.bound, a.value, a.threshold) for a in first] == [
        ("opening_share", Severity.INFO, "min", pytest.approx(0.4), 0.5)]
    assert not mon.opening_trusted
    assert mon.observe(1, ["E, 1"] * 4) == []  # ratio 1.0 recorded, not alerted
    assert mon.history[1]["not_okay_ratio"] == 1.0


def test_empty_first_batch_defers_calibration():
    mon = CollapseMonitor(MonitorConfig(min_steps=0))
    assert mon.observe(0, ["", " ", "<think>\n"]) == []
    assert mon.opening is None and "not_okay_ratio" not in mon.history[0]
    mon.observe(1, ["Okay, a"])
    assert mon.opening == "Okay,"


def test_steps_must_increase():
    mon = CollapseMonitor(MonitorConfig(expected_opening="Okay,"))
    mon.observe(5, ["Okay,"])
    with pytest.raises(ValueError, match="increasing order"):
        mon.observe(5, ["Okay,"])


def test_alert_serialisation_round_trip():
    alert = Alert(metric="junk_share", value=0.25, threshold=0.1, step=7, severity=Severity.CRITICAL, should_stop=True,
                  message="step 7: junk_share 0.25 > 0.1", bound="max", consecutive=3)
    data = alert.to_dict()
    assert data["severity"] == "critical"
    assert Alert.from_dict(json.loads(json.dumps(data))) == alert
    with pytest.raises(ValueError, match="unknown alert fields"):
        Alert.from_dict({**data, "extra": 1})
    with pytest.raises(AttributeError):
        alert.step = 8  # frozen


def test_forgotten_share_counts_only_tasks_solved_at_their_previous_draw():
    before = {"a": True, "b": True, "c": False, "d": True}
    # a kept, b lost, c was never solved (not counted), e is new (not counted): 1 of 2
    assert forgotten_share(before, {"a": True, "b": False, "c": False, "e": True}) == 0.5
    assert forgotten_share(before, {"c": True, "e": False}) is None  # nothing solved before: nothing to forget
    assert forgotten_share({}, {"a": False}) is None
    assert forgotten_share(before, {"a": False, "b": False, "d": False}) == 1.0
    # A step's kernels -> each task solved when any of its kernels is correct.
    assert solved_tasks([("a", False), ("a", True), ("b", False), ("c", True)]) == {"a": True, "b": False, "c": True}


def test_the_monitor_remembers_each_tasks_last_draw_and_warns_when_solved_tasks_are_lost():
    # The fourth H200 run's steps 9-12 (0-based 8-11), task by task: sigmoid solved at its first draw and lost at
    # its second; then max_dim, matvec, leaky_relu, softplus, all solved in the first epoch, all lost.
    cfg = MonitorConfig(expected_opening="Okay,", stop_on=[], min_steps=0)
    mon = CollapseMonitor(cfg)
    first_epoch = {"max_dim": True, "matvec": True, "leaky_relu": True, "softplus": True, "argmax": False}
    assert mon.observe(8, okay_batch(4, 0), solved={**first_epoch, "sigmoid": True}) == []
    assert "forgotten_share" not in mon.history[-1]  # every task drawn for the first time
    mon.observe(9, okay_batch(4, 0), solved={"softmax": True, "conv1d": False})
    alerts = mon.observe(10, okay_batch(4, 0), solved={"sigmoid": False, "softmax": True, "argmax": False})
    assert mon.history[-1]["forgotten_share"] == 0.5  # sigmoid lost, softmax kept; argmax was never solved
    assert alerts == []  # 0.5 is not above the default 0.5
    state = json.loads(json.dumps(mon.state_dict()))
    resumed = CollapseMonitor(cfg)
    resumed.load_state_dict(state)  # a resume remembers which tasks were solved
    alerts = resumed.observe(11, okay_batch(4, 0), solved={"max_dim": False, "matvec": False, "leaky_relu": False,
                                                           "softplus": False})
    assert [(a.metric, a.value, a.threshold, a.severity, a.should_stop) for a in alerts] == [
        ("forgotten_share", 1.0, 0.5, Severity.WARNING, False)]
    assert "no correct kernel any more" in alerts[0].message
    old = {k: v for k, v in state.items() if k != "solved"}  # a checkpoint from before the indicator
    CollapseMonitor(cfg).load_state_dict(old)


def test_state_dict_resume_keeps_opening_history_and_streaks():
    cfg = MonitorConfig(max_thresholds={"not_okay_ratio": 0.2}, stop_on=["not_okay_ratio"], patience=2, min_steps=0)
    mon = CollapseMonitor(cfg)
    mon.observe(0, okay_batch(4, 0))
    mon.observe(1, okay_batch(1, 3))  # first crossing
    state = json.loads(json.dumps(mon.state_dict()))
    resumed = CollapseMonitor(cfg)
    resumed.load_state_dict(state)
    assert resumed.opening == "Okay," and resumed.history == mon.history and resumed.alerts == mon.alerts
    alerts = resumed.observe(2, okay_batch(1, 3))  # second crossing in a row -> stop, not a fresh streak
    assert alerts[0].consecutive == 2 and resumed.should_stop


def test_plot_history(tmp_path):
    pytest.importorskip("matplotlib")
    mon = CollapseMonitor(MonitorConfig(expected_opening="Okay,", min_steps=0))
    for step in range(3):
        mon.observe(step, okay_batch(3 - step, step), [False, True, False], {"entropy": 1.0 - 0.1 * step},
                    turns=[0, 1, 1])
    out = tmp_path / "monitor.png"
    fig = plot_history(mon.history, config=mon.config, alerts=mon.alerts, path=str(out))
    assert out.stat().st_size > 0
    assert len(fig.axes) == len([k for k in mon.history[0] if k not in ("step", "n_responses", "not_okay_check")])
    ticks = [t for t in fig.axes[-1].get_xticks() if -0.5 <= t <= 2.5]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks  # steps are whole numbers
    nor = fig.axes[0]
    dashed = [line.get_ydata()[0] for line in nor.lines if line.get_linestyle() == "--"]
    assert nor.get_ylabel() == "not_okay_ratio" and dashed == [0.2]  # checked: the threshold line stays


def test_plot_history_of_one_step_ticks_whole_steps():
    pytest.importorskip("matplotlib")
    mon = CollapseMonitor(MonitorConfig(expected_opening="Okay,", min_steps=0))
    mon.observe(4, okay_batch(2, 2))
    ax = plot_history(mon.history, ["not_okay_ratio"]).axes[0]
    lo, hi = ax.get_xlim()
    assert [float(t) for t in ax.get_xticks() if lo <= t <= hi] == [4.0]  # not 3.96, 3.98, 4.0 ...


def test_an_uncalibrated_opening_shows_in_the_row_and_the_plot():
    pytest.importorskip("matplotlib")
    cfg = MonitorConfig(max_thresholds={"not_okay_ratio": 0.2}, stop_on=[], min_steps=0, min_opening_share=0.5)
    mon = CollapseMonitor(cfg)
    mon.observe(0, ["A, 1", "A, 2", "B, 3", "C, 4", "D, 5"])  # "A," opens 40% of the base batch: not trusted
    assert mon.observe(1, ["E, 1"] * 4) == []  # ratio 1.0, far above 0.2, and rightly no alert
    assert [(row["not_okay_ratio"], row["not_okay_check"]) for row in mon.history] == [(0.6, 0.0), (1.0, 0.0)]
    ax = plot_history(mon.history, ["not_okay_ratio"], config=cfg).axes[0]
    assert len(ax.lines) == 1  # the ratio, no threshold line that no alert would honour
    assert [t.get_text() for t in ax.texts] == ["opening not calibrated: check off (no alert)"]
    trusted = CollapseMonitor(MonitorConfig(expected_opening="Okay,", min_steps=0))
    trusted.observe(0, okay_batch(1, 1))
    assert trusted.history[0]["not_okay_check"] == 1.0
