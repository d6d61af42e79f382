"""What the rollout and the training code call on a policy, as named protocols.

Every backend (``HFPolicy``, ``OpenAIPolicy``) and every wrap of one (``kevin.rollout.replay.ReferenceReplay``) is a
``Policy``. The protocols are split by what a caller needs, because the rollout and the step engine also accept
smaller stand-ins (a test's fake generator, the training-step benchmark's ``ReplayPolicy``):

    Generate        one response per prompt, in order             the rollout (every stage that generates)
    Sampling        ``config.temperature``: how it samples          the trainer's temperature check
    LengthLimited   the response length limit, and a setter        a length schedule; the Dr-GRPO length check
    Policy          all of the above, plus its sampler state        a training run (checkpoints, resume, close)
                    (``state_dict``/``load_state_dict``) and
                    ``close`` (connections, pools)

The smaller ones are ``runtime_checkable``: the step engine checks what it was given (``isinstance``) instead of
probing attributes. Only members are checked at run time, not their signatures.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

from kevin.records.generation import GenerationOut, Prompt

__all__ = ["Generate", "LengthLimited", "Policy", "PolicyWrapper", "Sampling", "SamplingSettings", "Tokenizing"]


class Generate(Protocol):
    """A policy backend: one response per prompt, in order (``kevin.policy``'s backends, or a test's fake)."""

    def __call__(self, prompts: list[Prompt]) -> list[GenerationOut]: ...


class SamplingSettings(Protocol):
    """The part of a backend's config (``SamplingConfig``, ``OpenAIConfig``) the trainer must agree with."""

    temperature: float


@runtime_checkable
class Sampling(Protocol):
    """A policy that says how it samples: the trainer's log-probs must be taken at the same temperature."""

    @property
    def config(self) -> SamplingSettings: ...


@runtime_checkable
class LengthLimited(Protocol):
    """A policy with a response length limit that a length schedule may change between steps."""

    @property
    def max_response_tokens(self) -> int: ...

    def set_max_response_tokens(self, tokens: int) -> None: ...


@runtime_checkable
class Tokenizing(Protocol):
    """A policy that renders and tokenizes its prompts itself (in-process models): the step engine borrows its
    tokenizer when none is given. A served model (``OpenAIPolicy``) has none."""

    tokenizer: Any


@runtime_checkable
class Policy(Sampling, LengthLimited, Protocol):
    """Everything a training run calls on its policy (``kevin.experiment.run.TrainingRun``)."""

    def __call__(self, prompts: Sequence[Prompt | str]) -> list[GenerationOut]: ...

    def state_dict(self) -> dict[str, Any]:
        """The sampler's state (RNG, request count), saved with every checkpoint and every generated turn."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def close(self) -> None:
        """Release connections or pools; a no-op for an in-process model."""
        ...


class PolicyWrapper:
    """A base for a wrap of a policy (its ``policy``) that passes through what the trainer and a length schedule ask
    of it: the sampling config (the trainer checks the temperature against its own), the tokenizer and the response
    limit. A wrap that answers some prompts itself overrides ``max_response_tokens`` when its answers may be longer."""

    policy: Any

    @property
    def config(self) -> Any:
        return self.policy.config

    @property
    def tokenizer(self) -> Any:
        return self.policy.tokenizer

    @property
    def max_response_tokens(self) -> int:
        return self.policy.max_response_tokens

    def set_max_response_tokens(self, tokens: int) -> None:
        self.policy.set_max_response_tokens(tokens)

