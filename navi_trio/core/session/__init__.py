"""The live session: one actor per session, started on demand by the registry.

The actor takes messages (enqueue, steer, interrupt), keeps the durable queue, runs turns
one at a time and publishes their frames through the session's broadcast.
"""

from .broadcast import Follower as Follower
from .broadcast import Frame as Frame
from .broadcast import Lagged as Lagged
from .broadcast import LocalBroadcast as LocalBroadcast
from .broadcast import ReplayBuffer as ReplayBuffer
from .broadcast import new_epoch as new_epoch
from .lifecycle import SessionService as SessionService
from .queued import Dropped as Dropped
from .queued import deliver as deliver
from .queued import to_row as to_row
from .session_actor import SessionActor as SessionActor
from .session_actor import Subscription as Subscription
from .session_registry import SessionRegistry as SessionRegistry
from .user_watch import UserWatch as UserWatch
from .user_watch import role_now as role_now
