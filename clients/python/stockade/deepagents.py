"""Stockade as a deepagents sandbox backend (`deepagents.backends.sandbox.BaseSandbox`),
and a `deepagents-code` sandbox provider published on the entry-point group
`deepagents_code.sandbox_providers` under the name `stockade` (docs/PROVIDERS.md).

    from deepagents import create_deep_agent
    from stockade.deepagents import StockadeSandbox

    backend = StockadeSandbox(key="ci-42", grant=[{"host": "pypi.org"}])
    agent = create_deep_agent(model=..., backend=backend)

`execute` is a Stockade fenced exec holding the sandbox's default `grant` (none unless
given) or the one `stockade_grant(...)` (or `execute(..., grant=...)`) gives it; a
denial is reported in its output. deepagents' `ls`/`read`/`grep`/`glob`/`edit` are its
own scripts run through `execute`; files go in through the upload API (under
/workspace) or an exec fed on stdin, and come back as an exec's stdout (an artifact past
the output limit). This module imports deepagents itself: `import stockade` never does.
"""

from __future__ import annotations

import uuid
from typing import Any, Optional

from deepagents.backends.protocol import ExecuteResponse, FileDownloadResponse, FileUploadResponse
from deepagents.backends.sandbox import BaseSandbox

from . import Stockade, StockadeError
from .fence import Rules, denial_note, grant_for, stockade_grant

try:  # deepagents-code: only its registry loads the provider
    from deepagents_code.integrations.sandbox_provider import (
        SandboxInstallHint,
        SandboxNotFoundError,
        SandboxProvider as _ProviderBase,
        SandboxProviderMetadata,
    )
except ImportError:  # pragma: no cover - deepagents without deepagents-code
    _ProviderBase = object  # type: ignore[assignment,misc]
    SandboxProviderMetadata = None  # type: ignore[assignment,misc]

__all__ = ["StockadeSandbox", "StockadeSandboxProvider", "stockade_grant"]

WORKSPACE = "/workspace"
# Exit codes the file scripts below use to say why (not a command's own).
_NOT_FOUND, _IS_DIR, _DENIED = 44, 45, 46
_READ = ('[ -e "$1" ] || exit 44; [ -d "$1" ] && exit 45; [ -r "$1" ] || exit 46; '
         'cat -- "$1"')
_WRITE = ('[ -d "$1" ] && exit 45; mkdir -p -- "$(dirname -- "$1")" 2>/dev/null; '
          'cat > "$1" 2>/dev/null || exit 46')
_ERRORS = {_NOT_FOUND: "file_not_found", _IS_DIR: "is_directory", _DENIED: "permission_denied"}


