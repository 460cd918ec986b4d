"""One run of the agent loop and everything it runs with.

The agent (`run_stream`, `compact_stream`, `run_ephemeral`) holds a session's lease and
roots and runs a turn: LLM calls, context and its compression, planning, steering, tool
calls under policy, approvals, budgets and a checkpoint before the first write. The
session's in-memory state and the lease live here because the turn is what holds them.
"""

from .acceptance import Acceptance as Acceptance
from .acceptance import stopped_before_saving as stopped_before_saving
from .agent import Agent as Agent
from .agent import RunControl as RunControl
from .agent import UserMessage as UserMessage
from .approvals import SCOPES as SCOPES
from .approvals import ApprovalBroker as ApprovalBroker
from .channel import MERGE_MAX_CHARS as MERGE_MAX_CHARS
from .channel import MergeCount as MergeCount
from .channel import MergingSender as MergingSender
from .channel import frame_size as frame_size
from .channel import frames_merge as frames_merge
from .channel import merged_frame as merged_frame
from .channel import open_frame_channel as open_frame_channel
from .checkpointing import PRUNED_SCOPE as PRUNED_SCOPE
from .checkpointing import RoundCheckpoints as RoundCheckpoints
from .commands import Parsed as Parsed
from .commands import SimpleCommand as SimpleCommand
from .commands import parse_command as parse_command
from .context import ContextBuilder as ContextBuilder
from .context import ContextViews as ContextViews
from .folders import FOLDERS_MAX as FOLDERS_MAX
from .folders import Listing as Listing
from .folders import list_folders as list_folders
from .folders import recent_folders as recent_folders
from .folders import remember_folder as remember_folder
from .folders import start_folders as start_folders
from .lease import SessionLeases as SessionLeases
from .observe import DELTAS as DELTAS
from .observe import TRACESTATE_MAX_CHARS as TRACESTATE_MAX_CHARS
from .observe import LLMCallDone as LLMCallDone
from .observe import NoObserver as NoObserver
from .observe import Observer as Observer
from .observe import Observers as Observers
from .observe import Propagates as Propagates
from .observe import continue_trace as continue_trace
from .observe import trace_carrier as trace_carrier
from .observe import trace_context as trace_context
from .plan_text import parse_analysis as parse_analysis
from .plan_text import parse_plan as parse_plan
from .plan_text import review_sections as review_sections
from .policy import effective_mode as effective_mode
from .project_files import project_view as project_view
from .session_state import message_id as message_id
from .steering import SteerItem as SteerItem
from .steering import busy_strategy as busy_strategy
from .steering import check_steer as check_steer
from .steering import not_the_starter as not_the_starter
from .steering import refusal as refusal
from .steering import steer_item as steer_item
from .tokens import TokenCounter as TokenCounter
from .workspace import CwdCheck as CwdCheck
