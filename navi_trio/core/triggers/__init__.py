"""Runs that start by themselves: due schedules, and background results that wake the agent.

A failure with no session to show it in reaches the user's clients as a notice.
"""
