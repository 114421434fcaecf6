"""The claims the course tests (shared/notes/claims.md), and their verdicts on this machine.

A lesson measures something, decides in a visible cell whether a claim held, and records a
`Verdict`; `claims_table` renders a list of them. The claim texts live here once so that every
lesson and the ledger of lesson 03 cite the same words under the same IDs.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

__all__ = ["CLAIMS", "STATUSES", "Verdict", "claims_table"]

#: Claim ID -> the claim as popular tutorials state it.
CLAIMS: dict[str, str] = {
    "C1": 'bf16 autocast gives a "free 1.5-2x" speed-up over fp32 on Ampere+ GPUs',
    "C2": "bf16 autocast cuts training memory about 50%",
    "C3": "torch.compile adds another ~1.5-2x on top of bf16",
    "C4": 'gradient checkpointing drops memory 50-70% ("frees 70%")',
    "C5": "gradient checkpointing costs about 20-33% more time (one extra forward)",
    "C6": "checkpointing turns activation memory from O(N) into O(sqrt(N)) in the number of layers",
    "C7": "gradient checkpointing makes training faster",
    "C8": "checkpointing stores the model's parameters and state at checkpoints",
    "C9": "mixed-precision AdamW needs 16 bytes per parameter, plus 20-30% overhead",
    "C10": "a 7B model needs 28 GB for fp32 weights and 84 GB for Adam states",
    "C11": "fp16 gradients underflow without loss scaling; loss scaling fixes it",
    "C12": "dynamic loss scaling halves and skips the step on inf/NaN, doubles after N clean steps",
    "C13": "bf16 needs no loss scaling because it has fp32's exponent range",
    "C14": "non-reentrant checkpointing is the recommended mode; reentrant has limitations",
    "C15": "attention activation memory is O(seq^2)",
    "C16": "T4/V100 need fp16 + GradScaler; Ampere+ should use bf16 without a scaler",
    "C17": "gradient accumulation: divide the loss by the micro-batches; no extra memory",
    "C18": "with a scaler, unscale_ must precede gradient clipping",
    "C19": "FP8 (Transformer Engine, Hopper+) gives up to 2x over bf16",
    "C20": "checkpointing frees memory for a larger batch that can outweigh the recompute cost",
}

#: Allowed statuses: held, failed, depends (on hardware or setting), untested (here).
STATUSES = ("held", "failed", "depends", "untested")


@dataclass(frozen=True)
class Verdict:
    """What this machine's numbers say about one claim.

    Attributes:
        claim: the claim ID (``"C2"``).
        status: one of `STATUSES`.
        evidence: the measured or computed numbers behind the status, in words.
        where: the lesson and section that tests it (e.g. ``"01 §6"``).

    Raises:
        ValueError: an unknown claim ID or status.
    """

    claim: str
    status: str
    evidence: str
    where: str = ""

    def __post_init__(self):
        if self.claim not in CLAIMS:
            raise ValueError(f"unknown claim {self.claim!r}: expected one of {', '.join(CLAIMS)}.")
        if self.status not in STATUSES:
            raise ValueError(f"unknown status {self.status!r}: expected one of "
                             f"{', '.join(STATUSES)}.")


def claims_table(verdicts) -> pd.DataFrame:
    """A table of verdicts (claim, the claim's text, status, evidence, where), in claim order."""
    rows = [{"claim": v.claim, "says": CLAIMS[v.claim], "status": v.status,
             "evidence": v.evidence, "where": v.where} for v in verdicts]
    df = pd.DataFrame(rows, columns=["claim", "says", "status", "evidence", "where"])
    order = {c: i for i, c in enumerate(CLAIMS)}
    return df.sort_values("claim", key=lambda s: s.map(order)).set_index("claim")
