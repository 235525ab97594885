"""Text extraction for the training corpus: markup in, clean English paragraphs out.

Three markups occur in the corpus packages:
- HTML (An Anarchist FAQ): `html_to_sections` splits a page at its <h1>/<h2> headings.
- reStructuredText (Linux kernel and Python documentation): `rst_to_paragraphs` keeps prose and drops code
  (literal blocks after `::`, code/include/table directives, doctest blocks), tables, comments and targets,
  section adornments and field lists; inline markup (roles, literals, links, emphasis) keeps its text only.
- OSIS XML (SWORD commentary modules): `osis_to_paragraphs`.
All three return paragraphs: one string each, whitespace collapsed, no markup. `clean_paragraphs` then keeps the
ones that read as prose, and `split_long_line` cuts a paragraph into lines that sentencepiece will not skip.
Standard library only.
"""

from __future__ import annotations

import html.parser
import re
import unicodedata

# ---------------------------------------------------------------------------------------------------------------
# Common helpers

_SPACE = re.compile(r"\s+")
# C0/C1 control characters other than whitespace, and the Unicode replacement character.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ufffd]")


def normalize_space(text: str) -> str:
    """One line: NFC, control characters removed, every run of whitespace one space, trimmed."""
    text = unicodedata.normalize("NFC", text)
    text = _CONTROL.sub("", text)
    return _SPACE.sub(" ", text).strip()


_PROSE_CHARS = re.compile(r"[^\W\d_]|[ .,;:'\"!?()\-\u2014\u2013\u2019\u2018\u201c\u201d]")
_CODE_ENDINGS = ("{", "}", ";", ");", "*/")


def is_prose(paragraph: str, min_prose_fraction: float = 0.85) -> bool:
    """True when a paragraph reads as natural-language text rather than code, data or decoration.

    Rules: it holds at least one letter; letters, spaces and common punctuation make up at least
    `min_prose_fraction` of its characters; it does not end like a C statement or block (`;`, `{`, `}`, `*/`).
    """
    if not paragraph or not any(c.isalpha() for c in paragraph):
        return False
    if paragraph.endswith(_CODE_ENDINGS):
        return False
    prose = len(_PROSE_CHARS.findall(paragraph))
    return prose >= min_prose_fraction * len(paragraph)


def clean_paragraphs(paragraphs, min_prose_fraction: float = 0.85) -> list[str]:
    """Normalized paragraphs that pass `is_prose`, in order; empty ones dropped."""
    out = []
    for p in paragraphs:
        p = normalize_space(p)
        if p and is_prose(p, min_prose_fraction):
            out.append(p)
    return out


_SENTENCE_END = re.compile(r"(?<=[.!?])[\"'\u201d\u2019)\]]*\s+")


def split_long_line(line: str, max_bytes: int) -> list[str]:
    """Cuts one line into pieces of at most `max_bytes` UTF-8 bytes, at sentence ends where possible, else at
    spaces, else between characters. Pieces are trimmed and never empty; a short line comes back unchanged.

    Why: sentencepiece's trainer silently skips input lines longer than its max_sentence_length (bytes).
    """
    if max_bytes < 8:
        raise ValueError(f"max_bytes must be at least 8, got {max_bytes}")
    if len(line.encode("utf-8")) <= max_bytes:
        return [line] if line else []
    pieces: list[str] = []

    def emit_unit(unit: str) -> None:
        # A unit longer than max_bytes: cut at spaces, then between characters.
        if len(unit.encode("utf-8")) <= max_bytes:
            pieces.append(unit)
            return
        current = ""
        for word in unit.split(" "):
            candidate = word if not current else current + " " + word
            if len(candidate.encode("utf-8")) <= max_bytes:
                current = candidate
                continue
            if current:
                pieces.append(current)
            current = ""
            while len(word.encode("utf-8")) > max_bytes:
                cut = max_bytes
                while len(word[:cut].encode("utf-8")) > max_bytes:
                    cut -= 1
                pieces.append(word[:cut])
                word = word[cut:]
            current = word
        if current:
            pieces.append(current)

    # Sentences, with their closing quote or bracket, greedily packed into lines of at most max_bytes.
    sentences = []
    start = 0
    for m in _SENTENCE_END.finditer(line):
        sentences.append(line[start:m.start() + len(m.group(0).rstrip())].strip())
        start = m.end()
    sentences.append(line[start:].strip())
    current = ""
    for s in filter(None, sentences):
        candidate = s if not current else current + " " + s
        if len(candidate.encode("utf-8")) <= max_bytes:
            current = candidate
            continue
        if current:
            pieces.append(current)
            current = ""
        if len(s.encode("utf-8")) <= max_bytes:
            current = s
        else:
            emit_unit(s)
    if current:
        pieces.append(current)
    return [p for p in (p.strip() for p in pieces) if p]