class StockadeSandbox(BaseSandbox):
    """One Stockade sandbox key as a deepagents backend."""

    def __init__(self, key: Optional[str] = None, *, client: Optional[Stockade] = None,
                 grant: Optional[Rules] = None, env: Optional[dict[str, str]] = None,
                 timeout: Optional[int] = None, working_dir: str = WORKSPACE) -> None:
        self._key = key or f"deepagents-{uuid.uuid4().hex}"
        self.client = client or Stockade()
        self.grant = [dict(r) for r in grant] if grant else None
        self.env = dict(env or {})
        self.timeout = timeout
        self.working_dir = working_dir

    @property
    def id(self) -> str:
        return self._key

    def _run(self, argv: list[str], *, grant: Optional[list[dict]] = None,
             stdin: Optional[bytes] = None, timeout: Optional[int] = None):
        return self.client.exec(self._key, argv, cwd=self.working_dir, env=self.env or None,
                                timeout_ms=None if timeout is None else max(1, int(timeout * 1000)),
                                grant=grant, stdin=stdin)

    def execute(self, command: str, *, timeout: Optional[int] = None,
                grant: Optional[Rules] = None) -> ExecuteResponse:
        """Run ``command`` (``sh -c``) as a fenced exec: ``grant`` if given, else the block's
        (`stockade_grant`), else the sandbox's default."""
        rules = [dict(r) for r in grant] if grant else grant_for(self.grant)
        try:
            out = self._run(["sh", "-c", command], grant=rules,
                            timeout=timeout if timeout is not None else self.timeout)
        except StockadeError as e:
            return ExecuteResponse(output=f"[stockade] {e}", exit_code=None)
        text = out.stdout.decode("utf-8", "replace")
        err = out.stderr.decode("utf-8", "replace") + denial_note(out.denials)
        if err:
            text = f"{text}{'' if not text or text.endswith(chr(10)) else chr(10)}{err}"
        if out.timed_out:
            text += "\n[stockade] the command timed out and was killed\n"
        return ExecuteResponse(output=text, exit_code=out.exit_code, truncated=out.truncated)

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        answers = []
        for path, data in files:
            if not path.startswith("/"):
                answers.append(FileUploadResponse(path=path, error="invalid_path"))
                continue
            try:
                if path.startswith(WORKSPACE + "/") and ".." not in path.split("/"):
                    # The upload API: a checked stream into /workspace, parents made.
                    self.client.put_file(self._key, path[len(WORKSPACE) + 1:], data)
                    answers.append(FileUploadResponse(path=path))
                    continue
                out = self._run(["sh", "-c", _WRITE, "sh", path], stdin=data)
                answers.append(FileUploadResponse(path=path, error=_ERRORS.get(out.exit_code)
                                                  if out.exit_code else None))
            except StockadeError as e:
                answers.append(FileUploadResponse(path=path, error=str(e)))
        return answers

    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        answers = []
        for path in paths:
            if not path.startswith("/"):
                answers.append(FileDownloadResponse(path=path, error="invalid_path"))
                continue
            try:
                out = self._run(["sh", "-c", _READ, "sh", path])
                if out.exit_code:
                    answers.append(FileDownloadResponse(
                        path=path, error=_ERRORS.get(out.exit_code, out.stderr.decode("utf-8", "replace"))))
                elif out.truncated:
                    answers.append(FileDownloadResponse(path=path, content=self._via_artifact(path)))
                else:
                    answers.append(FileDownloadResponse(path=path, content=out.stdout))
            except StockadeError as e:
                answers.append(FileDownloadResponse(path=path, error=str(e)))
        return answers

    def _via_artifact(self, path: str) -> bytes:
        """A file past the exec output limit: copied to /artifacts, read back in parts."""
        name = f".stockade-deepagents-{uuid.uuid4().hex}"
        try:
            out = self._run(["cp", "--", path, f"/artifacts/{name}"])
            if out.exit_code:
                raise StockadeError(500, "failed", out.stderr.decode("utf-8", "replace"))
            return self.client.read_artifact(self._key, name)
        finally:
            self._run(["rm", "-f", "--", f"/artifacts/{name}"])

    def close(self) -> None:
        """Abort the key: its container and workspace go (the last checkpoint stays)."""
        self.client.abort(self._key)


class StockadeSandboxProvider(_ProviderBase):
    """deepagents-code's provider `stockade` (the entry point in pyproject.toml): a sandbox
    id is a Stockade key. `get_or_create(grant=[...])` sets the sandbox's default grant
    (deepagents-code passes `[sandboxes.providers.stockade] params` from its config)."""

    def __init__(self, client: Optional[Stockade] = None) -> None:
        self._client = client

    @property
    def metadata(self):
        if SandboxProviderMetadata is None:
            return None
        return SandboxProviderMetadata(
            name="stockade", working_dir=WORKSPACE,
            install=SandboxInstallHint(kind="package", name="stockade"),
            supports_sandbox_id=True, supports_snapshot_name=False,
            backend_module="stockade.deepagents")

    def _client_or_default(self) -> Stockade:
        if self._client is None:
            self._client = Stockade()
        return self._client

    def get_or_create(self, *, sandbox_id: Optional[str] = None, **kwargs: Any) -> StockadeSandbox:
        # A key needs no creating: its first exec ensures its container.
        return StockadeSandbox(sandbox_id, client=self._client_or_default(),
                               grant=kwargs.get("grant"), env=kwargs.get("env"),
                               timeout=kwargs.get("timeout"))

    def delete(self, *, sandbox_id: str, **kwargs: Any) -> None:
        try:
            self._client_or_default().abort(sandbox_id)
        except StockadeError as e:
            if e.status == 404:
                raise SandboxNotFoundError(sandbox_id) from e
            raise
