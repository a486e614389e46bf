"""HTML -> a compact text page that lists the actionable elements with numeric ids.

Built on the stdlib `html.parser`, which never raises on malformed markup (unclosed tags, stray
end tags, broken attributes): whatever the page looks like, the agent gets text. Links, buttons
and text inputs become numbered elements written inline where they appear, e.g.

    [3] link "Northwind classic cotton shirt $24.00"
    [5] button "Add to cart"
    [7] input "q" (search)

Hidden inputs are kept as form fields (they are submitted with the form's buttons) and not shown.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Literal
from urllib.parse import urljoin

_BLOCK = {
    "p",
    "div",
    "li",
    "ul",
    "ol",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "tr",
    "br",
    "nav",
    "form",
    "table",
    "section",
    "header",
    "footer",
    "hr",
    "dt",
    "dd",
    "body",
    "article",
    "main",
}
_SKIP = {"script", "style", "noscript", "template"}
_TEXT_INPUTS = {"text", "search", "email", "number", "password", "tel", "url", ""}
_SPACE = re.compile(r"\s+")
_TIGHT = re.compile(r'" ([.,;:!?])')  # `link "Paris" .` -> `link "Paris".`


@dataclass
class Form:
    action: str
    method: str
    fields: dict[str, str] = field(default_factory=dict)  # hidden inputs and text-input defaults


@dataclass
class Element:
    id: int
    kind: Literal["link", "button", "input"]
    text: str
    href: str = ""  # links: absolute URL
    form: Form | None = None  # buttons and inputs: the form they submit
    name: str = ""  # buttons and inputs: the field name they set
    value: str = ""

    def describe(self) -> str:
        if self.kind == "input":
            shown = f' value="{self.value}"' if self.value else ""
            return f'[{self.id}] input "{self.name}"{shown}' + (f" ({self.text})" if self.text else "")
        return f'[{self.id}] {self.kind} "{self.text}"'


@dataclass
class Page:
    url: str
    status: int
    title: str
    text: str  # the rendered body, elements inline
    elements: list[Element]

    def element(self, element_id: int) -> Element | None:
        return self.elements[element_id - 1] if 1 <= element_id <= len(self.elements) else None


class _Renderer(HTMLParser):
    def __init__(self, url: str) -> None:
        super().__init__(convert_charrefs=True)
        self.url = url
        self.title = ""
        self.lines: list[str] = []
        self.line: list[str] = []
        self.elements: list[Element] = []
        self.form: Form | None = None
        self.skip_depth = 0
        self.in_title = False
        self.open: Element | None = None  # a link or button whose text is being collected
        self.open_text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attr = {k: v or "" for k, v in attrs}
        if tag in _SKIP:
            self.skip_depth += 1
            return
        if tag == "title":
            self.in_title = True
        if tag in _BLOCK:
            self._close_open()
            self._newline()
        if tag == "form":
            self.form = Form(
                urljoin(self.url, attr.get("action", "")), attr.get("method", "get").lower() or "get"
            )
        elif tag == "a" and attr.get("href"):
            self._close_open()
            self.open = Element(0, "link", "", href=urljoin(self.url, attr["href"]))
        elif tag == "button":
            self._close_open()
            self.open = Element(
                0, "button", "", form=self.form, name=attr.get("name", ""), value=attr.get("value", "")
            )
        elif tag == "input":
            self._input(attr)
        elif tag == "textarea":
            self._add(
                Element(0, "input", attr.get("placeholder", ""), form=self.form, name=attr.get("name", ""))
            )

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag not in ("input", "br", "hr"):
            self.handle_endtag(tag)

    def _input(self, attr: dict[str, str]) -> None:
        kind = attr.get("type", "").lower()
        name, value = attr.get("name", ""), attr.get("value", "")
        if kind == "hidden":
            if self.form is not None and name:
                self.form.fields[name] = value
        elif kind in ("submit", "button"):
            self._add(Element(0, "button", value or "Submit", form=self.form, name=name, value=value))
        elif kind in _TEXT_INPUTS:
            if self.form is not None and name:
                self.form.fields.setdefault(name, value)
            self._add(
                Element(0, "input", attr.get("placeholder", ""), form=self.form, name=name, value=value)
            )

    def handle_endtag(self, tag: str) -> None:
        if tag in _SKIP:
            self.skip_depth = max(0, self.skip_depth - 1)
        elif tag == "title":
            self.in_title = False
        elif tag in ("a", "button"):
            self._close_open()
        elif tag == "form":
            self._close_open()
            self.form = None
        if tag in _BLOCK:
            self._newline()

    def handle_data(self, data: str) -> None:
        if self.in_title:
            self.title += data
        elif self.skip_depth:
            return
        elif self.open is not None:
            self.open_text.append(data)
        else:
            self.line.append(data)

    def _add(self, element: Element) -> None:
        element.id = len(self.elements) + 1
        self.elements.append(element)
        self.line.append(" " + element.describe() + " ")

    def _close_open(self) -> None:
        if self.open is None:
            return
        element, self.open = self.open, None
        element.text = _SPACE.sub(" ", "".join(self.open_text)).strip() or element.value or element.href
        self.open_text = []
        self._add(element)

    def _newline(self) -> None:
        text = _TIGHT.sub(r'"\1', _SPACE.sub(" ", "".join(self.line)).strip())
        if text:
            self.lines.append(text)
        self.line = []

    def finish(self) -> tuple[str, str]:
        self.close()
        self._close_open()
        self._newline()
        return _SPACE.sub(" ", self.title).strip(), "\n".join(self.lines)


def render(html: str, url: str, status: int = 200) -> Page:
    """Parse `html` (fetched from `url`) into a `Page`; never raises on bad markup."""
    renderer = _Renderer(url)
    renderer.feed(html)
    title, text = renderer.finish()
    return Page(url=url, status=status, title=title, text=text, elements=renderer.elements)
