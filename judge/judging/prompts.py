"""Prompt templates: a sandboxed Jinja environment, checked loading, rendering, passage fencing.

Template files are named ``{scale}.{mode}.{language}.j2`` (``graded.listwise.zh.j2``). The
built-ins ship in the package ``judge._prompts``; a user's ``template_dir`` is searched first,
so a file there with a built-in's name overrides it.

A template defines ``{% block user %}`` and, optionally, ``{% block system %}``. Each block is
rendered on its own (text outside the blocks is ignored, so a leading ``{# comment #}`` is a
good place for notes) and stripped; a block that renders empty gives no message. Templates
may ``{% include %}`` or ``{% import %}`` other templates, but not ``{% extends %}`` one.

Variables a template sees:

- ``query`` (str): the query text, with fence markers neutralised;
- ``passage`` (Passage; pointwise) or ``passages`` (tuple of Passage; listwise);
- ``scale`` (Scale): render labels from ``scale.labels`` (name, grade, description, aliases),
  never hard-code them;
- ``fence(passage)``: the passage fenced as untrusted data (see :func:`fence`), datamarked
  when the template was loaded with a mark (see :func:`datamark`);
- ``datamark`` (str): that mark (``"^"``), or ``""`` when passages are fenced only; a template
  should tell the judge what the mark means when it is set;
- ``verdict_first`` (bool, default False): ask for the verdict field before the reason, for
  slow local judges that may be cut off by ``max_tokens`` mid-reason;
- ``max_reason_words`` (int, default 30): the reason's length limit when ``verdict_first``;
- ``reasons`` (bool, default True): ask for a reason beside the verdict; False asks for the
  verdict alone (a local server that computes logprobs per generated token answers faster);
- any further ``**options`` given to the render call.

A template must use ``query``, ``scale``, ``fence`` and ``passage`` (pointwise) or
``passages`` (listwise); this is checked at load time. The Jinja test ``cjk`` (true for text
containing CJK characters) lets Chinese templates show the Chinese aliases of a label.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import jinja2
import jinja2.meta
import jinja2.nodes
from jinja2.sandbox import SandboxedEnvironment

from judge.errors import TemplateError
from judge.providers.base import Message
from judge.schema import Passage, Query, SamplingParams, Scale

Mode = Literal["pointwise", "listwise"]
Language = Literal["en", "zh"]

PACKAGE = "judge._prompts"
SUFFIX = ".j2"
DEFAULT_OPTIONS: dict[str, Any] = {"verdict_first": False, "max_reason_words": 30, "reasons": True}
# Static blocks' texts a template keeps at most (one per scale and options is the usual).
_MADE_MAX = 64
_PASSAGE_VAR: dict[Mode, str] = {"pointwise": "passage", "listwise": "passages"}
_RESERVED = frozenset({"query", "passage", "passages", "scale", "fence", "datamark"})
# Spotlighting by datamarking (Hines et al. 2024): every run of white space in a passage becomes
# this mark, so the passage reads as one marked stream of data, and an instruction inside it
# never looks like the prompt's own text. "^" costs 1.8x a passage's cl100k tokens.
MARK = "^"
# White space, and the blanks that show as white space but are letters to Unicode (Hangul
# fillers, the Braille blank): a passage spaced with them would go unmarked.
_SPACE = re.compile(r"[\s\u115f\u1160\u3164\uffa0\u2800]+")
# Chinese has no spaces between words: the mark goes after each CJK punctuation mark instead,
# and after ASCII punctuation that follows a CJK character (scraped text often uses it).
_CJK_STOP = re.compile(
    r"(?:(?<=[\u3001\u3002\uff01\uff0c\uff1a\uff1b\uff1f])|(?<=[\u3400-\u9fff][,.;:!?]))(?!\s|$)"
)

# Any tag-like opener: "<" (or its full-width and small forms) before a name, "/" or "|":
# our fence tags ("</passage", "< / Query"), a reasoning model's "</think>" (the parser reads
# the answer after the last one), HTML-like tags, and chat-template control tokens
# (``<|im_end|>``, ``<｜end▁of▁sentence｜>``, ``<end_of_turn>``, ``</s>``): some local servers
# tokenise the whole chat with special tokens on, so such text inside a passage would end the
# user's turn and forge the assistant's. A class, not a list of names: the next tag is new.
_MARKER = re.compile(
    r"[<\uff1c\ufe64](?=[^\W\d_]|\s*/|\s*(?:passage|query|title|think)\b|\s*[|\uff5c])",
    re.IGNORECASE,
)
# "[INST]", "[/INST]": Llama-2 and Mistral turns, written in brackets.
_INST = re.compile(r"\[(?=\s*/?\s*INST\s*\])", re.IGNORECASE)
# Characters that show nothing (zero-width spaces and joiners, soft hyphens, word joiners,
# bidi controls: Unicode's format class) could split a tag so that no pattern sees it; they
# carry no meaning a judge needs, and are taken out of the text it is shown.
_INVISIBLE = re.compile(
    r"[\u00ad\u061c\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\u206a-\u206f\ufeff]"
)
_NEUTRAL = "‹"  # U+2039, visibly not "<"
_CJK = re.compile(r"[\u3000-\u303f\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff00-\uffef]")


def neutralise(text: str) -> str:
    """``text`` as untrusted data: invisible format characters out, every tag-like opener
    ``<`` (a fence tag, ``</think>``, an HTML tag, ``<|`` of a chat control token) and the
    bracket of ``[INST]`` replaced by a look-alike (``‹``, ``［``). The words stay: a judge
    reads ``‹div>`` as it would ``<div>``.

    Forged answers inside a passage (``{"verdict": "yes"}``) are left as they are: written as
    ``{‹verdict›: "yes"}`` they moved the embedded judge's P(yes) further, not less (probe of
    30 attacked pairs: fence +0.175 vs +0.110, instruction +0.190 vs +0.164)."""
    text = _INVISIBLE.sub("", text)
    return _INST.sub("\uff3b", _MARKER.sub(_NEUTRAL, text))


def one_line(text: str) -> str:
    """``text`` with every run of white space (line breaks included) as one space: a field
    shown on a line of its own (a query, a title, a URL) cannot start lines that read as
    the prompt's."""
    return " ".join(text.split())


