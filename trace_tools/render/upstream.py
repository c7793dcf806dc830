"""Renders as the upstream systems make them: tool-call arguments reach the template as objects.

Every system the strategies reproduce hands the chat template tool-call arguments as JSON
objects (dicts), whatever the harness sent (docs/upstream_families.md cites each):

* slime: the OpenAI adapter's translate step parses string arguments, `tool_call_dict` stores
  objects, and `_render_token_ids` calls `apply_chat_template` on those messages;
* agentcore: the same adapter translation; `HfTemplateRenderer` renders the canonical messages;
* uni-agent: `openai_to_internal` parses string arguments before the codec renders;
* miles: `apply_chat_template` (`_normalize_tool_arguments`) parses string arguments for every
  jinja template; only DeepSeek V3.2/V4 checkpoints (recognised by their `model_type`) take the
  encoder path that writes them as text.

A template that joins `arguments` to text (DeepSeek V3's `deepseekv3.jinja`) raises a TypeError on
an object, so upstream fails those requests. The project's `Renderer` passes such a template JSON
text instead (the spelling the model emits), which is what reconstructing a recorded prompt needs;
`UpstreamRender` puts the upstream behaviour back for the strategies that reproduce a system:
where the render of the messages as given raises, it raises `ArgumentFormError`, which each
strategy turns into the failed request its upstream answers. With `lenient=True` it lets the
text form through instead and counts the requests that needed it (`take_lenient`).
"""

from __future__ import annotations

from typing import Any, Sequence

from trace_tools.errors import ReplayError
from trace_tools.render import families


class ArgumentFormError(ReplayError):
    """The template raises on the tool-call arguments in the form an upstream system passes them."""

    def __init__(self, system: str, detail: str):
        self.system = system
        self.reason = f"this template needs text arguments and {system} passes dicts"
        super().__init__(f"{self.reason} ({detail})")


def upstream_render(renderer: Any, system: str, lenient: bool = False) -> Any:
    """`renderer` as `system` uses it; the renderer itself where no render can differ (a template
    that takes object arguments, or a test's fake renderer)."""
    if renderer is None or not getattr(renderer, "text_arguments", False):
        return renderer
    return UpstreamRender(renderer, system, lenient)


def _checked(name: str) -> Any:
    """The renderer's render method `name`, preceded by the upstream check of the same request."""

    def render(
        self: "UpstreamRender",
        messages: Sequence[dict],
        tools: Sequence[dict] | None = None,
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> Any:
        self.check(messages, tools, add_generation_prompt, **template_kwargs)
        return getattr(self.renderer, name)(messages, tools, add_generation_prompt, **template_kwargs)

    render.__name__ = name
    return render


class UpstreamRender:
    """A view of a `Renderer` whose renders fail where the upstream render of the same messages
    (arguments as given, not as text) fails. Everything else is the wrapped renderer's."""

    def __init__(self, renderer: Any, system: str, lenient: bool = False):
        self.renderer, self.system, self.lenient = renderer, system, lenient
        self._lenient_renders = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.renderer, name)

    def __reduce__(self):
        return (UpstreamRender, (self.renderer, self.system, self.lenient))

    def check(
        self,
        messages: Sequence[dict],
        tools: Sequence[dict] | None = None,
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> None:
        """Raise `ArgumentFormError` where the template raises on `messages` as given.

        Only messages with object arguments can render differently from the renderer's text form,
        so only those are rendered once more, as given; a template that raises does so at the first
        such call, so the check costs little.
        """
        if not families.has_object_arguments(messages):
            return
        from jinja2 import TemplateError

        try:
            self.renderer.render_text_as_given(messages, tools, add_generation_prompt, **template_kwargs)
        except (TypeError, ValueError, TemplateError) as exc:
            if self.lenient:
                self._lenient_renders += 1
                return
            raise ArgumentFormError(self.system, f"{type(exc).__name__}: {exc}") from exc

    def take_lenient(self) -> bool:
        """True when a render since the last call needed the lenient text form (then reset)."""
        needed, self._lenient_renders = self._lenient_renders > 0, 0
        return needed

    # -- the renders strategies make (RendererLike and beyond) -----------------------------------
    render = _checked("render")
    render_shared = _checked("render_shared")
    render_text = _checked("render_text")

    def render_delta(
        self, prev: Sequence[dict], new: Sequence[dict], tools: Sequence[dict] | None = None, **kw: Any
    ) -> list[int] | None:
        self.check(prev, tools, False, **kw)
        self.check([*prev, *new], tools, True, **kw)
        return self.renderer.render_delta(prev, new, tools, **kw)


def render_failure_reason(what: str, exc: BaseException) -> str:
    """How a request whose render raised is counted: an argument-form failure by its own reason,
    any other by what failed and the template's own message (not the template's identity)."""
    if isinstance(exc, ArgumentFormError):
        return exc.reason
    return f"{what}: {getattr(exc, 'reason', None) or exc}"


def check_render(
    view: Any, messages: Sequence[dict], tools: Sequence[dict] | None = None, **template_kwargs: Any
) -> None:
    """`view.check` for a request's prompt (generation prompt on); nothing for a plain renderer."""
    if isinstance(view, UpstreamRender):
        view.check(messages, tools, True, **template_kwargs)


def took_lenient(view: Any) -> bool:
    """Whether `view` let a render through in the lenient text form since last asked."""
    return isinstance(view, UpstreamRender) and view.take_lenient()
