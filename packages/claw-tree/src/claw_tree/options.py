"""How a forest becomes samples: one frozen options object for RL and SFT packing.

:class:`SampleOptions` is what :func:`~claw_tree.samples.build_samples` (``algo`` one of
:data:`ALGOS`) and :func:`~claw_tree.sft.build_sft_samples` (``algo="sft"``) read; the flags of
``claw-tree samples`` and ``claw-tree sft-samples`` map onto its fields one to one.
"""

from __future__ import annotations

from typing import Any

import attrs

from claw_tree.advantages import GAE_LEVEL, GAMMA, LAM
from claw_tree.errors import ClawError

ALGOS = ("grpo", "ppo", "rloo", "reinforce")
GROUP_BY = ("group", "task", "task+harness")
PATH_WEIGHTING = ("token", "rollout", "path")
GAE_LEVELS = ("token", "turn")
PACKS = ("session", "group", "batch")
SFT_WEIGHTING = ("token", "path")
SFT_PACKS = PACKS


def _one_of(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ClawError(f"{name} must be one of {allowed}, got {value!r}")


@attrs.frozen(kw_only=True)
class SampleOptions:
    """The options of one batch of samples (validated on construction, :class:`ClawError`).

    Packing, shared by RL and SFT:

    * ``pack``: ``"session"`` (one tree per session), ``"group"`` (the sessions of a group in
      one tree whose shared context prefix appears once) or ``"batch"`` (the sessions of every
      group and task of one harness in one tree: the harness's system prompt and tools appear
      once per sample, not once per group). SFT has no groups: ``"group"`` and ``"batch"`` both
      put every session in one tree.
    * ``max_tokens``: samples of at most this many tokens (sessions packed together, a larger
      session split into whole root-to-leaf paths); ``None``: one sample per session or group.
    * ``id_prefix``: sample ids are ``f"{id_prefix}-{k}"``; ``None`` (or empty): the algo name.
    * ``weighting``: how a trajectory's loss weight spreads over its tokens. RL (``--path-weighting``):
      ``"token"``, ``"rollout"`` or ``"path"``; SFT (``--weighting``): ``"token"`` or ``"path"``.

    Advantages, RL only: ``algo`` (``"grpo"``, ``"ppo"``, ``"rloo"``, ``"reinforce"``; ``"sft"``
    for :func:`~claw_tree.sft.build_sft_samples`), ``group_by`` (the key of a group: the outcome's
    ``group``, ``task`` or ``task+harness``), ``scale_by_std`` (GRPO), ``baseline`` (REINFORCE),
    ``gamma`` / ``lam`` / ``gae_level`` (PPO's GAE). SFT only: ``passed_only`` (keep only
    rollouts that passed: rejection-sampling fine-tuning).
    """

    algo: str = "grpo"
    group_by: str = "group"
    scale_by_std: bool = True
    weighting: str = "token"
    max_tokens: int | None = None
    pack: str = "session"
    gamma: float = GAMMA
    lam: float = LAM
    gae_level: str = GAE_LEVEL
    baseline: float = 0.0
    id_prefix: str | None = None
    passed_only: bool = False

    def __attrs_post_init__(self) -> None:
        sft = self.algo == "sft"
        _one_of("algo", self.algo, (*ALGOS, "sft"))
        _one_of("group_by", self.group_by, GROUP_BY)
        _one_of(
            "weighting" if sft else "path_weighting",
            self.weighting,
            SFT_WEIGHTING if sft else PATH_WEIGHTING,
        )
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ClawError("max_tokens must be positive")
        _one_of("pack", self.pack, SFT_PACKS if sft else PACKS)
        _one_of("gae_level", self.gae_level, GAE_LEVELS)
        if self.passed_only and not sft:
            raise ClawError("passed_only is an SFT option (algo='sft')")

    @property
    def prefix(self) -> str:
        """The sample id prefix: ``id_prefix``, or the algo name."""
        return self.id_prefix or self.algo

    @classmethod
    def resolve(
        cls, options: SampleOptions | None, fields: dict[str, Any], **base: Any
    ) -> SampleOptions:
        """``options`` (or the defaults updated with ``base``) with ``fields`` replaced.

        The keyword form of :func:`~claw_tree.samples.build_samples` (``path_weighting=``) and
        :func:`~claw_tree.sft.build_sft_samples` goes through here; an unknown name is a TypeError.
        """
        fields = dict(fields)
        if "path_weighting" in fields:
            fields["weighting"] = fields.pop("path_weighting")
        if options is None:
            return cls(**{**base, **fields})
        return attrs.evolve(options, **fields) if fields else options
