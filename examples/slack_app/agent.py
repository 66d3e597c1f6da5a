"""The example Slack app's agent: name it; the model comes from ``--model``."""

name = "helpdesk"
