"""Background jobs: the supervisor that owns them, their records, their completion notes.

A job lives in the supervisor's nursery, not in the run that started it, so it outlives a
stop; its result reaches the agent's next turn as a note.
"""

from .task_jobs import task_info as task_info
from .task_notes import NOTES_SCOPE as NOTES_SCOPE
from .task_notes import JobNote as JobNote
from .task_notes import collect_notes as collect_notes
from .task_notes import note_entry as note_entry
from .task_notes import record_note as record_note
from .task_notes import remove_notes as remove_notes
from .task_notes import trim_notes as trim_notes
from .task_supervisor import RUNNING_SCOPE as RUNNING_SCOPE
from .task_supervisor import Job as Job
from .task_supervisor import TaskSupervisor as TaskSupervisor
