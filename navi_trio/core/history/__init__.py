"""A session's history: where it can go back to, rewind and fork.

Built on the checkpoint engine for files and on the store for the conversation; every
client reaches it through the session's actor.
"""

from .changes import Changes as Changes
from .changes import session_changes as session_changes
from .fork import NewFolder as NewFolder
from .rewind import Asker as Asker
from .rewind import Rewinder as Rewinder
from .rewind import RewindPreview as RewindPreview
from .rewind import Target as Target
from .session_rewinds import Overview as Overview
from .session_rewinds import SessionRewinds as SessionRewinds
