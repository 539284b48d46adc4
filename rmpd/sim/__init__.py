"""The deterministic simulator: RMP processes over a virtual network with loss, duplication, reordering,
partitions, crashes and restarts, checked by an invariant checker."""

QOS_CHOICES = ("unreliable", "unordered", "source", "total", "k2", "k3", "majority", "safe", "mixed")
"""What ``rmp sim --qos`` takes: a QoS name, or ``mixed`` for every one of them in turn."""
