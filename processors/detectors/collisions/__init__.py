"""Cross-trace collisions on one row: lost update, invariant violation, duplicate apply, write skew."""

from processors.detectors.collisions.config import CollisionConfig
from processors.detectors.collisions.detector import CollisionDetector
from processors.detectors.collisions.factory import FACTORY
from processors.detectors.collisions.views import Collision, fingerprint

__all__ = ["FACTORY", "Collision", "CollisionConfig", "CollisionDetector", "fingerprint"]
