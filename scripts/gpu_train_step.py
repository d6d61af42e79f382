"""One step of the training flow on a GPU with the 0.5B preset: seconds per phase, for one device call.

    bash scripts/gpu_train_step.sh                      # on the GPU machine; the report lands in $OUT
    python3 scripts/gpu_train_step.py --preset tiny --backend cpu --out /tmp/step     # the same on a CPU, small

The device machine has no model hub, and neither Prefect nor MLflow, so this script
1. builds the model in-process (``kevin.policy.builders``: a byte-level BPE tokenizer trained on the bundled tasks
   and their prompts, a randomly initialised Qwen2 with Qwen2.5-0.5B's widths) and saves it as a model folder;
2. runs the steps of ``flows/train.py`` in the flow's order by calling ``kevin.experiment.run.TrainingRun`` itself
   (the flow's tasks are those methods), with tracking off;
3. prints every phase's seconds, the update's throughput and the step's report, and writes them to ``--out``.
A random model writes no kernel, so half of each task's trajectories replay the task's bundled reference solution
(``policy.wrap: kevin.rollout.replay:replay_references``): the evaluator then judges real kernels and the update
has non-zero advantages to train on.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", choices=["0.5b", "tiny"], default="0.5b")
    ap.add_argument("--backend", choices=["cuda", "cpu"], default="cuda", help="evaluator backend and train device")
    ap.add_argument("--tasks", type=int, default=4, help="tasks in the step (default 4)")
    ap.add_argument("--trajectories", type=int, default=4, help="trajectories per task (default 4)")
    ap.add_argument("--turns", type=int, default=2, help="turns per trajectory (default 2)")
    ap.add_argument("--max-response-tokens", type=int, default=512, help="response length limit (default 512)")
    ap.add_argument("--waves", type=int, default=1, help="experiment.rollout_waves: 2 judges one half of the trajectories "
                    "while the other half generates (default 1)")
    ap.add_argument("--vocab-size", type=int, default=16384)
    ap.add_argument("--out", default="outputs/gpu_train_step", help="the run's folder; report.md and step.json go here")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="more params overrides, e.g. --set train.lora=true")
    return ap.parse_args(argv)


def build_model_folder(preset: str, vocab_size: int, folder: Path, device: str) -> tuple[float, int]:
    """Tokenizer and random model of ``preset`` saved to ``folder``; (seconds, parameters)."""
    from kevin.policy.builders import build_model, build_tokenizer, model_config
    from kevin.rollout.replay import tokenizer_corpus
    from kevin.tasks import load_bundled_suite
    from kevin.training.rng import seed_everything

    start = time.perf_counter()
    seed_everything(0)
    suite = load_bundled_suite()
    tokenizer = build_tokenizer(tokenizer_corpus(suite, "cuda") + tokenizer_corpus(suite, "cpu"), vocab_size)
    model = build_model(model_config(preset, len(tokenizer), tokenizer), device)
    model.generation_config.do_sample = True
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return time.perf_counter() - start, sum(p.numel() for p in model.parameters())


def longest_reference(config, model_dir: Path) -> int:
    """Tokens of the longest bundled reference solution of the run's training tasks, as the trainer scores it."""
    from transformers import AutoTokenizer

    from kevin.experiment.splits import train_tasks
    from kevin.rollout.replay import longest_response_tokens, reference_responses

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return longest_response_tokens(tokenizer, reference_responses(train_tasks(config), config.backend))


def run_step(run) -> None:
    """Step 0, in the order of ``flows/train.py``'s ``_run_step``: waves as there, each wave's parse and evaluate in a
    thread beside the next generation (Prefect's thread-pool task runner does the same in the flow)."""
    from concurrent.futures import ThreadPoolExecutor

    from kevin.rollout.waves import run_waves

    run.sample_batch(0)
    with ThreadPoolExecutor(max_workers=run.waves) as pool:
        run_waves(run.waves, run.turns, lambda wave, turn: run.generate(0, turn, wave) is not None,
                  lambda wave, turn: pool.submit(lambda: (run.parse(0, turn, wave), run.evaluate(0, turn, wave))[1]))
    run.aggregate(0)
    run.update(0)
    run.check_collapse(0)
    run.checkpoint(0)
    run.sync_weights(0)
    run.track(0)


def main(argv: list[str] | None = None) -> int:
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    import torch

    from kevin.config import RunConfig
    from kevin.experiment.files import step_dir
    from kevin.experiment.progress import RichProgress
    from kevin.experiment.run import TrainingRun

    args = parse_args(argv)
    out = Path(args.out).resolve()
    device = "cuda" if args.backend == "cuda" else "cpu"
    model_dir = out / "model"
    build_s, params = build_model_folder(args.preset, args.vocab_size, model_dir, device)
    overrides = [
        f"backend={args.backend}", f"max_response_tokens={args.max_response_tokens}", "response_length_schedule={}",
        "experiment.name=gpu-train-step", f"experiment.output_dir={out / 'run'}", "experiment.steps=1",
        f"experiment.tasks_per_batch={args.tasks}", f"experiment.rollout_waves={args.waves}",
        "policy.backend=hf", f"policy.model={model_dir}", "policy.wrap=kevin.rollout.replay:replay_references",
        f"rollout.trajectories={args.trajectories}", f"rollout.turns={args.turns}", "tracking.enabled=false",
        f"train.device={device}", f"sampling.batch_size={args.tasks * args.trajectories}", *args.overrides,
    ]
    config = RunConfig.from_files([REPO / "params.yaml"], overrides)
    longest = longest_reference(config, model_dir)
    if longest > args.max_response_tokens:
        # The replayed references are longer than the sampling limit, and the trainer must accept them: a raise of
        # the accepted length at a step the run never reaches changes neither the sampling limit nor the loss's
        # Dr-GRPO constant (both stay --max-response-tokens).
        config = RunConfig.from_files([REPO / "params.yaml"], [*overrides, f"response_length_schedule={{1000000: {longest}}}"])
    run = TrainingRun(config, project_dir=REPO, progress=RichProgress())
    start = time.perf_counter()
    try:
        run.open()
        opened = time.perf_counter() - start
        run_step(run)
    except BaseException as exc:
        run.close(exc)
        raise
    run.close()
    folder = step_dir(run.out_dir, 0)
    summary = json.loads((folder / "summary.json").read_text())
    update = summary["update"]
    tokens = sum(m.get("tokens_per_s", 0.0) for m in update) / max(1, len(update))
    figures = {"preset": args.preset, "parameters": params, "waves": args.waves, "device": torch.cuda.get_device_name() if device == "cuda"
               else "cpu", "torch": torch.__version__, "build_model_s": round(build_s, 1),
               "open_s": round(opened, 1), "seconds": summary["seconds"], "update_tokens_per_s": round(tokens, 1),
               "verdicts": summary["verdicts"], "turns": summary["turns"], "peak_gpu_gb":
               round(torch.cuda.max_memory_allocated() / 2**30, 2) if device == "cuda" else 0.0}
    (out / "step.json").write_text(json.dumps(figures, indent=1) + "\n")
    report = (folder / "report.md").read_text()
    (out / "report.md").write_text(report)
    print(json.dumps(figures, indent=1))
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