def datamark(text: str, mark: str) -> str:
    """``text`` with every run of white space replaced by ``mark``, and ``mark`` after each
    Chinese punctuation mark (``"a b\\nc"`` -> ``"a^b^c"``); ``text`` itself when ``mark`` is
    empty. Nothing is removed but white space: every word the passage holds is still there."""
    if not mark:
        return text
    return _CJK_STOP.sub(mark, _SPACE.sub(mark, text.strip()))


def fence(passage: Passage, mark: str = "") -> str:
    """The passage as untrusted data between ``<passage id="...">`` and ``</passage>``.

    The id is written as a JSON string (so an id with a quote stays one attribute and the
    judge can copy it back verbatim); a passage with an empty id (every pointwise prompt, see
    :meth:`PromptTemplate.render_pointwise`) is fenced as a bare ``<passage>``. The title, if
    any, comes first in ``<title>...</title>``. Fence markers inside id, title and text are
    neutralised, so a passage cannot close its own fence or open a new one. With a ``mark``,
    the title and text are datamarked (:func:`datamark`).
    """
    if passage.id:
        lines = [f"<passage id={neutralise(json.dumps(passage.id, ensure_ascii=False))}>"]
    else:
        lines = ["<passage>"]
    if passage.title:  # one line, whatever it held: a title cannot start lines of its own
        lines.append(f"<title>{datamark(one_line(neutralise(passage.title)), mark)}</title>")
    lines.append(datamark(neutralise(passage.text), mark))  # a tag split by a line break too
    lines.append("</passage>")
    return "\n".join(lines)


def numbered(passages: Sequence[Passage]) -> tuple[Passage, ...]:
    """``passages`` as a listwise relevance prompt shows them: ids ``"1"`` to ``"n"`` in order.

    A position costs the judge one or two tokens to read and to copy back, where an engine's
    id ("msmarco_passage_41_123456789") costs ten and can be miscopied; the answer's ids are
    read back as positions (:func:`judge.judging.verdicts.parse_listwise`)."""
    return tuple(p.model_copy(update={"id": str(n)}) for n, p in enumerate(passages, start=1))


def template_name(scale: str, mode: Mode, language: Language) -> str:
    """The file name of the template for a scale, mode and language."""
    return f"{scale}.{mode}.{language}{SUFFIX}"


