"""Requests translated between OpenAI's chat shape and Anthropic's Messages shape.

A line goes UNCHANGED to a deployment of its own family (an OpenAI chat body to an
OpenAI-compatible deployment, an Anthropic line's params to an anthropic one) and is
TRANSLATED for the other family, at prepare time (quotaflow/execution/prepare.py,
quotaflow/offload/clients.py): `to_anthropic.messages_request` (OpenAI chat ->
Messages) and `to_openai.chat_request` (Messages params -> OpenAI chat). A field with
no faithful equivalent fails the line with `Untranslatable` naming it; nothing is
dropped silently (docs/deployments/anthropic.md: the table of what maps to what). Answers are
made over in quotaflow/providers/anthropic_answers.py. `view.counting_view` is what ingest
stores beside an Anthropic line's params: enough of an OpenAI body to route and count
it, never sent anywhere.
"""

from quotaflow.errors import Untranslatable

TO_ANTHROPIC = "Anthropic Messages"
TO_OPENAI = "OpenAI chat"
_ELSEWHERE = {TO_ANTHROPIC: "an OpenAI-compatible deployment",
              TO_OPENAI: "an Anthropic deployment"}


def untranslatable(path: str, target: str, detail: str = "") -> Untranslatable:
    """The error of a field at `path` (e.g. body.logit_bias) that `target` cannot take."""
    what = f"{path} ({detail})" if detail else path
    return Untranslatable(path, f"{what} has no {target} equivalent; remove it or route this "
                                f"model to {_ELSEWHERE[target]}")


__all__ = ["TO_ANTHROPIC", "TO_OPENAI", "Untranslatable", "untranslatable"]
