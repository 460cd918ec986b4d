"""Several daemons on one database: routing, calls to a session's owner, relayed frames,
failover.
"""

from .broadcast_relay import RelayBroadcast as RelayBroadcast
from .cluster import Cluster as Cluster
