"""Runs that start by themselves: due schedules, and background results that wake the agent.

A failure with no session to show it in reaches the user's clients as a notice.
"""

from .schedules import Scheduler as Scheduler
from .schedules import ScheduleSpec as ScheduleSpec
from .schedules import notify_schedule_run as notify_schedule_run
from .wake import Waker as Waker