# ---------------------------------------------------------------------------------------------------------------
# HTML and OSIS: a tag stream turned into paragraphs


class _MarkupText(html.parser.HTMLParser):
    """Collects text from HTML or XML fragments; block tags end a paragraph, heading tags open a new section.
    Content is dropped inside a skipped tag (by name, or by one of its classes) up to that tag's matching end tag.
    Entities and character references are decoded."""

    def __init__(self, block_tags, skip_tags, heading_tags, skip_classes=frozenset()):
        super().__init__(convert_charrefs=True)
        self.block_tags = block_tags
        self.skip_tags = skip_tags
        self.heading_tags = heading_tags
        self.skip_classes = skip_classes
        self.sections: list[tuple[str, list[str]]] = [("", [])]
        self.current: list[str] = []
        self.skip_tag = None  # the tag whose content is being dropped, and how deep it nests
        self.skip_depth = 0
        self.in_heading = False
        self.heading: list[str] = []

    def _flush(self):
        text = "".join(self.current)
        self.current = []
        if text.strip():
            self.sections[-1][1].append(text)

    def handle_starttag(self, tag, attrs):
        if self.skip_tag is not None:
            self.skip_depth += tag == self.skip_tag
            return
        classes = set((dict(attrs).get("class") or "").split())
        if tag in self.skip_tags or classes & self.skip_classes:
            self._flush()
            self.skip_tag, self.skip_depth = tag, 1
            return
        if tag in self.heading_tags:
            self._flush()
            self.in_heading = True
            self.heading = []
        elif tag in self.block_tags:
            self._flush()

    def handle_endtag(self, tag):
        if self.skip_tag is not None:
            if tag == self.skip_tag:
                self.skip_depth -= 1
                if self.skip_depth == 0:
                    self.skip_tag = None
            return
        if tag in self.heading_tags and self.in_heading:
            self.in_heading = False
            self.sections.append((normalize_space("".join(self.heading)), []))
        elif tag in self.block_tags:
            self._flush()

    def handle_startendtag(self, tag, attrs):
        if self.skip_tag is None and tag in self.block_tags:
            self._flush()

    def handle_data(self, data):
        if self.skip_tag is not None:
            return
        (self.heading if self.in_heading else self.current).append(data)

    def finish(self):
        self.close()
        self._flush()
        return self.sections


_HTML_BLOCK = {"p", "div", "br", "li", "ul", "ol", "dl", "dt", "dd", "blockquote", "table", "tr", "td", "th",
               "hr", "section", "article", "header", "footer", "body", "h3", "h4", "h5", "h6", "center", "img"}
_HTML_SKIP = {"script", "style", "pre", "head", "nav", "form", "select", "button"}
_HTML_HEADINGS = {"h1", "h2"}


def html_to_sections(page: str, skip_classes=frozenset(), skip_tags=frozenset()) -> list[tuple[str, list[str]]]:
    """Splits an HTML page at <h1>/<h2> headings: [(heading, paragraphs)], the first entry holding what comes
    before the first heading (heading ""). Paragraphs are raw text (not yet normalized); <pre>, <script>,
    <style> and <head> content is dropped, and so is any element with a class in `skip_classes` or a tag in
    `skip_tags`; <h3>..<h6> stay inside their section as paragraphs."""
    parser = _MarkupText(_HTML_BLOCK, _HTML_SKIP | set(skip_tags), _HTML_HEADINGS, frozenset(skip_classes))
    parser.feed(page)
    return parser.finish()


def html_title(page: str) -> str:
    """The text of the page's <title>, or ""."""
    m = re.search(r"<title[^>]*>(.*?)</title>", page, re.IGNORECASE | re.DOTALL)
    if not m:
        return ""
    parser = _MarkupText(set(), set(), set())
    parser.feed(m.group(1))
    return normalize_space(" ".join(p for _, ps in parser.finish() for p in ps))


_OSIS_BLOCK = {"div", "p", "title", "lb", "l", "lg", "list", "item", "chapter", "milestone", "br"}


def osis_to_paragraphs(fragment: str) -> list[str]:
    """Paragraphs of an OSIS XML fragment (one SWORD module entry): <title>, <div>/<p> milestones, <l>, <lb/>,
    <item> end paragraphs; inline elements (<hi>, <reference>, <q>, <note>) keep their text."""
    parser = _MarkupText(_OSIS_BLOCK, set(), set())
    parser.feed(fragment)
    return [p for _, ps in parser.finish() for p in ps]


# ---------------------------------------------------------------------------------------------------------------
# reStructuredText

