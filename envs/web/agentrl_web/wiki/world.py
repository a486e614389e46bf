"""A small seeded world (countries, cities, people, companies, rivers), its articles and tasks.

Each article is a list of paragraphs; a paragraph is a list of segments, either plain text or a
`Ref` (a hyperlink to another article). The app renders the segments as HTML, and the same
segments define the link graph that the scripted expert searches, so the two cannot disagree.

Tasks (drawn with a seed):
- navigate: start on article A, reach article B (2 to 4 links away) by following links;
  reward 1.0 when B is reached.
- question: start on the home page; answer a question whose answer is written on one article
  (one or two hops from the article the question names); reward 1.0 for the right answer
  (compared after lower-casing and dropping punctuation and a leading "the"), else 0.0.
"""

from __future__ import annotations

import functools
import re
from collections import deque
from dataclasses import dataclass, field

import numpy as np

_SYLLABLES = [
    "ka",
    "lo",
    "ri",
    "ven",
    "mar",
    "tel",
    "sor",
    "an",
    "bel",
    "dor",
    "fi",
    "gra",
    "hul",
    "is",
    "jor",
    "ke",
    "lum",
    "ne",
    "or",
    "pa",
    "qui",
    "ros",
    "sa",
    "tor",
    "ul",
    "vi",
    "wen",
    "za",
]
_CITY_SUFFIX = ["ton", "burg", "ville", "port", "dale", "ford", "stad", "mouth"]
_COUNTRY_SUFFIX = ["ia", "land", "ar", "stan"]
_COMPANY_SUFFIX = ["Industries", "Labs", "Works", "Foods", "Motors", "Systems", "Textiles", "Shipping"]
_INDUSTRY = {
    "Industries": "steel",
    "Labs": "medicine",
    "Works": "machinery",
    "Foods": "food",
    "Motors": "automobiles",
    "Systems": "software",
    "Textiles": "clothing",
    "Shipping": "freight",
}
_OCCUPATIONS = ["engineer", "painter", "physician", "writer", "chemist", "architect", "composer", "merchant"]


@dataclass(frozen=True)
class Ref:
    """A hyperlink segment: the text shown and the slug of the article it points to."""

    slug: str
    text: str


Segment = str | Ref


@dataclass
class Article:
    slug: str
    title: str
    kind: str
    paragraphs: list[list[Segment]] = field(default_factory=list)

    @property
    def links(self) -> list[str]:
        return [s.slug for p in self.paragraphs for s in p if isinstance(s, Ref)]

    @property
    def text(self) -> str:
        return " ".join("".join(s.text if isinstance(s, Ref) else s for s in p) for p in self.paragraphs)


@dataclass(frozen=True)
class Task:
    kind: str  # "navigate" or "question"
    instruction: str
    start: str | None  # start article slug; None = the home page
    target: str  # the article to reach (navigate) or where the answer is written (question)
    subject: str  # the article the instruction names (what an agent would search for)
    answer: str = ""


class World:
    """All articles of one seed, the link graph, and the tasks over them."""

    def __init__(
        self, articles: list[Article], questions: list[tuple[str, str, str, str]], seed: int
    ) -> None:
        self.articles = {a.slug: a for a in articles}
        self.featured = [a.slug for a in articles if a.kind == "country"]
        self._questions = questions  # (question, answer, answer article, subject article)
        self.seed = seed

    def search(self, query: str, limit: int = 10) -> list[Article]:
        words = set(re.findall(r"[a-z0-9]+", query.lower()))
        scored = [
            (len(words & set(re.findall(r"[a-z0-9]+", a.title.lower()))), a) for a in self.articles.values()
        ]
        return [a for score, a in sorted(scored, key=lambda s: (-s[0], s[1].slug)) if score > 0][:limit]

    def path(self, start: str, goal: str) -> list[str] | None:
        """A shortest list of slugs from `start` to `goal` following links (BFS), or None."""
        parent: dict[str, str | None] = {start: None}
        queue = deque([start])
        while queue:
            slug = queue.popleft()
            if slug == goal:
                route = [slug]
                while (prev := parent[route[-1]]) is not None:
                    route.append(prev)
                return route[::-1]
            for nxt in self.articles[slug].links:
                if nxt not in parent:
                    parent[nxt] = slug
                    queue.append(nxt)
        return None

    def sample_task(self, rng: np.random.Generator, kind: str = "mixed") -> Task:
        if kind not in ("mixed", "navigate", "question"):
            raise ValueError(f"task kind must be 'mixed', 'navigate' or 'question', not {kind!r}")
        if kind == "mixed":
            kind = "navigate" if rng.random() < 0.5 else "question"
        if kind == "question":
            question, answer, where, subject = self._questions[int(rng.integers(len(self._questions)))]
            return Task("question", f"Answer the question: {question}", None, where, subject, answer)
        slugs = sorted(self.articles)
        while True:
            start, goal = (slugs[int(i)] for i in rng.choice(len(slugs), size=2, replace=False))
            route = self.path(start, goal)
            if route is not None and 3 <= len(route) <= 5:
                title = self.articles[goal].title
                return Task(
                    "navigate",
                    f"Starting from '{self.articles[start].title}', reach the article "
                    f"'{title}' by following links.",
                    start,
                    goal,
                    goal,
                )


