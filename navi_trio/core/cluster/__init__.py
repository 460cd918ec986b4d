"""Several daemons on one database: routing, calls to a session's owner, relayed frames,
failover.
"""
