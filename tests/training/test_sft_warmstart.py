"""The concise warm-start data (data/warmstart/cpu and data/warmstart/cuda) and how the warm start uses it: every
answer is our own short ModelNew solution of a bundled train task, parses back to it, passes the static rules, and
those that the CPU profile trains on fit its response limit with SmolLM2's tokenizer. (Each file is judged `correct`
by the real evaluator, the CUDA ones on the H200: the commands and the results are in docs/learning.md; compiling
them takes minutes, too long for this file.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import REPO

DATA = REPO / "data" / "warmstart"
FILES = sorted((DATA / "cpu").rglob("*.py"))
BACKENDS = ("cpu", "cuda")


@pytest.fixture(scope="module")
def suite():
    from kevin.tasks import load_bundled_suite

    return {t.task_id: t for t in load_bundled_suite()}


def _task_id(path: Path) -> str:
    return f"{path.parent.name}/{path.stem}"


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_file_is_a_short_solution_of_a_bundled_train_task_that_passes_the_static_rules(suite, backend):
    from kevin.config import RunConfig
    from kevin.evaluation.rules import load_rules, static_hits
    from kevin.experiment.splits import split_side

    files = sorted((DATA / backend).rglob("*.py"))
    assert len(files) >= 20
    train = {t.task_id for t in split_side(RunConfig.from_files([REPO / "params.yaml"]), "", "train")}
    rules = load_rules()
    for path in files:
        assert _task_id(path) in train, path  # never an answer to a held-out task
        task = suite[_task_id(path)]
        source = path.read_text()
        assert "class ModelNew(nn.Module)" in source and "load_inline(" in source, path
        # The bundled references: up to ~7,000 characters; a kernel, its launch and its declaration take more room.
        assert len(source) <= {"cpu": 1300, "cuda": 1900}[backend], (path, len(source))
        if backend == "cuda":
            assert "__global__" in source and "cuda_sources=" in source, path
        assert static_hits(source, backend, rules, task.source) == [], path


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_answer_parses_back_to_its_solution(suite, backend):
    from kevin.rollout.parsing import parse_response
    from kevin.rollout.prompts import PromptBuilder
    from kevin.training.sft import CONCISE_REASONING, CONCISE_SUMMARY, sft_examples

    tasks = list(suite.values())
    examples = sft_examples(tasks, backend, prompt_style="compact", data_dir=DATA)
    assert [e["task_id"] for e in examples] == sorted(_task_id(p) for p in (DATA / backend).rglob("*.py"))
    for example in examples:
        task = suite[example["task_id"]]
        assert example["prompt"] == PromptBuilder(backend, style="compact").messages(task, [])
        parsed = parse_response(example["completion"][0]["content"])
        assert not parsed.parse_error
        assert parsed.kernel.strip() == (DATA / backend / f"{task.task_id}.py").read_text().strip()
        assert parsed.reasoning.strip() == CONCISE_REASONING[backend]
        assert parsed.summary.strip() == CONCISE_SUMMARY[backend]
    with pytest.raises(FileNotFoundError, match=f"no concise {backend} solution"):
        sft_examples(tasks[:0] + [suite["level1/01_relu"]], backend, data_dir=DATA)  # an eval task: none written


class WordTokenizer:
    eos_token_id = 0

    def encode(self, text, add_special_tokens=False):
        return text.split()


def test_answers_longer_than_the_response_limit_are_left_out(suite):
    from kevin.training.sft import answer_tokens, fit_examples, sft_examples

    examples = sft_examples(list(suite.values()), "cpu", data_dir=DATA)
    sizes = {e["task_id"]: answer_tokens(WordTokenizer(), e) for e in examples}
    limit = sorted(sizes.values())[len(sizes) // 2]
    kept, dropped = fit_examples(WordTokenizer(), examples, limit)
    assert {e["task_id"] for e in kept} == {t for t, n in sizes.items() if n <= limit}
    assert dropped == {t: n for t, n in sizes.items() if n > limit}


@pytest.mark.parametrize("backend", BACKENDS)
def test_second_turn_examples_follow_a_correct_first_attempt_with_the_same_whole_answer(suite, backend):
    from kevin.rollout.parsing import parse_response
    from kevin.rollout.prompts import PromptBuilder
    from kevin.training.sft import CONCISE_SUMMARY, sft_examples

    tasks = list(suite.values())
    first = sft_examples(tasks, backend, prompt_style="compact", data_dir=DATA)
    both = sft_examples(tasks, backend, prompt_style="compact", data_dir=DATA, second_turn=True)
    assert both[0::2] == first  # the first-turn examples unchanged, each followed by its second turn
    builder = PromptBuilder(backend, style="compact")
    for one, two in zip(both[0::2], both[1::2]):
        task, source = suite[one["task_id"]], (DATA / backend / f"{one['task_id']}.py").read_text()
        assert two["task_id"] == one["task_id"] and two["turn"] == 1 and "turn" not in one
        assert two["completion"] == one["completion"]
        user = two["prompt"][-1]["content"]
        # the second turn's context as the rollout words it: the task, then the first attempt and its verdict
        assert user.startswith(builder.messages(task, [])[-1]["content"].split("\n")[0])
        assert "### Attempt 1" in user and source.strip() in user and CONCISE_SUMMARY[backend] in user
        assert "Your kernel is correct and runs at 1.00x the speed of the PyTorch eager baseline" in user
        assert parse_response(two["completion"][0]["content"]).kernel.strip() == source.strip()


@pytest.mark.parametrize("backend", BACKENDS)
def test_second_turn_examples_can_follow_a_refused_first_attempt(suite, backend):
    """``second_turn_after``: "failed" answers the task's own PyTorch code as ModelNew, refused by the static rules
    with the feedback the rollout shows, with the concise kernel; "both" gives the correct and the refused context."""
    from kevin.training.sft import rejected_first_attempt, sft_examples

    tasks = list(suite.values())
    first = sft_examples(tasks, backend, prompt_style="compact", data_dir=DATA)
    failed = sft_examples(tasks, backend, prompt_style="compact", data_dir=DATA, second_turn=True,
                          second_turn_after="failed")
    both = sft_examples(tasks, backend, prompt_style="compact", data_dir=DATA, second_turn=True, second_turn_after="both")
    correct = sft_examples(tasks, backend, prompt_style="compact", data_dir=DATA, second_turn=True)
    assert failed[0::2] == first and both[0::3] == first
    assert both[1::3] == correct[1::2] and both[2::3] == failed[1::2]
    for one, two in zip(failed[0::2], failed[1::2]):
        task = suite[one["task_id"]]
        assert two["turn"] == 1 and two["completion"] == one["completion"]
        user = two["prompt"][-1]["content"]
        lazy, said, judged = rejected_first_attempt(task, backend)
        assert "class ModelNew(" in lazy and "class Model(" not in lazy
        assert lazy.strip() in user and f"Your summary: {said}" in user  # the refused attempt is shown whole
        assert judged.status.value == "rule_violation" and judged.rule_id == "reference_inheritance"
        assert "Result: Your kernel broke a rule and scores 0 [reference_inheritance]:" in user
        assert "ModelNew.forward is a copy of the reference forward" in user
        assert "runs at 1.00x" not in user


def test_second_turn_after_takes_only_its_three_values():
    from kevin.training.sft import SFTConfig

    assert SFTConfig().second_turn_after == "correct"
    assert SFTConfig(second_turn_after="both").second_turn_after == "both"
    with pytest.raises(ValueError, match="second_turn_after must be one of correct, failed, both"):
        SFTConfig(second_turn_after="wrong")


class TemplateTokenizer(WordTokenizer):
    """Words as tokens, through a chat template that joins the messages."""

    def apply_chat_template(self, messages, tokenize=False):
        return "\n".join(m["content"] for m in messages)

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": text.split()}


def test_a_second_turn_longer_than_max_length_is_left_out_whole(suite):
    """The trainer cuts an example at sft.max_length from the end: a second turn cut there would teach the run-on
    answer it exists to prevent, so it is left out instead (and its first turn kept)."""
    import dataclasses

    from kevin.config import RunConfig
    from kevin.experiment.splits import split_side
    from kevin.training.sft import example_tokens, sft_examples, warm_start_examples

    run = RunConfig.from_files([REPO / "params.yaml", REPO / "configs" / "cpu.yaml"])
    tasks = [t for t in split_side(run, "", "train") if (DATA / "cpu" / f"{t.task_id}.py").is_file()]
    tok = TemplateTokenizer()
    both = sft_examples(tasks, "cpu", prompt_style=run.rollout.prompt_style, data_dir=DATA, second_turn=True,
                        system_prompt=run.rollout.system_prompt, include_example=run.rollout.include_example,
                        profile=run.profile)
    seconds = sorted(n for e, n in zip(both, example_tokens(tok, both)) if e.get("turn"))
    limit = seconds[len(seconds) // 2]  # half of the second turns are longer
    run = dataclasses.replace(run, sft=dataclasses.replace(run.sft, second_turn=True, max_length=limit,
                                                           fit_response_limit=False))
    kept, dropped = warm_start_examples(run, tasks, tok)
    sizes = dict(zip(map(id, both), example_tokens(tok, both)))
    assert [e for e in kept if not e.get("turn")] == [e for e in both if not e.get("turn")]
    assert [e["task_id"] for e in kept if e.get("turn")] == [e["task_id"] for e in both
                                                            if e.get("turn") and sizes[id(e)] <= limit]
    assert dropped == {f"{e['task_id']} (turn 2)": sizes[id(e)] for e in both if e.get("turn") and sizes[id(e)] > limit}
    assert 0 < len(dropped) < len(seconds)


@pytest.fixture(scope="module")
def embedded_tokenizer():
    """SmolLM2's tokenizer from the embedded model's converted folder: converted here when no run made it yet (about
    a minute, then cached), so these tests run on a fresh clone too; skipped only where the model is not installed."""
    try:
        from kevin.policy.embedded import embedded_hf_dir

        folder = embedded_hf_dir()
    except (FileNotFoundError, ImportError) as exc:
        pytest.skip(f"the embedded model is not installed: {exc}")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


def test_the_cpu_profile_trains_on_a_dozen_level1_answers_that_fit_its_response_limit(suite, embedded_tokenizer):
    from kevin.config import RunConfig
    from kevin.training.sft import answer_tokens, fit_examples, sft_examples

    tokenizer = embedded_tokenizer
    run = RunConfig.from_files([REPO / "params.yaml", REPO / "configs" / "cpu.yaml"])
    assert run.sft.enabled and run.sft.data == "data/warmstart" and run.rollout.prompt_style == "compact"
    examples = sft_examples(list(suite.values()), "cpu", prompt_style="compact", data_dir=REPO / run.sft.data)
    kept, dropped = fit_examples(tokenizer, examples, run.max_response_tokens)
    kept_ids = {e["task_id"] for e in kept}
    assert len(kept) >= 12, dropped
    assert {"level1/02_gelu", "level1/03_sigmoid", "level1/04_leaky_relu", "level1/05_softplus",
            "level1/30_cumsum"} <= kept_ids
    assert max(answer_tokens(tokenizer, e) for e in kept) <= run.max_response_tokens
    from kevin.training.sft import example_tokens

    assert max(example_tokens(tokenizer, kept)) <= run.sft.max_length


def test_the_shipped_cpu_warm_start_is_the_one_the_cpu_profile_asks_for(suite, embedded_tokenizer):
    """The sft stage of `make run` copies data/warmstart/prebuilt/cpu only while its fingerprint is the cpu profile's:
    an answer, a setting or the base model changed without rebuilding it would cost every user ~25 min of training."""
    import json

    from kevin.config import RunConfig
    from kevin.experiment.policies import model_identity
    from kevin.training.sft import warm_start_examples, warm_start_fingerprint

    run = RunConfig.from_files([REPO / "params.yaml", REPO / "configs" / "cpu.yaml"])
    shipped = json.loads((REPO / run.sft.prebuilt / "sft.json").read_text())
    # The train tasks with a concise answer, in the suite's order (as `kevin sft` reads them from the split).
    tasks = [suite[t] for t in sorted(set(shipped["tasks"]) | set(shipped["left_out"]))]
    examples, dropped = warm_start_examples(run, tasks, embedded_tokenizer)
    assert [e["task_id"] for e in examples] == shipped["tasks"] and dropped == shipped["left_out"]
    fingerprint = warm_start_fingerprint(run.sft, examples, model_identity(run))
    assert fingerprint == shipped["fingerprint"], (
        "data/warmstart/prebuilt/cpu is stale: rebuild it with the command in docs/learning.md")
    assert (REPO / run.sft.prebuilt / "model" / "adapter_model.safetensors").stat().st_size > 1_000_000


@pytest.mark.parametrize("config, per_task", [("h200_learn_rest.yaml", 1), ("h200_learn_turns.yaml", 2)])
def test_the_h200_runs_warm_starts_keep_every_second_turn_whole(suite, embedded_tokenizer, config, per_task):
    """configs/h200_learn_rest.yaml trains each answer also as a second turn (h200_learn_turns.yaml twice: after a
    correct and after a refused first attempt); sft.max_length must hold the longest of them with SmolLM2's
    tokenizer, or the second turns they exist for would be left out."""
    from kevin.config import RunConfig
    from kevin.experiment.splits import split_side
    from kevin.training.sft import example_tokens, warm_start_examples

    tokenizer = embedded_tokenizer
    run = RunConfig.from_files([REPO / "params.yaml", REPO / "configs" / "h200_learn.yaml",
                                REPO / "configs" / config])
    assert run.sft.second_turn and run.backend == "cuda"
    kept, dropped = warm_start_examples(run, split_side(run, "", "train"), tokenizer)
    firsts = [e["task_id"] for e in kept if not e.get("turn")]
    seconds = [e["task_id"] for e in kept if e.get("turn")]
    assert seconds == [t for t in firsts for _ in range(per_task)] and len(firsts) >= 20
    assert not any(k.endswith("(turn 2)") for k in dropped), dropped
    assert max(example_tokens(tokenizer, kept)) <= run.sft.max_length
