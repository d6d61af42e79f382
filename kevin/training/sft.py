"""An optional warm start before RL: supervised fine-tuning on the train split's reference solutions.

A small model rarely writes a kernel the parser can read, so its first RL steps have nothing to learn from. The
warm start shows it, for every train task, the first-turn prompt the rollout asks (``kevin.rollout.prompts``) and
an answer in the requested shape: a few lines of reasoning, the task's bundled reference solution in one
```python block, then a short summary (``kevin.rollout.parsing`` reads it back to that solution). TRL's
``SFTTrainer`` trains on the answer tokens only (prompt-completion data). The paper starts RL without it; here it
is the ``sft`` section of params.yaml, off by default, and an ablation (``-S sft.enabled=true``).

    examples = sft_examples(tasks, backend="cpu")          # [{"prompt": [...], "completion": [...]}]
    run_sft(config, model, tokenizer, examples, "outputs/sft")   # writes outputs/sft/model

torch, transformers, datasets and trl are imported inside the functions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from kevin.records.target import KernelTarget
from kevin.settings import Settings
from kevin.tasks.task import Task

__all__ = ["ADAPTER_CONFIG", "CONCISE_REASONING", "CONCISE_SUMMARY", "MODEL_DIR", "is_adapter", "merge_adapter", "SFTConfig", "answer_tokens", "concise_solution_path",
           "concise_tasks", "example_tokens", "fit_examples", "reasoning_text", "sft_examples", "sft_model_dir",
           "summary_text", "run_sft", "second_turn_messages", "rejected_first_attempt", "SECOND_TURN_AFTER"]

MODEL_DIR = "model"
"""The fine-tuned model's folder inside ``sft.output_dir``."""

SECOND_TURN_AFTER = ("correct", "failed", "both")
"""The first attempts a second-turn example may follow (``SFTConfig.second_turn_after``)."""

ADAPTER_CONFIG = "adapter_config.json"
"""peft's file in an adapter folder: a warm start saved with ``sft.lora`` (``is_adapter``)."""