class _PackageLoader(jinja2.BaseLoader):
    """Loads the templates shipped in ``judge._prompts`` (works from a wheel or a checkout)."""

    def get_source(
        self, environment: jinja2.Environment, template: str
    ) -> tuple[str, str | None, Callable[[], bool] | None]:
        resource = resources.files(PACKAGE).joinpath(template)
        if not template.endswith(SUFFIX) or not resource.is_file():
            raise jinja2.TemplateNotFound(template)
        return resource.read_text(encoding="utf-8"), f"{PACKAGE}/{template}", lambda: True

    def list_templates(self) -> list[str]:
        entries = resources.files(PACKAGE).iterdir()
        return sorted(e.name for e in entries if e.name.endswith(SUFFIX) and e.is_file())


def _environment(template_dir: Path | None) -> SandboxedEnvironment:
    loaders: list[jinja2.BaseLoader] = [_PackageLoader()]
    if template_dir is not None:
        if not Path(template_dir).is_dir():
            raise TemplateError(f"template directory '{template_dir}' does not exist")
        loaders.insert(0, jinja2.FileSystemLoader(str(template_dir), encoding="utf-8"))
    env = SandboxedEnvironment(
        loader=jinja2.ChoiceLoader(loaders),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=False,
    )
    env.globals["fence"] = fence
    env.tests["cjk"] = lambda value: isinstance(value, str) and bool(_CJK.search(value))
    return env


def list_templates(template_dir: Path | None = None) -> list[str]:
    """Every template name available: the built-ins plus those in ``template_dir``."""
    env = _environment(template_dir)
    assert env.loader is not None
    return sorted({n for n in env.loader.list_templates() if n.endswith(SUFFIX)})


def _used_variables(env: SandboxedEnvironment, name: str, seen: set[str]) -> set[str]:
    """Context variables the template ``name`` and the templates it includes/imports look up."""
    seen.add(name)
    assert env.loader is not None
    source = env.loader.get_source(env, name)[0]
    ast = env.parse(source, name=name)
    used = set(jinja2.meta.find_undeclared_variables(ast))
    # find_undeclared_variables leaves out globals; "fence" must be seen to be used too.
    used |= {n.name for n in ast.find_all(jinja2.nodes.Name) if n.name in env.globals}
    for ref in jinja2.meta.find_referenced_templates(ast):
        if ref is not None and ref not in seen:
            used |= _used_variables(env, ref, seen)
    return used


def _mode_of(name: str, used: set[str]) -> Mode:
    """The mode the name says (``*.pointwise.*``), else the one its variables imply."""
    parts = name.split(".")
    if "pointwise" in parts or ("listwise" not in parts and "passage" in used):
        return "pointwise"
    if "listwise" in parts or "passages" in used:
        return "listwise"
    raise TemplateError(
        f"template '{name}' uses neither 'passage' nor 'passages' "
        "(and its name does not say pointwise or listwise)"
    )


def load_template(name: str, *, template_dir: Path | None = None, mark: str = "") -> PromptTemplate:
    """Load and check a template (``template_dir`` first, then the built-ins); its passages are
    datamarked with ``mark`` (none when empty).

    Raises TemplateError when it is missing (listing what exists), has a syntax error
    (with its line), lacks a ``user`` block, or never uses a required variable.
    """
    if not name.endswith(SUFFIX):
        name += SUFFIX
    env = _environment(template_dir)
    try:
        template = env.get_template(name)
        used = _used_variables(env, name, set())
    except jinja2.TemplateNotFound as exc:
        where = f" (searched {template_dir} and the built-ins)" if template_dir else ""
        available = ", ".join(list_templates(template_dir))
        raise TemplateError(
            f"template '{exc.name}' not found{where}; available: {available}"
        ) from None
    except UnicodeDecodeError as exc:
        raise TemplateError(f"template '{name}' is not UTF-8 text: {exc.reason}") from None
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(
            f"template '{exc.name or name}' line {exc.lineno}: syntax error: {exc.message}"
        ) from None
    if "user" not in template.blocks:
        raise TemplateError(f"template '{name}' has no {{% block user %}}")
    mode = _mode_of(name, used)
    for var in ("query", _PASSAGE_VAR[mode], "scale", "fence"):
        if var not in used:
            hint = (
                " (passages must be fenced: write {{ fence(passage) }})" if var == "fence" else ""
            )
            raise TemplateError(f"template '{name}' ({mode}) never uses variable '{var}'{hint}")
    origin = template.filename or name
    static = _static_blocks(env, name)
    return PromptTemplate(
        name=name, mode=mode, origin=origin, template=template, mark=mark, static=static
    )