def normalize_answer(text: str) -> str:
    words = re.sub(r"[^a-z0-9 ]", "", text.lower().replace(",", "")).split()
    if words and words[0] == "the":
        words = words[1:]
    return " ".join(words)


def _a(noun: str) -> str:
    return ("an " if noun[0] in "aeiou" else "a ") + noun


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


class _Names:
    """Unique pronounceable names from syllables."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.used: set[str] = set()

    def word(self, syllables: tuple[int, int], suffix: list[str] | None = None) -> str:
        while True:
            n = int(self.rng.integers(syllables[0], syllables[1] + 1))
            stem = "".join(_SYLLABLES[int(self.rng.integers(len(_SYLLABLES)))] for _ in range(n))
            word = (stem + (suffix[int(self.rng.integers(len(suffix)))] if suffix else "")).capitalize()
            if word not in self.used:
                self.used.add(word)
                return word


@functools.lru_cache(maxsize=8)
def build_world(seed: int = 0) -> World:
    """Generate the world of `seed`: facts first, then articles that state them with links."""
    rng = np.random.default_rng(seed)
    names = _Names(rng)

    def pick(n: int) -> int:
        return int(rng.integers(n))

    countries = [names.word((2, 2), _COUNTRY_SUFFIX) for _ in range(5)]
    cities = [
        {
            "name": names.word((1, 2), _CITY_SUFFIX),
            "country": i % 5,
            "pop": int(rng.integers(20, 2000)) * 1000,
            "founded": int(rng.integers(900, 1800)),
        }
        for i in range(18)
    ]
    rivers = [
        {"name": "River " + names.word((2, 3)), "cities": sorted({pick(18) for _ in range(3)})}
        for _ in range(6)
    ]
    people = [
        {
            "name": f"{names.word((1, 2))} {names.word((2, 3))}",
            "born": pick(18),
            "year": int(rng.integers(1850, 1990)),
            "job": _OCCUPATIONS[pick(len(_OCCUPATIONS))],
            "employer": None,
        }
        for _ in range(40)
    ]
    companies = []
    for _ in range(14):
        suffix = _COMPANY_SUFFIX[pick(len(_COMPANY_SUFFIX))]
        founder = pick(len(people))
        companies.append(
            {
                "name": f"{names.word((2, 2))} {suffix}",
                "industry": _INDUSTRY[suffix],
                "founder": founder,
                "hq": pick(18),
                "year": people[founder]["year"] + int(rng.integers(20, 50)),
            }
        )
    for person in people:
        if rng.random() < 0.6:
            person["employer"] = pick(len(companies))

    slug = {("country", i): _slug(n) for i, n in enumerate(countries)}
    slug |= {("city", i): _slug(c["name"]) for i, c in enumerate(cities)}
    slug |= {("river", i): _slug(r["name"]) for i, r in enumerate(rivers)}
    slug |= {("person", i): _slug(p["name"]) for i, p in enumerate(people)}
    slug |= {("company", i): _slug(c["name"]) for i, c in enumerate(companies)}

    def ref(kind: str, i: int) -> Ref:
        name = {
            "country": lambda: countries[i],
            "city": lambda: cities[i]["name"],
            "river": lambda: rivers[i]["name"],
            "person": lambda: people[i]["name"],
            "company": lambda: companies[i]["name"],
        }[kind]()
        return Ref(slug[(kind, i)], name)

    def listing(refs: list[Ref]) -> list[Segment]:
        out: list[Segment] = []
        for k, r in enumerate(refs):
            out += ([", "] if k else []) + [r]
        return out

    articles = []
    for i, name in enumerate(countries):
        own = [j for j, c in enumerate(cities) if c["country"] == i]
        capital = own[0]
        paras: list[list[Segment]] = [
            [f"{name} is a country. Its capital is ", ref("city", capital), "."],
            ["Cities of " + name + ": ", *listing([ref("city", j) for j in own]), "."],
        ]
        flowing = [k for k, r in enumerate(rivers) if any(cities[j]["country"] == i for j in r["cities"])]
        if flowing:
            paras.append(["Rivers: ", *listing([ref("river", k) for k in flowing]), "."])
        articles.append(Article(slug[("country", i)], name, "country", paras))
    for i, city in enumerate(cities):
        paras = [
            [
                f"{city['name']} is a city in ",
                ref("country", city["country"]),
                f", founded in {city['founded']}, with a population of {city['pop']:,}.",
            ]
        ]
        on = [k for k, r in enumerate(rivers) if i in r["cities"]]
        if on:
            paras.append([f"{city['name']} lies on the ", *listing([ref("river", k) for k in on]), "."])
        natives = [k for k, p in enumerate(people) if p["born"] == i]
        if natives:
            paras.append(["Notable people born here: ", *listing([ref("person", k) for k in natives]), "."])
        based = [k for k, c in enumerate(companies) if c["hq"] == i]
        if based:
            paras.append(["Companies based here: ", *listing([ref("company", k) for k in based]), "."])
        articles.append(Article(slug[("city", i)], city["name"], "city", paras))
    for i, river in enumerate(rivers):
        paras = [
            [f"The {river['name']} flows through ", *listing([ref("city", j) for j in river["cities"]]), "."]
        ]
        articles.append(Article(slug[("river", i)], river["name"], "river", paras))
    for i, person in enumerate(people):
        paras = [
            [
                f"{person['name']} (born {person['year']}) is {_a(person['job'])} born in ",
                ref("city", person["born"]),
                ".",
            ]
        ]
        if person["employer"] is not None:
            paras.append([f"{person['name']} works for ", ref("company", person["employer"]), "."])
        founded = [k for k, c in enumerate(companies) if c["founder"] == i]
        if founded:
            paras.append([f"{person['name']} founded ", *listing([ref("company", k) for k in founded]), "."])
        articles.append(Article(slug[("person", i)], person["name"], "person", paras))
    for i, company in enumerate(companies):
        paras = [
            [
                f"{company['name']} is {_a(company['industry'])} company founded in {company['year']} by ",
                ref("person", company["founder"]),
                ". It is headquartered in ",
                ref("city", company["hq"]),
                ".",
            ]
        ]
        articles.append(Article(slug[("company", i)], company["name"], "company", paras))

    questions: list[tuple[str, str, str, str]] = []
    for i, p in enumerate(people):
        questions.append(
            (
                f"In which city was {p['name']} born?",
                cities[p["born"]]["name"],
                slug[("person", i)],
                slug[("person", i)],
            )
        )
        questions.append(
            (f"In what year was {p['name']} born?", str(p["year"]), slug[("person", i)], slug[("person", i)])
        )
    for i, c in enumerate(cities):
        questions.append(
            (
                f"In which country is {c['name']}?",
                countries[c["country"]],
                slug[("city", i)],
                slug[("city", i)],
            )
        )
    for i, c in enumerate(companies):
        s = slug[("company", i)]
        founder = people[c["founder"]]
        questions += [
            (f"Who founded {c['name']}?", founder["name"], s, s),
            (f"In what year was {c['name']} founded?", str(c["year"]), s, s),
            (
                f"In which city was the founder of {c['name']} born?",
                cities[founder["born"]]["name"],
                slug[("person", c["founder"])],
                s,
            ),
            (
                f"In which country is {c['name']} headquartered?",
                countries[cities[c["hq"]]["country"]],
                slug[("city", c["hq"])],
                s,
            ),
        ]
    return World(articles, questions, seed)