@dataclass
class SFTConfig(Settings):
    """The ``sft`` section: the optional supervised warm start before RL."""

    section = "sft"

    enabled: bool = False
    """Fine-tune the policy on the train split's reference solutions before RL, and train from the result (the
    paper: off)."""

    output_dir: str = "outputs/sft"
    """Where the warm start writes (``<output_dir>/model``: the model the training run then starts from); relative
    paths are under the project folder."""

    epochs: float = 2.0
    """Passes over the train tasks' examples."""

    lr: float = 1.0e-5
    """Peak learning rate (AdamW, linear decay)."""

    batch_size: int = 1
    """Examples per optimiser step (per device)."""

    max_length: int = 4096
    """Tokens of prompt plus answer kept per example (longer ones are cut at the end)."""

    seed: int = 0
    """Seed of the data order and of any randomness in the model."""

    data: str = ""
    """Where the answers come from. "": the bundled reference solutions of every train task (long: 315-2,237
    tokens with SmolLM2's tokenizer, comments and checks included). A folder (relative paths under the project
    folder) holding ``<backend>/levelN/NAME.py``: our concise solutions (``data/warmstart``), for the train tasks
    that have one, with a one-line reasoning and summary; the answers a small model can learn and finish within
    a short response limit."""

    second_turn: bool = False
    """Also train each answer as the second turn of its task: after a first attempt that was this same kernel, correct
    at 1.00x, the answer is the kernel again, whole and ended. Without it the warm start has only first-turn
    prompts, and a policy warm-started on them wrote second turns that ran to the response limit or could not be
    parsed (the H200's third run: 0.94 of second-turn answers unparseable by its sixth GRPO step)."""

    second_turn_after: str = "correct"
    """What the first attempt of each second-turn example (``second_turn``) was. "correct": the same kernel, correct at
    1.00x, so the policy learns to keep a working kernel whole; warm-started on these alone, the third run's policy
    copied its first turn token for token in 106 of its first 128 second turns, after compile errors too. "failed":
    the task's own PyTorch code as ``ModelNew``, refused by the static rules with their feedback (what a policy
    that writes no kernel is told), so the answer is a kernel written after a failure. "both": one of each per
    task."""

    fit_response_limit: bool = True
    """Leave out the examples whose answer (with its end-of-sequence token) is longer than the run's
    ``max_response_tokens``: the policy could never finish them in a rollout."""

    lora: bool = False
    """Train a LoRA adapter (peft, every linear layer) instead of every weight, and save only the adapter in
    ``<output_dir>/model``; the run loads its policy's base model and merges the adapter in. An adapter is a few
    MB where the model is hundreds: it is what travels to another machine (e.g. a GPU machine whose copies are
    size-limited) and it is rebuilt there bit for bit over the same base."""

    lora_r: int = 16
    """Rank of the LoRA adapter (``lora``); its alpha is twice the rank."""

    prebuilt: str = ""
    """A warm start built earlier (a folder holding ``model/`` and the ``sft.json`` that ``kevin sft`` wrote). When
    its fingerprint (the examples, the base model, the settings above that shape training) is this warm start's,
    ``kevin sft`` copies it instead of training; otherwise it trains and says why it could not reuse it. For
    machines where training is slow: the CPU main job's adapter takes ~25 min on 2 cores and a second to copy.
    Relative paths are under the project folder; "" always trains."""

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ValueError(f"sft.enabled must be true or false, got {self.enabled!r}")
        if not isinstance(self.output_dir, str) or not self.output_dir.strip():
            raise ValueError("sft.output_dir must name a folder, e.g. outputs/sft")
        if isinstance(self.epochs, bool) or not isinstance(self.epochs, (int, float)) or not (
                math.isfinite(self.epochs) and self.epochs > 0):
            raise ValueError(f"sft.epochs must be a positive number of passes, got {self.epochs!r}")
        if isinstance(self.lr, bool) or not isinstance(self.lr, (int, float)) or not (math.isfinite(self.lr)
                                                                                      and self.lr > 0):
            raise ValueError(f"sft.lr must be a positive learning rate such as 1.0e-5 (YAML reads 1e-5 as text), "
                             f"got {self.lr!r}")
        if not isinstance(self.data, str):
            raise ValueError(f"sft.data must be a folder (or \"\" for the bundled references), got {self.data!r}")
        if not isinstance(self.second_turn, bool):
            raise ValueError(f"sft.second_turn must be true or false, got {self.second_turn!r}")
        if self.second_turn_after not in SECOND_TURN_AFTER:
            raise ValueError(f"sft.second_turn_after must be one of {', '.join(SECOND_TURN_AFTER)}, "
                             f"got {self.second_turn_after!r}")
        if not isinstance(self.fit_response_limit, bool):
            raise ValueError(f"sft.fit_response_limit must be true or false, got {self.fit_response_limit!r}")
        if not isinstance(self.lora, bool):
            raise ValueError(f"sft.lora must be true or false, got {self.lora!r}")
        if not isinstance(self.prebuilt, str):
            raise ValueError(f"sft.prebuilt must be a folder (or \"\" to always train), got {self.prebuilt!r}")
        for name in ("batch_size", "max_length", "lora_r"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"sft.{name} must be a positive integer, got {value!r}")


def sft_model_dir(config: SFTConfig, project_dir: str | Path = ".") -> Path:
    """The folder of the warm-started model (``<output_dir>/model``, relative paths under ``project_dir``)."""
    root = Path(config.output_dir)
    return (root if root.is_absolute() else Path(project_dir) / root) / MODEL_DIR


def is_adapter(folder: str | Path) -> bool:
    """Whether a warm start's model folder holds a LoRA adapter (``sft.lora``) rather than a whole model."""
    return (Path(folder) / ADAPTER_CONFIG).is_file()