# Directives whose whole content is code, data, layout or cross-referencing: dropped with their body.
RST_DROP_DIRECTIVES = {
    "code", "code-block", "sourcecode", "literalinclude", "include", "kernel-doc", "kernel-abi", "kernel-feat",
    "kernel-include", "toctree", "highlight", "image", "figure", "math", "csv-table", "list-table", "table",
    "flat-table", "raw", "graphviz", "kernel-render", "productionlist", "index", "testcode", "testoutput",
    "testsetup", "testcleanup", "doctest", "literal", "parsed-literal", "module", "currentmodule", "moduleauthor",
    "sectionauthor", "codeauthor", "program", "default-role", "role", "contents", "tabularcolumns", "only",
    "versionadded", "availability", "audit-event", "audit-event-table", "cssclass", "c:namespace",
    "c:namespace-push", "c:namespace-pop", "cpp:namespace", "py:currentmodule", "py:module", "highlightlang",
    "sectnum", "footer", "header", "meta", "title", "digraph", "glossary-include", "pdb-command", "opcode-table",
    "limited-api-list", "miscnews", "maintainer-list", "ditaa", "ifconfig",
}
# Directives whose argument is a title worth keeping (the body is kept too).
RST_TITLE_DIRECTIVES = {"admonition", "topic", "sidebar", "rubric"}

_RST_DIRECTIVE = re.compile(r"^\.\.\s+([A-Za-z][\w:.+-]*)::(?:\s+(.*))?$")
_RST_ADORNMENT = re.compile(r"^([=\-`:'\"~^_*+#<>.])\1{2,}\s*$")
_RST_SIMPLE_TABLE_BORDER = re.compile(r"^=+(\s+=+)+\s*$|^-+(\s+-+)+\s*$")
_RST_GRID_LINE = re.compile(r"^[+|]")
_RST_LIST_ITEM = re.compile(r"^(?:[-*+\u2022]|\d+[.)]|#\.|\(\w{1,3}\)|[a-zA-Z][.)])\s+")
_RST_FIELD = re.compile(r"^:[^:\s][^:]*:(\s|$)")
_RST_OPTION_LINE = re.compile(r"^:[\w-]+:")

_RST_ROLE = re.compile(r":[\w.+-]+(?::[\w.+-]+)*:`([^`]*)`")
_RST_LITERAL = re.compile(r"``(.+?)``")
_RST_LINK = re.compile(r"`([^`<]*?)\s*(?:<[^`>]*>)?`__?")
_RST_DEFAULT_ROLE = re.compile(r"`([^`]+)`")
_RST_STRONG = re.compile(r"\*\*([^*]+)\*\*")
_RST_EMPHASIS = re.compile(r"(?<![\w*])\*([^*\s](?:[^*]*[^*\s])?)\*(?![\w*])")
_RST_SUBSTITUTION = re.compile(r"\|([\w][\w .-]*)\|_{0,2}")
_RST_FOOTNOTE_REF = re.compile(r"\s*\[(?:#[\w-]*|\*|\d+)\]_")
_RST_ESCAPE = re.compile(r"\\(.)")
_ESCAPED = 0xF0000  # escaped character c is held as chr(_ESCAPED + ord(c)) while inline markup is removed
_ESCAPED_CHAR = re.compile("[\U000F0000-\U000FFFFD]")


def _role_text(match: re.Match) -> str:
    text = match.group(1)
    m = re.match(r"^(.*?)\s*<[^>]*>$", text, re.DOTALL)
    if m and m.group(1):
        text = m.group(1)
    text = text.lstrip("!")
    if text.startswith("~"):
        text = text[1:].rsplit(".", 1)[-1]
    return text


def rst_inline_to_text(text: str) -> str:
    """Inline reStructuredText markup replaced by its text: roles (:func:`x` -> x, `~a.b` -> b,
    `title <target>` -> title), ``literals``, `links <url>`_, **strong**, *emphasis*, |substitutions|,
    footnote references (dropped) and backslash escapes."""
    # Escaped characters are set aside (as private-use code points) so that no markup rule sees them.
    text = re.sub(r"\\\s", "", text)
    text = _RST_ESCAPE.sub(lambda m: chr(_ESCAPED + ord(m.group(1))) if ord(m.group(1)) < 0xFFFE else m.group(1),
                           text)
    text = _RST_ROLE.sub(_role_text, text)
    text = _RST_LITERAL.sub(r"\1", text)
    text = _RST_LINK.sub(r"\1", text)
    text = _RST_DEFAULT_ROLE.sub(r"\1", text)
    text = _RST_STRONG.sub(r"\1", text)
    text = _RST_EMPHASIS.sub(r"\1", text)
    text = _RST_SUBSTITUTION.sub(r"\1", text)
    text = _RST_FOOTNOTE_REF.sub("", text)
    return _ESCAPED_CHAR.sub(lambda m: chr(ord(m.group(0)) - _ESCAPED), text)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _block_end(lines: list[str], start: int, indent: int) -> int:
    """First index at or after `start` of a non-blank line indented at most `indent` (end of an indented body)."""
    i = start
    while i < len(lines) and (not lines[i].strip() or _indent(lines[i]) > indent):
        i += 1
    return i