def _static_blocks(env: SandboxedEnvironment, name: str) -> dict[str, tuple[str, ...]]:
    """Per block of ``name`` whose text follows from the values of the context variables it
    reads (no include, import, macro or global; a file that extends another has none), those
    variables. A system block reads only the scale and the options, so a run renders it once
    per scale, not once per passage (Jinja's sandbox made it a tenth of a judgment's CPU)."""
    assert env.loader is not None
    ast = env.parse(env.loader.get_source(env, name)[0], name=name)
    if any(True for _ in ast.find_all((jinja2.nodes.Extends, jinja2.nodes.Include))):
        return {}
    static = {}
    for block in ast.find_all(jinja2.nodes.Block):
        opaque = (jinja2.nodes.Import, jinja2.nodes.FromImport, jinja2.nodes.Macro)
        if any(True for _ in block.find_all((*opaque, jinja2.nodes.CallBlock))):
            continue
        names = list(block.find_all(jinja2.nodes.Name))
        # Every name it reads is keyed, even one it also sets (``{% set x = x | trim %}``
        # reads the context's x first); one that varies per passage, set or read, is not
        # static at all, nor a block that reads a global.
        read = sorted({n.name for n in names if n.ctx == "load"} - {"loop"})
        varies = {"query", "passage", "passages", "self", "super", "varargs", "kwargs"}
        if not any(n.name in varies for n in names) and not any(n in env.globals for n in read):
            static[block.name] = tuple(read)
    return static


@dataclass(frozen=True)
class AnswerShape:
    """What the answer holds: the verdict first or last, a reason of at most
    ``max_reason_words`` words (when ``verdict_first``) or none at all (``reasons=False``)."""

    verdict_first: bool = False
    max_reason_words: int = 30
    reasons: bool = True

    def options(self) -> dict[str, Any]:
        """The render options a template gets for this shape."""
        return {
            "verdict_first": self.verdict_first,
            "max_reason_words": self.max_reason_words,
            "reasons": self.reasons,
        }


@dataclass(frozen=True)
class PromptTemplate:
    """A loaded, checked template; renders to chat messages."""

    name: str
    mode: Mode
    origin: str  # file path, or "judge._prompts/<name>" for a built-in
    template: jinja2.Template
    mark: str = ""  # the datamark of its passages ("" : fenced only)
    # Blocks made once per value of the variables they read (:func:`_static_blocks`), and
    # what they made: the variables' values (a scale by identity, held here) -> the text.
    static: dict[str, tuple[str, ...]] = field(default_factory=dict)
    _made: dict[tuple[Any, ...], tuple[tuple[Any, ...], str]] = field(
        default_factory=dict, compare=False, repr=False
    )

    def render_pointwise(
        self, query: Query | str, passage: Passage, scale: Scale, **options: Any
    ) -> tuple[Message, ...]:
        """Messages asking the judge about one passage.

        The template sees the passage with an empty id: one passage needs no name, and two
        engines' copies of a text under different ids are then one request and one answer."""
        self._expect("pointwise")
        return self._render(
            {"passage": passage.model_copy(update={"id": ""})}, query, scale, options
        )

    def render_listwise(
        self, query: Query | str, passages: Sequence[Passage], scale: Scale, **options: Any
    ) -> tuple[Message, ...]:
        """Messages asking the judge about all ``passages`` at once (one verdict per id)."""
        self._expect("listwise")
        if not passages:
            raise TemplateError(f"template '{self.name}': no passages to render")
        return self._render({"passages": tuple(passages)}, query, scale, options)

    def _expect(self, mode: Mode) -> None:
        if self.mode != mode:
            raise TemplateError(f"template '{self.name}' is {self.mode}, not {mode}")

    def _render(
        self, variables: dict[str, Any], query: Query | str, scale: Scale, options: dict[str, Any]
    ) -> tuple[Message, ...]:
        clash = _RESERVED.intersection(options)
        if clash:
            raise TemplateError(f"option(s) {sorted(clash)} are reserved template variables")
        text = query.query if isinstance(query, Query) else query
        context = {**DEFAULT_OPTIONS, **options, **variables, "query": one_line(neutralise(text))}
        context["scale"] = scale
        context["datamark"] = self.mark
        if self.mark:
            context["fence"] = self._fence
        ctx = self.template.new_context(context)
        messages = []
        for role in ("system", "user"):
            block = self.template.blocks.get(role)
            if block is None:
                continue
            content = self._block(role, block, ctx, context)
            if content:
                messages.append(Message(role=role, content=content))
        return tuple(messages)

    def _fence(self, passage: Passage) -> str:
        return fence(passage, self.mark)

    def _block(
        self,
        role: str,
        block: Callable[[Any], Iterator[str]],
        ctx: Any,
        context: dict[str, Any],
    ) -> str:
        """A block's text, stripped; a static one (:attr:`static`) made once per value of what
        it reads."""
        names = self.static.get(role)
        if names is None:
            return self._run(block, ctx).strip()
        values = tuple(context.get(n) for n in names)
        # A scale (not hashable) by its id: the entry holds the scale, so no other takes it.
        # Each value with its type: 1, 1.0 and True are one key, not one text.
        key = (role, *((type(v), id(v) if isinstance(v, Scale) else v) for v in values))
        try:
            made = self._made.get(key)
        except TypeError:  # a value that cannot be a key: made each time
            return self._run(block, ctx).strip()
        if made is not None:
            return made[1]
        text = self._run(block, ctx).strip()
        if len(self._made) >= _MADE_MAX:
            self._made.clear()
        self._made[key] = (values, text)
        return text

    def _run(self, block: Callable[[Any], Iterator[str]], ctx: Any) -> str:
        try:
            return "".join(block(ctx))
        except jinja2.UndefinedError as exc:
            raise TemplateError(
                f"template '{self.name}': {exc.message} (pass it as a render option)"
            ) from None
        except Exception as exc:  # a user template's runtime failure is a template problem
            raise TemplateError(
                f"template '{self.name}' failed to render: {type(exc).__name__}: {exc}"
            ) from None


