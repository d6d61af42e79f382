"""Generation tokens/s: our in-process backend (``HFPolicy``) against transformers' own ``generate``.

    python3 benchmarks/bench_generate.py --device cuda --preset 0.5b --out docs/bench_generate_h200.md
    python3 benchmarks/bench_generate.py --device cpu --preset tiny --out /tmp/gen.md   # a CPU smoke run

The same prompts (the bundled tasks' first- and second-turn prompts, cycled to the batch size, so their
lengths differ and left padding is real) and the same batch go through:
- `kevin`: ``HFPolicy`` as a run uses it (static cache; on CUDA the decode step is a CUDA graph);
- `kevin, no CUDA graph` (CUDA only, unless ``--no-eager-step``) and, with ``--compile``, `kevin + torch.compile`
  (``sampling.compile``, which the gpu profile turns on: what a GPU training run samples with);
- `kevin reference loop`: the loop this backend had before the static path (``static_cache: false``),
  timed on ``--reference-tokens`` tokens only, since it is slow;
- `transformers generate (static)`: ``model.generate(..., cache_implementation="static")``, which on
  CUDA compiles the decode step itself; same sampling (temperature, top_p, no top-k), same limit.
Each is called once to warm up (compilation, graph capture; reported as "first call") and then timed
``--repeats`` times. The model is built in-process (``kevin.policy.builders``: random weights, no hub),
in bfloat16 on CUDA (``--dtype``); a random model rarely ends a response, so responses run to the limit.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from anywhere: `kevin` is the checkout's package
    sys.path.insert(0, str(REPO))

from benchmarks.common import print_and_save

DEFAULT_TASKS = "level1/01_relu,level2/01_linear_relu_add_bias,level1/02_gelu,level2/05_matmul_scale_residual"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    from kevin.policy.builders import PRESETS

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="", help="model size (default: 0.5b on cuda, tiny on cpu)")
    ap.add_argument("--layers", type=int, default=0, help="override the preset's layer count")
    ap.add_argument("--vocab-size", type=int, default=16384)
    ap.add_argument("--batch", default="", help="comma-separated batch sizes (default: 4,32 on cuda, 4 on cpu)")
    ap.add_argument("--max-new-tokens", type=int, default=0, help="response limit (default: the preset's)")
    ap.add_argument("--temperature", type=float, default=0.9)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="",
                    help="weights (default bf16 on cuda, fp32 on cpu; fp32 on cuda samples under bf16 autocast)")
    ap.add_argument("--stop-check-every", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=2, help="timed calls per backend and batch (default 2)")
    ap.add_argument("--reference-tokens", type=int, default=0,
                    help="response limit of the old reference loop's run (default: 64 on cuda, the limit on cpu; 0 skips it "
                         "with --no-reference)")
    ap.add_argument("--no-reference", action="store_true", help="skip the reference loop")
    ap.add_argument("--no-transformers", action="store_true", help="skip transformers' generate")
    ap.add_argument("--compile", action="store_true", help="also time our backend with sampling.compile")
    ap.add_argument("--no-eager-step", action="store_true",
                    help="skip 'kevin, no CUDA graph' (the decode step launched from Python: slow, for comparison only)")
    ap.add_argument("--tasks", default=DEFAULT_TASKS, help="bundled tasks whose prompts are used")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="", help="markdown report path (a .json of the figures goes next to it)")
    args = ap.parse_args(argv)
    cuda = args.device.startswith("cuda")
    if not (args.device == "cpu" or cuda):
        ap.error(f"--device must be cpu, cuda or cuda:N, got {args.device!r}")
    import torch

    if cuda and not torch.cuda.is_available():
        ap.error(f"--device {args.device} but torch sees no CUDA GPU; use --device cpu --preset tiny")
    args.preset = args.preset or ("0.5b" if cuda else "tiny")
    args.dtype = args.dtype or ("bf16" if cuda else "fp32")
    try:
        args.batches = [int(b) for b in (args.batch or ("4,32" if cuda else "4")).split(",")]
    except ValueError:
        ap.error(f"--batch must be comma-separated integers, got {args.batch!r}")
    if any(b < 1 for b in args.batches):
        ap.error("every --batch size must be >= 1")
    args.max_new_tokens = args.max_new_tokens or PRESETS[args.preset]["max_new_tokens"]
    if args.reference_tokens == 0:
        args.reference_tokens = 64 if cuda else args.max_new_tokens
    for name in ("max_new_tokens", "repeats", "stop_check_every", "reference_tokens", "vocab_size"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.temperature <= 0:
        ap.error("--temperature must be > 0 (sampling, not greedy decoding, is measured)")
    return args


def bench_prompts(tasks: Sequence[Any], backend: str, tokenizer: Any) -> list[list[int]]:
    """Token ids of each task's first-turn prompt and of a second-turn prompt (with one earlier attempt)."""
    from kevin.rollout.prompts import Attempt, render_messages, resolved_profile, turn_user_message

    profile = resolved_profile(backend)
    out = []
    for task in tasks:
        source = task.render(profile)
        attempt = Attempt(turn=0, kernel=source, summary="A first try.", feedback="Correct; 1.0x the reference.")
        for attempts in ([], [attempt]):
            text = render_messages([{"role": "user", "content": turn_user_message(source, backend, attempts)}], tokenizer)
            out.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from kevin.policy.builders import build_model, build_tokenizer, learned_tokens, model_config
    from kevin.policy.hf import HFPolicy, SamplingConfig
    from kevin.policy.speed import hf_generate_runner, measure, policy_runner
    from kevin.rollout.replay import tokenizer_corpus
    from kevin.training.rng import seed_everything

    sys.path.insert(0, str(REPO / "benchmarks"))
    from bench_train_step import device_name, select_tasks

    tasks = select_tasks(args.tasks)
    backend = "cuda" if args.device.startswith("cuda") else "cpu"
    seed_everything(args.seed)
    t = time.perf_counter()
    tokenizer = build_tokenizer(tokenizer_corpus(tasks, backend), args.vocab_size)
    config = model_config(args.preset, len(tokenizer), tokenizer, args.layers)
    model = build_model(config, args.device).eval()
    if args.dtype == "bf16":
        model = model.to(torch.bfloat16)
    setup_s = time.perf_counter() - t
    prompts = bench_prompts(tasks, backend, tokenizer)
    eos = [tokenizer.eos_token_id]

    def sampling(**kw: Any) -> SamplingConfig:
        base = dict(temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.max_new_tokens, batch_size=0,
                    seed=args.seed, stop_check_every=args.stop_check_every)
        return SamplingConfig(**{**base, **kw})

    variants: list[tuple[str, Any]] = [("kevin", policy_runner(HFPolicy(model, tokenizer, sampling())))]
    if backend == "cuda":
        if not args.no_eager_step:
            variants.append(("kevin, no CUDA graph", policy_runner(HFPolicy(model, tokenizer, sampling(cuda_graph=False)))))
        if args.compile:
            variants.append(("kevin + torch.compile", policy_runner(HFPolicy(model, tokenizer, sampling(compile=True)))))
    if not args.no_reference:
        ref = HFPolicy(model, tokenizer, sampling(static_cache=False, max_new_tokens=args.reference_tokens))
        variants.append((f"kevin reference loop ({args.reference_tokens} tokens)", policy_runner(ref)))
    if not args.no_transformers:
        variants.append(("transformers generate (static)", hf_generate_runner(
            model, pad_id=tokenizer.pad_token_id, eos_ids=eos, max_new_tokens=args.max_new_tokens,
            temperature=args.temperature, top_p=args.top_p, seed=args.seed)))

    rows = []
    for batch in args.batches:
        batch_prompts = [prompts[i % len(prompts)] for i in range(batch)]
        for name, runner in variants:
            try:
                m = measure(name, runner, batch_prompts, args.device, args.repeats).to_dict()
            except Exception as exc:  # noqa: BLE001 - one failing backend must not hide the others' figures
                m = {"name": name, "batch": batch, "error": f"{type(exc).__name__}: {exc}"[:300]}
            m["prompt_tokens"] = [min(len(p) for p in batch_prompts), max(len(p) for p in batch_prompts)]
            rows.append(m)
            print(json.dumps({k: v for k, v in m.items() if k not in ("seconds", "tokens")}), flush=True)
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": args.command,
        "device": device_name(args.device),
        "versions": _versions(),
        "model": {"preset": args.preset, "parameters": sum(p.numel() for p in model.parameters()),
                  "layers": config.num_hidden_layers, "hidden": config.hidden_size, "vocab_size": config.vocab_size,
                  "dtype": args.dtype, "learned_tokens": learned_tokens(tokenizer)},
        "settings": {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "top_p": args.top_p,
                     "stop_check_every": args.stop_check_every, "repeats": args.repeats,
                     "tasks": [t.task_id for t in tasks], "setup_s": setup_s},
        "rows": rows,
    }


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for pkg in ("torch", "transformers"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def _find(rows: list[dict[str, Any]], batch: int, name: str) -> dict[str, Any] | None:
    """The row of ``batch`` whose backend is ``name`` (or, for the reference loop and transformers, starts with it)."""
    exact = name in ("kevin", "kevin + torch.compile")
    return next((r for r in rows if r["batch"] == batch and "error" not in r
                 and (r["name"] == name if exact else r["name"].startswith(name))), None)


def render_markdown(f: dict[str, Any]) -> str:
    m, s = f["model"], f["settings"]
    lines = [
        f"# Generation throughput: kevin's HFPolicy vs transformers' generate ({f['date']})", "",
        f"command: `{f['command']}`", "",
        f"device: {f['device']}; versions: " + ", ".join(f"{k} {v}" for k, v in f["versions"].items()), "",
        (f"model: random-init Qwen2, preset `{m['preset']}`, {m['parameters']:,} parameters, {m['layers']} layers, "
         f"hidden {m['hidden']}, vocabulary {m['vocab_size']}, weights {m['dtype']}"), "",
        (f"sampling: temperature {s['temperature']}, top_p {s['top_p']}, no top-k, up to {s['max_new_tokens']} new "
         f"tokens; our host reads 'all ended' every {s['stop_check_every']} tokens; prompts: first- and second-turn "
         f"prompts of {', '.join(s['tasks'])}, cycled to the batch size; {s['repeats']} timed calls after one warm-up"),
        "", "## Side by side", "",
        ("| batch | prompt tokens | kevin tokens/s | kevin + torch.compile tokens/s | transformers generate (static) "
         "tokens/s | best kevin / transformers | kevin reference loop tokens/s | kevin / reference loop |"),
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for batch in dict.fromkeys(r["batch"] for r in f["rows"]):
        ours, compiled, hf, ref = (_find(f["rows"], batch, p) for p in
                                   ("kevin", "kevin + torch.compile", "transformers", "kevin reference"))
        best = max((r for r in (ours, compiled) if r), key=lambda r: r["tokens_per_s"], default=None)
        any_row = next(r for r in f["rows"] if r["batch"] == batch)
        lo, hi = any_row["prompt_tokens"]

        def tps(r: dict[str, Any] | None) -> str:
            return f"{r['tokens_per_s']:.0f}" if r else "-"

        def ratio(a: dict[str, Any] | None, b: dict[str, Any] | None) -> str:
            return f"{a['tokens_per_s'] / b['tokens_per_s']:.2f}x" if a and b and b["tokens_per_s"] else "-"

        lines.append(f"| {batch} | {lo}-{hi} | {tps(ours)} | {tps(compiled)} | {tps(hf)} | {ratio(best, hf)} | "
                     f"{tps(ref)} | {ratio(ours, ref)} |")
    lines += ["", "## Every backend", "",
              "| backend | batch | tokens (timed calls) | seconds | tokens/s | ms per step | first call s | peak GiB |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in f["rows"]:
        if "error" in r:
            lines.append(f"| {r['name']} | {r['batch']} | failed: {r['error']} | | | | | |")
            continue
        lines.append(f"| {r['name']} | {r['batch']} | {sum(r['tokens'])} | {sum(r['seconds']):.2f} | "
                     f"{r['tokens_per_s']:.1f} | {r['ms_per_step']:.2f} | {r['first_call_s']:.2f} | {r['peak_gb']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    args.command = shlex.join(["python3", *sys.argv] if argv is None else ["python3", "benchmarks/bench_generate.py", *argv])
    figures = run(args)
    print_and_save(render_markdown(figures), args.out)
    if args.out:
        js = Path(args.out).with_suffix(".json")
        js.write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {args.out} and {js}")
    return figures


if __name__ == "__main__":
    main()
