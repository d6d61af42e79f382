"""Checkpoints that make a killed run resumable: save, load, resume (functions of a ``GRPOTrainer``).

A checkpoint ``step_NNNNNN`` is written after training step N finished, into a temporary directory renamed
into place (a kill leaves no checkpoint or a complete one). It holds the model (full weights, or the LoRA
adapter only) in safetensors that ``from_pretrained`` and a vLLM server load, the tokenizer, the optimiser
and lr-scheduler state, every RNG state, the resolved config and the caller's ``extra``. Under ZeRO-3 each
process also writes its DeepSpeed partitions, and rank 0 gathers the full weights into ``model/``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from kevin.distributed import barrier
from kevin.training import zero
from kevin.training.rng import rng_state, set_rng_state

if TYPE_CHECKING:  # the trainer imports this module; the type is only needed for annotations
    from kevin.training.trainer import GRPOTrainer

log = logging.getLogger(__name__)

__all__ = ["CHECKPOINT_FORMAT", "STATE_FILE", "latest_checkpoint", "list_checkpoints", "load_checkpoint",
           "load_safetensors_dir", "resume", "save_checkpoint"]

CHECKPOINT_FORMAT = 1
STATE_FILE = "trainer_state.json"


def list_checkpoints(directory: str | Path) -> list[tuple[int, Path]]:
    """Finished checkpoints under ``directory`` as (step, path), oldest first (temp dirs are ignored)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = []
    for path in directory.iterdir():
        if path.is_dir() and path.name.startswith("step_") and (path / STATE_FILE).is_file():
            try:
                found.append((int(path.name[len("step_"):]), path))
            except ValueError:
                continue
    return sorted(found)


def latest_checkpoint(directory: str | Path) -> Path | None:
    found = list_checkpoints(directory)
    return found[-1][1] if found else None


def load_safetensors_dir(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path}: no .safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state


def save_checkpoint(trainer: GRPOTrainer, directory: str | Path, step: int, *,
                    extra: dict[str, Any] | None = None) -> Path:
    """Save everything a resume needs after finishing training step ``step``: ``directory/step_NNNNNN``.

    Holds the model (full weights, or the LoRA adapter only) in safetensors loadable by
    ``from_pretrained`` / a vLLM server, the tokenizer when the trainer has one, optimiser and lr
    scheduler state, python/numpy/torch/CUDA RNG states, the resolved config (JSON) and ``extra``
    (anything torch.save can write, e.g. the policy's sampler state). Written into a temp directory and
    renamed, so a kill leaves either no checkpoint or a complete one; then all but the newest
    ``keep_checkpoints`` are deleted.
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative integer, got {step!r}")
    directory = Path(directory)
    final = directory / f"step_{step:06d}"
    if trainer.engine is not None:
        return _save_zero_checkpoint(trainer, directory, final, step, extra)
    if trainer.rank != 0:  # the weights are the same on every process: the first one writes them
        barrier()
        return final
    directory.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=directory))
    try:
        trainer.model.save_pretrained(str(tmp / "model"))
        _finish_checkpoint(trainer, tmp, final, step, extra, optimizer=trainer.optimizer.state_dict())
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    barrier()  # the others wait for a complete checkpoint before anyone reads it
    return final


def _finish_checkpoint(trainer: GRPOTrainer, tmp: Path, final: Path, step: int, extra: dict[str, Any] | None, *,
                       optimizer: dict[str, Any] | None) -> None:
    """Rank 0: write the tokenizer, scheduler/optimiser, RNG and state files into ``tmp``, rename it to
    ``final``, drop old checkpoints. ``optimizer`` None: its state is in DeepSpeed's files."""
    if trainer.tokenizer is not None:
        trainer.tokenizer.save_pretrained(str(tmp / "model"))
    torch.save({"optimizer": optimizer, "scheduler": trainer.scheduler.state_dict()}, tmp / "optimizer.pt")
    torch.save({"rng": rng_state(), "extra": extra or {}}, tmp / "state.pt")
    state = {"format": CHECKPOINT_FORMAT, "step": step, "optimizer_steps": trainer.optimizer_steps,
             "lora": trainer.config.lora, "zero_stage": trainer.zero_stage, "world_size": trainer.world_size,
             "config": trainer.config.to_dict(), "saved_at": time.time()}
    # The state file goes last: list_checkpoints only counts directories that have it.
    (tmp / STATE_FILE).write_text(json.dumps(state, indent=1) + "\n", encoding="utf-8")
    if final.exists():  # the same step saved again (e.g. a re-run): replace it
        stale = final.parent / f".{final.name}.old-{os.getpid()}"
        os.rename(final, stale)
        shutil.rmtree(stale, ignore_errors=True)
    os.rename(tmp, final)
    for _, old in list_checkpoints(final.parent)[:-trainer.config.keep_checkpoints]:
        shutil.rmtree(old, ignore_errors=True)


def _save_zero_checkpoint(trainer: GRPOTrainer, directory: Path, final: Path, step: int,
                          extra: dict[str, Any] | None) -> Path:
    """Every process writes its partitions (DeepSpeed's files, under ``deepspeed/``); rank 0 gathers the
    full weights into ``model/`` and writes the rest. All processes must call it."""
    # One temp path every process knows without a message: named after the step, cleared by rank 0 first.
    tmp = directory / f".{final.name}.zero.tmp"
    if trainer.rank == 0:
        directory.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    barrier()
    failed = None
    try:
        trainer.engine.save_checkpoint(str(tmp / "deepspeed"), tag=zero.CHECKPOINT_TAG, save_latest=False)
        weights = trainer.engine._zero3_consolidated_16bit_state_dict()  # collective; the full dict on rank 0
        if trainer.rank == 0:
            trainer.model.save_pretrained(str(tmp / "model"), state_dict=weights)
            _finish_checkpoint(trainer, tmp, final, step, extra, optimizer=None)
    except BaseException as exc:  # noqa: BLE001  (re-raised below, after the others are released)
        failed = exc
    barrier()
    if failed is not None:
        if trainer.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise failed
    return final


