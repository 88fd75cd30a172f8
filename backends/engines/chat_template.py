"""A model's own chat template (Jinja, sandboxed) turned into the prompt of the next turn."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import jinja2
import jinja2.sandbox

from backends.errors import SettingsError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from backends.engines.interface import ChatMessage

log = logging.getLogger(__name__)

# Fallback when a model carries no chat template: ChatML, which most instruct models use.
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class ChatTemplate:
    """Compiles a model's template once (ChatML when it has none or it does not compile)."""

    def __init__(self, source: str | None, model_name: str) -> None:
        self.model_name = model_name
        environment = jinja2.sandbox.ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, undefined=jinja2.ChainableUndefined
        )

        def raise_exception(message: str) -> None:
            raise jinja2.TemplateError(message)

        environment.globals["raise_exception"] = raise_exception
        try:
            self._template = environment.from_string(source or CHATML_TEMPLATE)
        except jinja2.TemplateError as error:
            log.warning(
                "chat template of %s does not compile (%s); using ChatML", model_name, error
            )
            self._template = environment.from_string(CHATML_TEMPLATE)

    def render(self, messages: Sequence[ChatMessage], bos_token: str, eos_token: str) -> str:
        """The prompt for the next assistant turn (SettingsError when the template fails)."""
        try:
            return self._template.render(
                messages=[{"role": m.role, "content": m.content} for m in messages],
                add_generation_prompt=True,
                bos_token=bos_token,
                eos_token=eos_token,
            )
        except jinja2.TemplateError as error:
            raise SettingsError(
                f"the chat template of {self.model_name} failed: {error}"
            ) from error
