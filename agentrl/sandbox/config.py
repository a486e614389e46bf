"""Limits and pool settings shared by every sandbox backend (one validated record, not kwargs soup)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class SandboxConfig(BaseModel):
    """What each sandbox may use, and how the pool keeps sandboxes ready.

    Unknown field names are rejected (pydantic names the field), so a typo such as `memroy_mb`
    fails loudly instead of silently running with the default limit.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    size: int = Field(4, ge=1, le=256, description="sandboxes kept ready (warm) in the pool")
    memory_mb: int = Field(
        256, ge=16, description="memory cap per sandbox (Docker: cgroup; process: RLIMIT_AS)"
    )
    cpus: float = Field(
        1.0, gt=0, description="CPU cap per sandbox (Docker only; process: RLIMIT_CPU per run)"
    )
    pids: int = Field(
        64, ge=4, description="max processes/threads per sandbox (Docker: pids cgroup; process: RLIMIT_NPROC)"
    )
    work_mb: int = Field(64, ge=1, description="size of the writable work dir (tmpfs)")
    tmp_mb: int = Field(16, ge=1, description="size of the writable /tmp (tmpfs)")
    max_file_mb: int = Field(64, ge=1, description="largest file a program may write (RLIMIT_FSIZE)")
    open_files: int = Field(256, ge=16, description="RLIMIT_NOFILE")
    creates_per_second: float = Field(4.0, gt=0, description="rate limit on sandbox creation")
    max_concurrent_creates: int = Field(2, ge=1, description="sandboxes being created at once")
    acquire_timeout: float = Field(120.0, gt=0, description="seconds acquire() waits for a free sandbox")
    reset_timeout: float = Field(
        10.0, gt=0, description="seconds a release reset may take before the sandbox is replaced"
    )
    # Docker backend
    image: str = Field("agentrl-sandbox:latest", description="image with python3 and a uid-1000 user")
    user: str = Field("1000:1000", description="uid:gid programs run as in the container")
    # Process backend
    host_uid: int = Field(
        64999, ge=1, description="unprivileged host uid the process sandbox runs as (owns no files)"
    )
