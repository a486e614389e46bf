"""The renderer never fails on bad markup, and action parsing accepts exactly the documented forms."""

from __future__ import annotations

import random

import pytest
from agentrl_web.actions import Action, ActionError, parse_action
from agentrl_web.render import render

PAGE = """<html><head><title>Demo</title><style>p{color:red}</style></head><body>
<nav><a href="/home">Home</a></nav><h1>Hello</h1>
<form method="get" action="/search"><input type="text" name="q" placeholder="search">
<button>Go</button></form>
<p>See <a href="/wiki/paris">Paris</a>, or <a href="x">the &amp; river</a>.</p>
<form method="post" action="/buy"><input type="hidden" name="pid" value="7">
<button name="color" value="red">red</button></form>
<script>document.write("<a href='/evil'>no</a>")</script></body></html>"""


def test_render_lists_links_buttons_inputs_with_ids_in_document_order():
    page = render(PAGE, "http://h/s/abc/page")
    assert page.title == "Demo"
    assert [(e.id, e.kind, e.text) for e in page.elements] == [
        (1, "link", "Home"),
        (2, "input", "search"),
        (3, "button", "Go"),
        (4, "link", "Paris"),
        (5, "link", "the & river"),
        (6, "button", "red"),
    ]
    assert page.elements[0].href == "http://h/home"
    assert page.elements[4].href == "http://h/s/abc/x"
    buy = page.elements[5]
    assert buy.form is not None and buy.form.method == "post" and buy.form.fields == {"pid": "7"}
    assert buy.name == "color" and buy.value == "red"
    assert 'See [4] link "Paris", or [5] link "the & river".' in page.text
    assert "evil" not in page.text and "color:red" not in page.text


@pytest.mark.parametrize(
    "html",
    [
        "",
        "<",
        "<<<>>>",
        "<a href='/x'>unclosed link",
        "<form><input name=q><button>b",
        "</p></div></a>",
        "<a href=>empty</a><a>no href</a>",
        "<title>t",
        "<script>never closed",
        "<input type=hidden name=x>",
        "<div" * 500,
        "\x00\x01<a href='\x00'>nul</a>",
        "<table><tr><td>cell<td>cell</table>&bogus; &#99999999;",
        "<a href='/a'><a href='/b'>nested</a></a>",
        "<button><a href='/c'>link in button</a></button>",
    ],
)
def test_render_survives_malformed_html(html):
    page = render(html, "http://h/s/abc/")
    assert isinstance(page.text, str)
    assert [e.id for e in page.elements] == list(range(1, len(page.elements) + 1))


def test_render_survives_random_markup_soup():
    rng = random.Random(0)
    pieces = [
        "<a href='/x'>",
        "</a>",
        "<form method=post action=/f>",
        "</form>",
        "<button>",
        "</button>",
        "<input name=q>",
        "<p>",
        "</div>",
        "text",
        "&amp;",
        "<script>",
        "</script>",
        "<title>",
        "'\"",
        "<",
    ]
    for _ in range(300):
        render("".join(rng.choice(pieces) for _ in range(rng.randint(0, 40))), "http://h/")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("search[blue cotton shirt]", Action("search", text="blue cotton shirt")),
        ("  CLICK[ 3 ] ", Action("click", 3)),
        ("type[7][hello world]", Action("type", 7, "hello world")),
        ("back", Action("back")),
        ("answer[Paris]", Action("answer", text="Paris")),
        ("I think so. <answer>click[2]</answer>", Action("click", 2)),
        ("<answer>click[1]</answer> no, <answer>back</answer>", Action("back")),
        ("search[a [b] c]", Action("search", text="a [b] c")),
    ],
)
def test_parse_action_accepts_documented_forms(text, expected):
    assert parse_action(text) == expected


@pytest.mark.parametrize(
    "text", ["", "click", "click[x]", "click[3] please", "go back", "<answer></answer>", "[3]"]
)
def test_parse_action_rejects_anything_else_with_usage(text):
    with pytest.raises(ActionError, match="expected one of"):
        parse_action(text)
