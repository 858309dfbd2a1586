"""Block tiers below host memory: local disk and Redis, composed under the host tier."""

from kvtier.tiers.base import BlockTier, LatencyHistogram, TierStats, encode_key

__all__ = ["BlockTier", "LatencyHistogram", "TierStats", "encode_key"]
