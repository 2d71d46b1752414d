"""Proof contracts and the proof judge: whether a deployed build really fixed its defect."""

from processors.connectors.proofs.config import ProofConfig
from processors.connectors.proofs.desk import FACTORY, ProofDesk
from processors.connectors.proofs.judge import ProofJudge
from processors.connectors.proofs.verdicts import FIXED, INSUFFICIENT, NOT_FIXED, WORSE

__all__ = ["FACTORY", "FIXED", "INSUFFICIENT", "NOT_FIXED", "WORSE", "ProofConfig", "ProofDesk", "ProofJudge"]