def load_checkpoint(trainer: GRPOTrainer, path: str | Path) -> dict[str, Any]:
    """Restore model/adapter weights, optimiser, scheduler and RNG from ``path``; returns
    {"step", "optimizer_steps", "config", "extra"} (the trainer's own config is not replaced)."""
    path = Path(path)
    state = json.loads((path / STATE_FILE).read_text(encoding="utf-8"))
    if state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path}: checkpoint format {state.get('format')!r}, this code reads {CHECKPOINT_FORMAT}")
    if bool(state["lora"]) != trainer.config.lora:
        raise ValueError(f"{path}: a {'LoRA' if state['lora'] else 'full fine-tuning'} checkpoint cannot resume "
                         f"a {'LoRA' if trainer.config.lora else 'full fine-tuning'} trainer; match train.lora")
    saved_stage = int(state.get("zero_stage", 0))
    if saved_stage != trainer.zero_stage:
        raise ValueError(f"{path}: saved with ZeRO stage {saved_stage}, this trainer runs stage {trainer.zero_stage}; "
                         "resume with the same train.zero_stage (its model/ folder holds the full weights "
                         "for a fresh start)")
    if trainer.engine is not None:
        if int(state.get("world_size", 1)) != trainer.world_size:  # partitions of another process count
            zero.load_universal(trainer.engine, path)
        else:
            loaded, _ = trainer.engine.load_checkpoint(str(path / "deepspeed"), tag=zero.CHECKPOINT_TAG,
                                                       load_optimizer_states=True, load_lr_scheduler_states=False)
            if loaded is None:
                raise ValueError(f"{path}: DeepSpeed found no checkpoint under deepspeed/{zero.CHECKPOINT_TAG}")
    else:
        _load_weights(trainer, path / "model")
    opt = torch.load(path / "optimizer.pt", map_location=trainer.device, weights_only=True)
    if trainer.engine is None:
        trainer.optimizer.load_state_dict(opt["optimizer"])
    trainer.scheduler.load_state_dict(opt["scheduler"])
    _follow_configured_lr(trainer)
    # Our own file (RNG states are python/numpy objects, which weights_only refuses).
    rest = torch.load(path / "state.pt", map_location="cpu", weights_only=False)
    set_rng_state(rest["rng"])
    trainer.optimizer_steps = int(state["optimizer_steps"])
    return {"step": int(state["step"]), "optimizer_steps": trainer.optimizer_steps, "config": state["config"],
            "extra": rest.get("extra", {})}


def _follow_configured_lr(trainer: GRPOTrainer) -> None:
    """Put the run's configured ``train.lr`` back after the optimiser and scheduler states were loaded.

    Both states carry the lr the checkpoint ran at, so without this a resume with a changed ``train.lr`` would
    silently go on at the old one. The schedule (warmup, decay) continues from its step at the new peak."""
    scheduler, lr = trainer.scheduler, float(trainer.config.lr)
    if all(base == lr for base in scheduler.base_lrs):
        return
    log.warning("train.lr is %g; the checkpoint ran at %s: the run goes on at %g", lr,
                ", ".join(f"{b:g}" for b in sorted(set(scheduler.base_lrs))), lr)
    scheduler.base_lrs = [lr] * len(scheduler.base_lrs)
    for group, factor in zip(scheduler.optimizer.param_groups, scheduler.lr_lambdas):
        group["initial_lr"] = lr
        group["lr"] = lr * factor(scheduler.last_epoch)
    scheduler._last_lr = [group["lr"] for group in scheduler.optimizer.param_groups]


def _load_weights(trainer: GRPOTrainer, model_dir: Path) -> None:
    weights = load_safetensors_dir(model_dir)
    if trainer.config.lora:
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(trainer.model, weights)
        if getattr(result, "unexpected_keys", None):
            raise ValueError(f"{model_dir}: adapter weights that this model does not have: {result.unexpected_keys[:5]}")
        return
    missing, unexpected = trainer.model.load_state_dict(weights, strict=False)
    if unexpected:
        raise ValueError(f"{model_dir}: weights that this model does not have: {unexpected[:5]}")
    # save_pretrained writes a tied weight (e.g. lm_head = embed_tokens) once; anything else missing is an error.
    params = dict(trainer.model.named_parameters(remove_duplicate=False))
    loaded_ptrs = {params[k].data_ptr() for k in weights if k in params}
    untied = [k for k in missing if k not in params or params[k].data_ptr() not in loaded_ptrs]
    if untied:
        raise ValueError(f"{model_dir}: the checkpoint lacks weights {untied[:5]}")


def resume(trainer: GRPOTrainer, directory: str | Path) -> int:
    """Load the newest checkpoint under ``directory`` and return the next step to run (0 if none).

    A checkpoint named step N was saved after step N finished, so the run continues at N + 1 and
    replays no finished step.
    """
    path = latest_checkpoint(directory)
    if path is None:
        return 0
    state = load_checkpoint(trainer, path)
    trainer.resumed_extra = state["extra"]
    log.info("resumed from %s: next step %d", path, state["step"] + 1)
    return state["step"] + 1