def _dedent(lines: list[str]) -> list[str]:
    indents = [_indent(l) for l in lines if l.strip()]
    cut = min(indents) if indents else 0
    return [l[cut:] if l.strip() else "" for l in lines]


def _rst_walk(lines: list[str], out: list[str]) -> None:
    i, n = 0, len(lines)
    while i < n:
        line = lines[i]
        stripped = line.strip()
        if not stripped:
            i += 1
            continue
        indent = _indent(line)

        # Explicit markup: directives, comments, hyperlink targets, substitution definitions, footnotes.
        if stripped == ".." or stripped.startswith(".. "):
            end = _block_end(lines, i + 1, indent)
            m = _RST_DIRECTIVE.match(stripped)
            if m and m.group(1).lower() not in RST_DROP_DIRECTIVES:
                if m.group(1).lower() in RST_TITLE_DIRECTIVES and m.group(2):
                    out.append(m.group(2))
                body = _dedent(lines[i + 1:end])
                # Directive options (":maxdepth: 2") open the body.
                k = 0
                while k < len(body) and body[k].strip() and _RST_OPTION_LINE.match(body[k].strip()):
                    k += 1
                _rst_walk(body[k:], out)
            i = end
            continue

        # Doctest blocks.
        if stripped.startswith(">>>"):
            while i < n and lines[i].strip():
                i += 1
            continue

        # Simple tables: from a border line to a border line followed by a blank line (without one, only the
        # block up to the next blank line is dropped).
        if _RST_SIMPLE_TABLE_BORDER.match(stripped):
            j = i + 1
            while j < n and not (_RST_SIMPLE_TABLE_BORDER.match(lines[j].strip())
                                 and (j + 1 == n or not lines[j + 1].strip())):
                j += 1
            if j == n:
                j = i
                while j < n and lines[j].strip():
                    j += 1
            i = j + 1
            continue

        # Grid tables.
        if stripped.startswith("+-") or stripped.startswith("+="):
            while i < n and _RST_GRID_LINE.match(lines[i].strip()):
                i += 1
            continue

        # A paragraph: consecutive non-blank lines at this indentation or deeper (definition bodies included).
        para = []
        while i < n and lines[i].strip() and not (para and _indent(lines[i]) < indent):
            para.append(lines[i])
            i += 1

        # Section titles: over/underlines end the title (the text may follow without a blank line).
        groups: list[list[str]] = [[]]
        for l in para:
            if _RST_ADORNMENT.match(l.strip()):
                groups.append([])
            else:
                groups[-1].append(l)
        literal_follows = False
        for group in filter(None, groups):
            literal_follows = _rst_paragraph(group, out)

        if literal_follows:
            # The literal block: the following lines indented deeper than the paragraph (blank lines included).
            while i < n and not lines[i].strip():
                i += 1
            i = _block_end(lines, i, indent) if i < n and _indent(lines[i]) > indent else i


def _rst_paragraph(para: list[str], out: list[str]) -> bool:
    """Emits one paragraph (or its list items); True when it ends with `::` (a literal block follows)."""
    if _RST_FIELD.match(para[0].strip()):  # field lists (":Author: ..."): metadata, dropped
        return False
    literal_follows = False
    items: list[list[str]] = []
    is_list = bool(para) and bool(_RST_LIST_ITEM.match(para[0].strip()))
    for l in para:
        s = l.strip()
        if not items or (is_list and _RST_LIST_ITEM.match(s)):
            items.append([])
        items[-1].append(_RST_LIST_ITEM.sub("", s, count=1) if is_list and not items[-1] else s)
    for k, item in enumerate(items):
        text = " ".join(item)
        if k == len(items) - 1 and text.endswith("::"):
            literal_follows = True
            text = text[:-2].rstrip() if text[:-2].endswith(" ") or text == "::" else text[:-1]
        text = rst_inline_to_text(text)
        if text.strip():
            out.append(text)
    return literal_follows


def rst_to_paragraphs(source: str) -> list[str]:
    """Prose paragraphs of a reStructuredText document, in order (raw text, not yet normalized): section titles,
    body paragraphs, list items (each its own paragraph), admonition and API-description bodies. Dropped: literal
    blocks after `::`, directives in RST_DROP_DIRECTIVES with their bodies, comments, targets, doctest blocks,
    simple and grid tables, field lists, section adornments."""
    lines = source.expandtabs(8).splitlines()
    out: list[str] = []
    _rst_walk(lines, out)
    return out