def json_schema_for(
    scale: Scale,
    mode: Mode,
    *,
    shape: AnswerShape = AnswerShape(),
    passage_ids: Sequence[str] | None = None,
) -> dict[str, Any]:
    """A JSON schema of the answer, for ``response_format=json_schema``.

    The verdict is an enum of the scale's label names; property order follows
    ``shape.verdict_first`` (constrained decoders emit properties in schema order); without
    ``shape.reasons`` the answer holds the verdict alone. Listwise, with ``passage_ids``: the
    ids are an enum of them and the list holds exactly one entry per id (minItems and
    maxItems), so a constrained decoder can neither skip a passage nor invent one.
    """
    verdict = {"type": "string", "enum": list(scale.names)}
    reason = {"type": "string"}
    fields = {"verdict": verdict, "reason": reason}
    order = ["verdict", "reason"] if shape.verdict_first else ["reason", "verdict"]
    if not shape.reasons:
        order = ["verdict"]
    if mode == "pointwise":
        return _object({k: fields[k] for k in order})
    pid: dict[str, Any] = {"type": "string"}
    entries: dict[str, Any] = {"type": "array"}
    if passage_ids is not None:
        pid["enum"] = list(dict.fromkeys(passage_ids))
        entries |= {"minItems": len(pid["enum"]), "maxItems": len(pid["enum"])}
    entries["items"] = _object({"id": pid, **{k: fields[k] for k in order}})
    return _object({"verdicts": entries})


def _object(properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


def template_pair(
    name: str, template_dir: str | Path | None, mark: str = ""
) -> tuple[PromptTemplate, PromptTemplate]:
    """The named template, and the pointwise one listwise falls back to for passages the list
    answer never covered (the template itself when it is pointwise)."""
    tdir = Path(template_dir) if template_dir else None
    template = load_template(name, template_dir=tdir, mark=mark)
    if template.mode != "listwise":
        return template, template
    pointwise = name.replace(".listwise.", ".pointwise.")
    return template, load_template(pointwise, template_dir=tdir, mark=mark)


def with_schema(
    params: SamplingParams, scale: Scale, mode: Mode, shape: AnswerShape
) -> SamplingParams:
    """``response_format = "json_schema"`` without a schema gets the one the scale implies."""
    if params.response_format != "json_schema" or params.json_schema is not None:
        return params
    schema = json_schema_for(scale, mode, shape=shape)
    return params.model_copy(update={"json_schema": schema})