def merge_adapter(model: Any, folder: str | Path) -> Any:
    """``model`` with the LoRA adapter saved in ``folder`` merged into its weights: a plain model again, which the
    trainer (and another adapter of the RL run) can train like any other."""
    from peft import PeftModel

    merged = PeftModel.from_pretrained(model, str(folder)).merge_and_unload()
    # peft froze the base weights to train its adapter; merged, they are the model's own again, and a full-weight
    # update (train.lora false) must be able to train every one of them.
    for param in merged.parameters():
        param.requires_grad_(True)
    return merged


def reasoning_text(task: Task, backend: str) -> str:
    """The reasoning of a warm-start answer: what the reference computes and the plan (no model wrote it, so it
    only states the approach every reference solution takes)."""
    target = "one CUDA kernel per step, compiled inline" if KernelTarget.parse(backend).is_gpu else "plain C++ loops, compiled inline"
    return (f"The reference `Model` of {task.task_id} computes its forward with PyTorch operators. I replace that "
            f"forward with {target} by load_inline, computing the same outputs from raw pointers, and keep the "
            "constructor and forward signatures.")


def summary_text(backend: str) -> str:
    """The summary after the code block of a warm-start answer."""
    where = "CUDA kernels" if KernelTarget.parse(backend).is_gpu else "C++ loops"
    return (f"The solution computes the forward with {where} over contiguous float buffers; Python only allocates "
            "the outputs and calls the compiled functions.")


CONCISE_REASONING = {
    "cpu": "I compute the forward with plain C++ loops over the raw float pointers, compiled by load_inline.",
    "cuda": "I compute the forward with one CUDA kernel per step over the raw float pointers, compiled by load_inline.",
}
"""The reasoning of a concise warm-start answer (``sft.data``): one sentence, the same for every task."""

CONCISE_SUMMARY = {
    "cpu": "C++ loops compute the outputs; Python only calls the compiled function.",
    "cuda": "CUDA kernels compute the outputs; Python only calls the compiled launcher.",
}


def concise_solution_path(data_dir: str | Path, task: Task, backend: str) -> Path:
    """Where a concise solution of ``task`` lives: ``<data_dir>/<backend>/levelN/NAME.py``."""
    return Path(data_dir) / backend / f"{task.task_id}.py"


def concise_tasks(tasks: Sequence[Task], backend: str, data_dir: str | Path) -> list[Task]:
    """The tasks of ``tasks`` that have a concise solution in ``data_dir``."""
    return [t for t in tasks if concise_solution_path(data_dir, t, backend).is_file()]


