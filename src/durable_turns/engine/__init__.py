"""The engine: a turn's loop and its step kinds, each a private module of this folder.

- ``_loop``: :class:`TurnEngine`, a turn's steps read off the transcript, one per call;
- ``_model_step``: the model step (ask the model, check its reply, retry a failed ask);
- ``_tool_steps``: the tool steps (one call at a time, or a parallel batch), and
  ``_tool_message``: the tool message of a call's outcome;
- ``_output``: a turn's structured output (its final answer validated, F25);
- ``_commits``: :class:`StepCommits`, one transaction per step;
- ``_step_context``: :class:`StepContext`, what a step uses of its runtime;
- ``_driver``: :class:`SessionDriver`, one per session, running its chain in order;
- ``_sessions``: :class:`RuntimeSessions`, the runtime's sessions as a tool step sees them.

Nothing here is for users: :class:`~durable_turns.Runtime` puts it together.
"""
