"""Digests that name a first-round prompt before it is rendered, and tags naming the parser
that reads its answers: a cached re-run renders and parses nothing.

A prompt's digest covers everything that makes its request: the model and sampling params, the
template (its source and the source of every template it includes or imports), the scale, the
answer-shape options, the query text and each passage's fields that the template can read
(:func:`passage_fields`: title and text for the built-in templates, so two engines' copies
of one passage, which differ in ``score`` and perhaps in id, are one request and one answer;
no template sees an engine's passage id). Rendering is
deterministic in those, given the code that renders; the code's share is pinned by the judge
version, the source of :mod:`judge.judging.prompts`, the Jinja version and one canary rendering
(fence markers, chat control tokens, CJK, a title) made when the keys are built. A template
sees the query's text only (never its id, engine or labels); a test holds the renderer to that.

The caller adds the provider's identity and the repeat index (:meth:`Caller.key`): that is an
alias of the answer, which stays stored under the rendered request's content address
(:func:`judge.providers.base.request_key`). So a digest that changes with the code (a new judge
version) costs one rendering and a lookup by the rendered request, never a paid call, and
every judge version finds the answers any other stored.

A parser's tag is a digest of the source of the modules that read answers (verdicts, the
JSON scanner, the records and scales) plus the scale, so an answer read by other parsing code
is read again rather than trusted.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterable, Iterator, Sequence
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any, TypeGuard

import jinja2
import jinja2.meta

from judge import schema
from judge.errors import TemplateError
from judge.judging import jsonscan, prompts, verdicts
from judge.judging.prompts import PromptTemplate
from judge.schema import Passage, Query, SamplingParams, Scale
from judge.version import __version__

__all__ = ["FENCED", "PromptKeys", "code_digest", "parser_tag", "passage_fields"]

SCHEME = "judge-prompt-1"
# The Passage fields ``fence`` shows (checked against fence itself when keys are built).
FENCED = ("id", "title", "text")
# Modules whose code decides what an answer reads as (a Parsed, its label, grade, probability).
_PARSING = (verdicts, jsonscan, schema)
_CANARY_QUERY = 'canary <query> "q" <|im_end|> 查询'
_CANARY = (
    Passage(id='c"1', text="a <passage> </passage> <|im_start|> 段落 {{ x }}", title="<title>t"),
    Passage(id="c2", text="plain", url="https://example.invalid", score=0.5, truncated_from=9),
)


def _digest(*parts: str) -> hashlib._Hash:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode("utf-8"))
        h.update(b"\x00")
    return h


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def template_sources(template: PromptTemplate) -> dict[str, str]:
    """The template's source and that of every template it includes or imports, by name; when
    one is named at render time (a dynamic include), every template the loader knows."""
    env = template.template.environment
    loader = env.loader
    assert loader is not None
    seen: dict[str, str] = {}
    todo = [template.name]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        source = loader.get_source(env, name)[0]
        seen[name] = source
        refs = list(jinja2.meta.find_referenced_templates(env.parse(source)))
        if any(ref is None for ref in refs):
            todo += [n for n in loader.list_templates() if n not in seen]
        todo += [ref for ref in refs if ref is not None and ref not in seen]
    return dict(sorted(seen.items()))


def _children(node: jinja2.nodes.Node, parent: jinja2.nodes.Node | None) -> Iterator[Any]:
    yield node, parent
    for child in node.iter_child_nodes():
        yield from _children(child, node)


def passage_fields(env: jinja2.Environment, sources: Iterable[str]) -> tuple[str, ...]:
    """The Passage fields these templates can read, so that only those enter a digest (two
    engines' copies of one passage differ in ``score``, and are one request).

    A name holding passages (``passage``, ``passages``, a loop over them) may be looped over,
    counted (``length``, ``count``), fenced (``fence`` reads :data:`FENCED`), or have a field
    read (``p.url``, ``p["url"]``); any other use (printed whole, passed to a macro, assigned)
    could read anything, and then every field counts.
    """
    fields = set(FENCED)
    for source in sources:
        nodes = list(_children(env.parse(source), None))
        holders = {"passage", "passages"}
        for node, _ in nodes:  # loops over passages, in source order (nested loops follow)
            if isinstance(node, jinja2.nodes.For) and _held(node.iter, holders):
                holders |= {n.name for n, _ in _children(node.target, None) if _is_name(n)}
        for node, parent in nodes:
            if not (_is_name(node) and node.name in holders and node.ctx == "load"):
                continue
            read = _field_read(node, parent)
            if read is None:
                return tuple(Passage.model_fields)
            fields |= read
    return tuple(f for f in Passage.model_fields if f in fields)


def _is_name(node: Any) -> TypeGuard[jinja2.nodes.Name]:
    return isinstance(node, jinja2.nodes.Name)


def _held(node: jinja2.nodes.Node, holders: set[str]) -> bool:
    while isinstance(node, jinja2.nodes.Filter) and node.node is not None:
        node = node.node
    return _is_name(node) and node.name in holders


def _field_read(name: jinja2.nodes.Name, parent: jinja2.nodes.Node | None) -> set[str] | None:
    """The fields a use of a passage-holding name reads: none for a loop, a count or a fence,
    one for a field read; None when it could read any."""
    nodes = jinja2.nodes
    if isinstance(parent, nodes.For) and parent.iter is name:
        return set()
    if isinstance(parent, nodes.Filter) and parent.name in ("length", "count"):
        return set()
    if isinstance(parent, nodes.Call) and _is_name(parent.node) and parent.node.name == "fence":
        return set()
    key = None
    if isinstance(parent, nodes.Getattr):
        key = parent.attr
    elif isinstance(parent, nodes.Getitem) and isinstance(parent.arg, nodes.Const):
        key = parent.arg.value
    return {key} if key in Passage.model_fields else None


@cache
def _fence_reads_more() -> bool:
    """Whether ``fence`` shows more of a passage than :data:`FENCED` (then all fields count)."""
    shown = _CANARY[1]
    bare = shown.model_copy(update={f: None for f in Passage.model_fields if f not in FENCED})
    return prompts.fence(shown) != prompts.fence(bare)


def _canary(template: PromptTemplate, scale: Scale, options: dict[str, Any]) -> str:
    """The canary prompt as this code renders it (a template that cannot render the canary:
    its error, which is as fixed)."""
    try:
        if template.mode == "pointwise":
            messages = template.render_pointwise(_CANARY_QUERY, _CANARY[0], scale, **options)
        else:
            messages = template.render_listwise(_CANARY_QUERY, _CANARY, scale, **options)
    except TemplateError as exc:
        return f"error: {exc}"
    return _json([m.model_dump(mode="json") for m in messages])


class PromptKeys:
    """The digest of each first-round prompt a template renders, without rendering it."""

    def __init__(
        self,
        template: PromptTemplate,
        scale: Scale,
        options: dict[str, Any],
        model: str,
        params: SamplingParams,
    ) -> None:
        self.template = template
        sources = template_sources(template)
        self.fields = passage_fields(template.template.environment, sources.values())
        if _fence_reads_more():
            self.fields = tuple(Passage.model_fields)
        # A template never sees an engine's id: a pointwise one gets "", a listwise one the
        # passage's position (prompts.numbered), which the order of the key's values carries.
        self.fields = tuple(f for f in self.fields if f != "id")
        self._base = _digest(
            SCHEME,
            code_digest((prompts,)),
            jinja2.__version__,
            template.name,
            template.mode,
            _json(sources),
            _json(self.fields),
            _canary(template, scale, options),
            scale.model_dump_json(),
            _json(options),
            model,
            params.model_dump_json(),
        )

    @property
    def identity(self) -> str:
        """A digest of everything the prompts share (all but the query and passages)."""
        return self._base.hexdigest()

    def pointwise(self, query: Query, passage: Passage) -> str:
        """The digest of the pointwise prompt for ``passage``."""
        return self.listwise(query, (passage,))

    def listwise(self, query: Query, passages: Sequence[Passage]) -> str:
        """The digest of the listwise prompt for ``passages``, in their order."""
        fields = self.fields
        values = [query.query, *([getattr(p, f) for f in fields] for p in passages)]
        h = self._base.copy()
        h.update(json.dumps(values, ensure_ascii=False).encode("utf-8"))
        return h.hexdigest()


@cache
def code_digest(modules: tuple[ModuleType, ...]) -> str:
    """A digest of the modules' source; a fresh random one when a source cannot be read (then
    nothing keyed by it is ever found again)."""
    h = _digest(__version__)
    for module in modules:
        try:
            h.update(Path(module.__file__ or "").read_bytes())
        except OSError:
            return uuid.uuid4().hex
    return h.hexdigest()


def parser_tag(mode: str, scale: Scale, ids: Sequence[str] = ()) -> str:
    """The tag of the parser reading a ``mode`` answer on ``scale`` (listwise: for ``ids``)."""
    return _digest(mode, code_digest(_PARSING), scale.model_dump_json(), *ids).hexdigest()