def sft_examples(tasks: Sequence[Task], backend: str, *, profile: str = "", system_prompt: str = "",
                 include_example: bool = True, prompt_style: str = "full",
                 data_dir: str | Path | None = None, second_turn: bool = False,
                 second_turn_after: str = "correct") -> list[dict[str, Any]]:
    """One conversational prompt-completion example per task: the first-turn messages the rollout sends
    (``prompt_style`` as ``rollout.prompt_style``), and the answer (reasoning, the solution in a ```python block,
    a summary). Without ``data_dir`` the solution is the task's bundled reference (FileNotFoundError naming the
    tasks without one); with it, the task's concise solution there and the one-line reasoning and summary
    (tasks without one are left out; FileNotFoundError if none has one). With ``second_turn`` each task also gets
    the second turn's example (``second_turn_messages``) with the same answer, right after its first: after a
    correct first attempt, a refused one (``rejected_first_attempt``), or both in that order
    (``second_turn_after``)."""
    from kevin.rollout.prompts import PromptBuilder
    from kevin.rollout.replay import replay_response
    from kevin.tasks import bundled_solution_path

    builder = PromptBuilder(backend, profile=profile, include_example=include_example, system_prompt=system_prompt,
                            style=prompt_style)
    if data_dir is not None:
        chosen = concise_tasks(tasks, backend, data_dir)
        if not chosen:
            raise FileNotFoundError(f"no concise {backend} solution in {Path(data_dir) / backend} for any of the "
                                    f"{len(tasks)} tasks")
        pairs = [(t, concise_solution_path(data_dir, t, backend), CONCISE_REASONING[backend], CONCISE_SUMMARY[backend])
                 for t in chosen]
    else:
        missing = [t.task_id for t in tasks if not bundled_solution_path(t, backend).is_file()]
        if missing:
            raise FileNotFoundError(f"no bundled {backend} reference solution for {missing}")
        pairs = [(t, bundled_solution_path(t, backend), reasoning_text(t, backend), summary_text(backend))
                 for t in tasks]
    examples = []
    for task, path, reasoning, summary in pairs:
        source = path.read_text(encoding="utf-8")
        answer = f"{reasoning}\n\n{replay_response(source, summary)}"
        completion = [{"role": "assistant", "content": answer}]
        examples.append({"prompt": builder.messages(task, []), "completion": completion, "task_id": task.task_id})
        if not second_turn:
            continue
        firsts = []
        if second_turn_after in ("correct", "both"):
            firsts.append((source, summary, None))
        if second_turn_after in ("failed", "both"):
            firsts.append(rejected_first_attempt(task, backend, profile))
        for source, said, judged in firsts:
            examples.append({"prompt": second_turn_messages(builder, task, source, said, judged),
                             "completion": [dict(m) for m in completion], "task_id": task.task_id, "turn": 1})
    return examples


def second_turn_messages(builder: Any, task: Task, source: str, summary: str, judged: Any = None) -> list[dict[str, str]]:
    """The messages of a task's second turn after a first attempt that was ``source`` with ``summary`` and the verdict
    ``judged`` (an ``EvalResult``; None: correct at 1.00x, the context a warm-started policy meets most often, its
    memorised kernel), in the rollout's own wording (``PromptBuilder``, ``feedback_line``)."""
    from kevin.records.evaluation import EvalResult, Status
    from kevin.records.verdicts import feedback_line
    from kevin.rollout.prompts import Attempt

    if judged is None:
        judged = EvalResult(task_id=task.task_id, candidate_id="warm-start", status=Status.CORRECT, speedup=1.0)
    return builder.messages(task, [Attempt(turn=0, kernel=source, summary=summary, feedback=feedback_line(judged))])


REJECTED_SUMMARY = "PyTorch's own operations compute the outputs."
"""The summary of the refused first attempt (``rejected_first_attempt``): what that code does."""


def rejected_first_attempt(task: Task, backend: str, profile: str = "") -> tuple[str, str, Any]:
    """A first attempt that writes no kernel: (its source, its summary, its verdict). The source is the task's own
    PyTorch code with ``Model`` renamed ``ModelNew``, judged by the static rules as the evaluator judges it (a rule
    violation; ValueError if the rules let it through, which would mean they no longer refuse a copy of the
    reference)."""
    import re

    from kevin.evaluation.rules import load_rules, static_hits
    from kevin.records.verdicts import rule_violation_verdict

    reference = task.render(profile) if profile else task.render()
    source = re.sub(r"\bModel\b", "ModelNew", reference)
    hits = static_hits(source, backend, load_rules(), reference)
    if not hits:
        raise ValueError(f"the static rules let {task.task_id}'s own code through as ModelNew")
    return source, REJECTED_SUMMARY, rule_violation_verdict(task.task_id, "warm-start", hits[0].rule_id,
                                                            hits[0].describe(), backend)


def answer_tokens(tokenizer: Any, example: dict[str, Any]) -> int:
    """Tokens of an example's answer as a rollout would generate it: its text, plus the end-of-sequence token."""
    eos = 1 if getattr(tokenizer, "eos_token_id", None) is not None else 0
    return len(tokenizer.encode(example["completion"][-1]["content"], add_special_tokens=False)) + eos


