"""The shop as a Starlette app: search, result pages, product pages with options, cart, checkout.

Per-session state (chosen options, cart, the placed order) lives in a bounded `SessionStore`.
The env reads the placed order from `GET /api/sessions/{sid}/order` and grades it itself, so
the server needs to know nothing about tasks.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from html import escape
from urllib.parse import quote_plus

from agentrl_web.pages import button_form, expired, form_data, link, page, search_form, session_api_routes
from agentrl_web.sessions import SessionStore
from agentrl_web.shop.catalog import OrderItem, build_catalogue
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

PAGE_SIZE = 10
MAX_CART = 20


@dataclass
class ShopSession:
    selected: dict[int, dict[str, str]] = field(default_factory=dict)  # pid -> option -> value
    cart: list[OrderItem] = field(default_factory=list)
    order: list[OrderItem] | None = None


def create_app(catalogue_seed: int = 0, *, max_sessions: int = 4096, ttl: float = 1800.0) -> Starlette:
    catalogue = build_catalogue(catalogue_seed)
    store: SessionStore[ShopSession] = SessionStore(ShopSession, max_sessions=max_sessions, ttl=ttl)

    def header(sid: str, state: ShopSession) -> str:
        return (
            f"<nav>{link(f'/s/{sid}/', 'Home')} | {link(f'/s/{sid}/cart', f'Cart ({len(state.cart)})')}</nav>"
        )

    async def home(request: Request) -> Response:
        sid = request.path_params["sid"]
        if (state := store.get(sid)) is None:
            return expired(sid)
        return page("Shop", header(sid, state) + "<h1>Shop</h1>" + search_form(f"/s/{sid}/search"))

    async def search(request: Request) -> Response:
        sid = request.path_params["sid"]
        if (state := store.get(sid)) is None:
            return expired(sid)
        query = request.query_params.get("q", "")
        try:
            page_no = max(1, int(request.query_params.get("page", "1")))
        except ValueError:
            page_no = 1
        results = catalogue.search(query)
        n_pages = max(1, -(-len(results) // PAGE_SIZE))
        page_no = min(page_no, n_pages)
        shown = results[(page_no - 1) * PAGE_SIZE : page_no * PAGE_SIZE]
        items = "".join(
            f"<li>{link(f'/s/{sid}/product/{p.pid}', f'{p.title} ${p.price:.2f}')}</li>" for p in shown
        )
        nav = []
        base = f"/s/{sid}/search?q={quote_plus(query)}&page="
        if page_no > 1:
            nav.append(link(base + str(page_no - 1), "< Prev"))
        if page_no < n_pages:
            nav.append(link(base + str(page_no + 1), "Next >"))
        body = (
            header(sid, state)
            + search_form(f"/s/{sid}/search", query)
            + f"<p>{len(results)} results for {escape(query)!s}, page {page_no} of {n_pages}</p>"
            + f"<ul>{items}</ul><p>{' '.join(nav)}</p>"
        )
        return page(f"Search: {query}", body)

    def product_page(sid: str, state: ShopSession, pid: int, message: str = "") -> Response:
        product = catalogue.by_pid[pid]
        chosen = state.selected.get(pid, {})
        option_html = ""
        for name, values in product.options.items():
            buttons = "".join(
                button_form(
                    f"/s/{sid}/product/{pid}/option",
                    f"{value} (selected)" if chosen.get(name) == value else value,
                    {name: value},
                )
                for value in values
            )
            option_html += f"<div><p>{name}:</p>{buttons}</div>"
        body = (
            header(sid, state)
            + f"<h1>{escape(product.title)}</h1>"
            + f"<p>Price: ${product.price:.2f}</p><p>Category: {product.category}. "
            + f"Material: {product.material}. Style: {product.style}.</p>"
            + (f"<p><b>{escape(message)}</b></p>" if message else "")
            + option_html
            + button_form(f"/s/{sid}/cart/add", "Add to cart", {"pid": str(pid)})
        )
        return page(product.title, body)

    async def product(request: Request) -> Response:
        sid = request.path_params["sid"]
        if (state := store.get(sid)) is None:
            return expired(sid)
        pid = request.path_params["pid"]
        if pid not in catalogue.by_pid:
            return page("Not found", header(sid, state) + "<p>No such product.</p>", status=404)
        return product_page(sid, state, pid)

    async def choose_option(request: Request) -> Response:
        sid, pid = request.path_params["sid"], request.path_params["pid"]
        if (state := store.get(sid)) is None:
            return expired(sid)
        if pid not in catalogue.by_pid:
            return page("Not found", header(sid, state) + "<p>No such product.</p>", status=404)
        options = catalogue.by_pid[pid].options
        for name, value in (await form_data(request)).items():
            if value in options.get(name, ()):
                state.selected.setdefault(pid, {})[name] = value
        return RedirectResponse(f"/s/{sid}/product/{pid}", status_code=303)

    async def add_to_cart(request: Request) -> Response:
        sid = request.path_params["sid"]
        if (state := store.get(sid)) is None:
            return expired(sid)
        try:
            pid = int((await form_data(request)).get("pid", ""))
        except ValueError:
            pid = -1
        if pid not in catalogue.by_pid:
            return page("Not found", header(sid, state) + "<p>No such product.</p>", status=404)
        chosen = state.selected.get(pid, {})
        missing = [name for name in catalogue.by_pid[pid].options if name not in chosen]
        if missing:
            return product_page(sid, state, pid, f"Please choose a {' and a '.join(missing)} first.")
        if len(state.cart) >= MAX_CART:
            return cart_page(sid, state, f"The cart holds at most {MAX_CART} items.")
        state.cart.append(OrderItem(pid, dict(chosen), catalogue.by_pid[pid].price))
        return RedirectResponse(f"/s/{sid}/cart", status_code=303)

    def cart_page(sid: str, state: ShopSession, message: str = "") -> Response:
        rows = "".join(
            f"<li>{link(f'/s/{sid}/product/{item.pid}', catalogue.by_pid[item.pid].title)} "
            f"({', '.join(f'{k}: {v}' for k, v in item.options.items())}) ${item.price:.2f}"
            f"{button_form(f'/s/{sid}/cart/remove', 'Remove', {'index': str(i)})}</li>"
            for i, item in enumerate(state.cart)
        )
        total = sum(item.price for item in state.cart)
        body = (
            header(sid, state)
            + "<h1>Cart</h1>"
            + (f"<p><b>{escape(message)}</b></p>" if message else "")
            + (f"<ul>{rows}</ul><p>Total: ${total:.2f}</p>" if state.cart else "<p>Your cart is empty.</p>")
            + button_form(f"/s/{sid}/checkout", "Checkout")
        )
        return page("Cart", body)

    async def cart(request: Request) -> Response:
        sid = request.path_params["sid"]
        if (state := store.get(sid)) is None:
            return expired(sid)
        return cart_page(sid, state)

    async def remove_from_cart(request: Request) -> Response:
        sid = request.path_params["sid"]
        if (state := store.get(sid)) is None:
            return expired(sid)
        index = (await form_data(request)).get("index", "")
        if index.isdigit() and int(index) < len(state.cart):
            state.cart.pop(int(index))
        return RedirectResponse(f"/s/{sid}/cart", status_code=303)

    async def checkout(request: Request) -> Response:
        sid = request.path_params["sid"]
        if (state := store.get(sid)) is None:
            return expired(sid)
        if not state.cart:
            return cart_page(sid, state, "Add an item before checking out.")
        if state.order is None:  # one order per session: the episode ends with it
            state.order, state.cart = state.cart, []
        return RedirectResponse(f"/s/{sid}/order", status_code=303)

    async def order(request: Request) -> Response:
        sid = request.path_params["sid"]
        if (state := store.get(sid)) is None:
            return expired(sid)
        if state.order is None:
            return page("No order", header(sid, state) + "<p>No order has been placed.</p>")
        lines = "".join(
            f"<li>{escape(catalogue.by_pid[i.pid].title)} "
            f"({', '.join(f'{k}: {v}' for k, v in i.options.items())}) ${i.price:.2f}</li>"
            for i in state.order
        )
        return page("Order placed", f"<h1>Thank you, your order is placed</h1><ul>{lines}</ul>")

    async def order_api(request: Request) -> Response:
        sid = request.path_params["sid"]
        if (state := store.get(sid)) is None:
            return JSONResponse({"error": "unknown session"}, status_code=404)
        items = None if state.order is None else [asdict(i) for i in state.order]
        return JSONResponse({"placed": state.order is not None, "items": items})

    routes = [
        *session_api_routes("shop", store, {"seed": catalogue_seed, "products": len(catalogue.products)}),
        Route("/api/sessions/{sid}/order", order_api),
        Route("/s/{sid}/", home),
        Route("/s/{sid}/search", search),
        Route("/s/{sid}/product/{pid:int}", product),
        Route("/s/{sid}/product/{pid:int}/option", choose_option, methods=["POST"]),
        Route("/s/{sid}/cart", cart),
        Route("/s/{sid}/cart/add", add_to_cart, methods=["POST"]),
        Route("/s/{sid}/cart/remove", remove_from_cart, methods=["POST"]),
        Route("/s/{sid}/checkout", checkout, methods=["POST"]),
        Route("/s/{sid}/order", order),
    ]
    app = Starlette(routes=routes)
    app.state.catalogue = catalogue
    app.state.sessions = store
    return app
