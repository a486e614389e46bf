"""`agentrl view RUN_OR_DIR`: browse recorded episodes and a run's curves in a local web page."""

from __future__ import annotations

import ipaddress
import webbrowser
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from agentrl.errors import AgentRLError

console = Console(soft_wrap=True)


def view(
    path: Annotated[Path, typer.Argument(help="A run directory, a --record directory, or a folder of runs.")],
    host: Annotated[str, typer.Option(help="Address to listen on; loopback unless you mean to share it.")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(help="Port; 0 picks a free one.", min=0, max=65535)] = 8765,
    tokenizer: Annotated[
        Path | None, typer.Option(help="tokenizer.json or model dir to show token text (found in runs).")
    ] = None,
    open_browser: Annotated[bool, typer.Option("--open", help="Open the page in a browser.")] = False,
) -> None:
    """Serve the viewer until Ctrl-C. The page updates live while a run is writing."""
    from agentrl.viewer import Catalog, ViewerServer

    try:
        catalog = Catalog(path, tokenizer)
        server = ViewerServer(catalog, host, port)
    except (AgentRLError, OSError) as exc:
        console.print(f"[bold red]error:[/] {exc}", highlight=False)
        raise typer.Exit(2) from None
    if not _is_loopback(host):
        console.print(f"[yellow]warning:[/] listening on {host}: whoever reaches it can read the episodes")
    runs = len(catalog.runs())
    console.print(f"agentrl viewer on {server.url} ({runs} runs under {path}); Ctrl-C stops it")
    if open_browser:
        webbrowser.open(server.url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.httpd.server_close()


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def register(app: typer.Typer) -> None:
    """Add this module's commands to the main app."""
    app.command("view")(view)