def fit_examples(tokenizer: Any, examples: Sequence[dict[str, Any]],
                 max_response_tokens: int) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """(the examples whose answer fits in ``max_response_tokens``, {task id: answer tokens} of those left out)."""
    kept, dropped = [], {}
    for example in examples:
        n = answer_tokens(tokenizer, example)
        if n <= max_response_tokens:
            kept.append(example)
        else:
            dropped[example.get("task_id", str(len(dropped)))] = n
    return kept, dropped


def example_tokens(tokenizer: Any, examples: Sequence[dict[str, Any]]) -> list[int]:
    """Tokens of each example as the trainer sees it: prompt and answer through the chat template."""
    texts = [tokenizer.apply_chat_template(e["prompt"] + e["completion"], tokenize=False) for e in examples]
    return [len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]


def warm_start_examples(config: Any, tasks: Sequence[Task], tokenizer: Any) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The examples the warm start of run config ``config`` trains on, over the train ``tasks``: its answers (the
    ``sft`` section's data), asked as the rollout asks (backend, profile, prompt style), less those longer than the
    response limit with ``sft.fit_response_limit`` (and, with ``sft.second_turn``, the second turns longer than
    ``sft.max_length`` in all); and {task id: tokens} of those left out."""
    examples = sft_examples(tasks, config.backend, profile=config.profile, system_prompt=config.rollout.system_prompt,
                            include_example=config.rollout.include_example, prompt_style=config.rollout.prompt_style,
                            data_dir=config.sft.data or None, second_turn=config.sft.second_turn,
                            second_turn_after=config.sft.second_turn_after)
    if config.sft.second_turn:
        # A second turn's prompt holds the first attempt too; one longer than sft.max_length would lose the end of
        # its answer to the trainer's cut, and teach the very run-on answer these examples are there to prevent.
        sizes = example_tokens(tokenizer, examples)
        long = {f"{e['task_id']} (turn 2)": n for e, n in zip(examples, sizes) if e.get("turn") and n > config.sft.max_length}
        examples = [e for e, n in zip(examples, sizes) if not (e.get("turn") and n > config.sft.max_length)]
    else:
        long = {}
    if not config.sft.fit_response_limit:
        return examples, long
    kept, dropped = fit_examples(tokenizer, examples, config.max_response_tokens)
    return kept, {**dropped, **long}


FINGERPRINT_SETTINGS = ("epochs", "lr", "batch_size", "max_length", "seed", "lora", "lora_r")
"""The settings that shape what the warm start learns (not where it is written, nor whether it may be reused)."""


def warm_start_fingerprint(config: SFTConfig, examples: Sequence[dict[str, Any]], base: str) -> str:
    """A digest of everything a warm start's result depends on: the examples as the trainer sees them (prompt and
    answer messages, in order), the base model's identity ``base`` and the training settings. Two warm starts
    with the same fingerprint train the same model (up to the hardware's arithmetic)."""
    import hashlib
    import json

    record = {"base": base, "settings": {name: getattr(config, name) for name in FINGERPRINT_SETTINGS},
              "examples": [[e["prompt"], e["completion"]] for e in examples]}
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


def reuse_prebuilt(config: SFTConfig, fingerprint: str, out_dir: str | Path,
                   project_dir: str | Path = ".") -> tuple[dict[str, Any] | None, str]:
    """Copy the warm start of ``sft.prebuilt`` into ``out_dir`` when its fingerprint is ``fingerprint``. Returns
    (its recorded metrics with ``prebuilt`` set to where it came from, "") or (None, why it was not reused)."""
    import json
    import shutil

    if not config.prebuilt:
        return None, "sft.prebuilt is not set"
    folder = Path(config.prebuilt)
    folder = folder if folder.is_absolute() else Path(project_dir) / folder
    record_file = folder / "sft.json"
    if not record_file.is_file() or not (folder / MODEL_DIR).is_dir():
        return None, f"{folder} holds no warm start (sft.json and model/)"
    record = json.loads(record_file.read_text(encoding="utf-8"))
    if record.get("fingerprint") != fingerprint:
        return None, (f"the warm start in {folder} was built from other examples, another base model or other "
                      "settings (its fingerprint differs)")
    target = Path(out_dir) / MODEL_DIR
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(folder / MODEL_DIR, target)
    return {**record, "prebuilt": str(config.prebuilt)}, ""


def run_sft(config: SFTConfig, model: Any, tokenizer: Any, examples: Sequence[dict[str, Any]],
            out_dir: str | Path) -> dict[str, Any]:
    """Fine-tune ``model`` on ``examples`` with TRL's ``SFTTrainer`` (loss on the answers only) and save the model
    and tokenizer to ``<out_dir>/model``. Returns the training metrics (``train_loss``, ``steps``, ``examples``)."""
    import torch
    from datasets import Dataset
    from trl import SFTConfig as TRLConfig
    from trl import SFTTrainer

    too_long = {i: n for i, n in enumerate(example_tokens(tokenizer, examples)) if n > config.max_length}
    if too_long:
        # Cut, an answer would lose its summary (or, past the prompt, all of it: TRL then drops the example).
        raise ValueError(f"{len(too_long)} of {len(examples)} warm-start examples are longer than sft.max_length "
                         f"({config.max_length} tokens; the longest has {max(too_long.values())}): raise "
                         "sft.max_length")
    out_dir = Path(out_dir)
    peft_config = None
    if config.lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=config.lora_r, lora_alpha=2 * config.lora_r, lora_dropout=0.0,
                                 target_modules="all-linear", task_type="CAUSAL_LM")
    args = TRLConfig(
        output_dir=str(out_dir / "trainer"), num_train_epochs=float(config.epochs), learning_rate=float(config.lr),
        per_device_train_batch_size=config.batch_size, max_length=config.max_length, seed=config.seed,
        completion_only_loss=True, save_strategy="no", report_to=[], logging_steps=1, disable_tqdm=True,
        use_cpu=not torch.cuda.is_available(), bf16=False, fp16=False,
    )
    rows = [{"prompt": e["prompt"], "completion": e["completion"]} for e in examples]
    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows),
                         processing_class=tokenizer, peft_config=peft_config)
    result = trainer.train()
    folder = out_dir / MODEL_DIR
    trainer.model.save_pretrained(str(folder))  # with sft.lora a PeftModel: the adapter alone
    tokenizer.save_pretrained(str(folder))
    return {"train_loss": float(result.training_loss), "steps": int(result.global_step), "examples": len(examples),
            "per_epoch": epoch_figures(trainer.state.log_history)}


def epoch_figures(log_history: Sequence[dict[str, Any]]) -> list[dict[str, float]]:
    """TRL's per-step log (loss, the policy's mean entropy on the answers' tokens, token accuracy) as one mean per
    epoch. The entropy at the end says how much the warm start leaves RL to choose between: a warm start that learnt
    its answers by heart (entropy ~0) gives GRPO groups of identical answers (docs/learning.md, "Steps 9-15")."""
    buckets: dict[int, dict[str, list[float]]] = {}
    for row in log_history:
        if "loss" not in row or "epoch" not in row:
            continue  # the run's closing summary (train_loss, runtime) has no per-step figures
        epoch = max(1, math.ceil(float(row["epoch"]) - 1e-9))
        bucket = buckets.setdefault(epoch, {})
        for key, name in (("loss", "loss"), ("entropy", "entropy"), ("mean_token_accuracy", "token_accuracy")):
            if key in row:
                bucket.setdefault(name, []).append(float(row[key]))
    return [{"epoch": epoch, **{name: round(sum(v) / len(v), 4) for name, v in bucket.items()}}
            for epoch, bucket in sorted(buckets.items())]
