"""The documentation site builds with warnings as errors, offline, and documents the API.

``mkdocs build --strict`` (mkdocs.yml at the repository root) fails on a
broken link or anchor between pages, a page left out of the nav, and any
warning griffe or mkdocstrings raise on a docstring. The API reference
renders what ``lr_client`` and ``lr_server`` export (their ``__all__``), so a
name added there appears without editing the pages.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import lr_client
import lr_server
from tests.kit.ports import reserve_port
from tests.kit.procs import ROOT, lr_env, track
from tests.kit.wait import scaled, wait_for

#: A proxy nothing listens on: a build that fetched anything over HTTP would fail.
NO_NETWORK = {
    "http_proxy": "http://127.0.0.1:9",
    "https_proxy": "http://127.0.0.1:9",
    "HTTP_PROXY": "http://127.0.0.1:9",
    "HTTPS_PROXY": "http://127.0.0.1:9",
    "no_proxy": "",
    "NO_PROXY": "",
}
#: A script, style sheet or image loaded from another host.
REMOTE_ASSET = re.compile(r'<(?:script|link|img)[^>]*(?:src|href)="https?://')


def build(site_dir: Path, config: Path = ROOT / "mkdocs.yml") -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` of ``config`` into ``site_dir``, without network."""
    command = ["mkdocs", "build", "--strict", "-f", str(config), "-d", str(site_dir)]
    return subprocess.run(
        [sys.executable, "-m", *command],
        cwd=ROOT,
        env={**lr_env(), **NO_NETWORK},
        capture_output=True,
        text=True,
        timeout=scaled(120),
    )


def exported(module: object) -> list[str]:
    return [n for n in getattr(module, "__all__", []) if not n.startswith("_")]


def test_site_builds_strict_with_every_page_and_exported_name(tmp_path: Path) -> None:
    done = build(tmp_path / "site")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING" not in done.stderr, done.stderr

    site = tmp_path / "site"
    # `mkdocs build` in the repository writes to site/, which git ignores.
    assert re.search(r"^site_dir: site$", (ROOT / "mkdocs.yml").read_text(), re.M)
    assert "/site/" in (ROOT / ".gitignore").read_text().splitlines()
    pages = sorted(p.relative_to(ROOT / "docs") for p in (ROOT / "docs").rglob("*.md"))
    for page in pages:
        assert (site / page.with_suffix("") / "index.html").exists() or page.name == "index.md"
    assert (site / "index.html").exists()

    for module, page in ((lr_client, "lr_client"), (lr_server, "lr_server")):
        html = (site / "reference" / page / "index.html").read_text()
        for name in exported(module):
            assert f'id="{page}.{name}"' in html, f"{page}.{name} missing from the API reference"
    assert {"RoutingQueueClient", "RoutingQueueSubscriber", "RoutingQueueListener"} <= set(
        exported(lr_client)
    )

    client_page = (site / "reference" / "lr_client" / "index.html").read_text()
    # reST roles in docstrings are shown as code, not verbatim.
    assert ":class:" not in client_page and ":meth:" not in client_page
    assert "<code>RoutingQueueClient</code> transmits payloads" in client_page
    # A `#:` comment above a module attribute is its docstring.
    assert "Default payload limit" in client_page

    # Viewable offline: no page loads a script, style sheet or image from elsewhere.
    for html_file in site.rglob("*.html"):
        remote = REMOTE_ASSET.findall(html_file.read_text())
        assert remote == [], html_file


def test_broken_links_anchors_and_docstrings_fail_the_build(tmp_path: Path) -> None:
    """A copy of the docs and of lr_client, each with one fault, built with the same config."""
    docs, src = tmp_path / "docs", tmp_path / "src"
    shutil.copytree(ROOT / "docs", docs)
    with (docs / "quickstart.md").open("a") as f:
        f.write("\n[gone](no-such-page.md) and [lost](guarantees.md#no-such-section)\n")
    shutil.copytree(ROOT / "lr_client", src / "lr_client")
    store_init = src / "lr_client" / "store" / "__init__.py"
    code, found = re.subn(
        r"^(def create_engine\(.*?\).*?:\n)",
        r'\1    """:param nope: no such."""\n',
        store_init.read_text(),
        count=1,
        flags=re.M | re.S,
    )
    assert found == 1
    store_init.write_text(code)

    text = (ROOT / "mkdocs.yml").read_text()
    for old, new in (
        ("docs_dir: docs", f"docs_dir: {docs}"),
        ("paths: [.]", f"paths: [{src}, {ROOT}]"),
        ("- scripts/griffe_docstrings.py", f"- {ROOT}/scripts/griffe_docstrings.py"),
    ):
        assert old in text
        text = text.replace(old, new)
    config = tmp_path / "mkdocs.yml"
    config.write_text(text)

    done = build(tmp_path / "site", config)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    warnings = [line for line in output.splitlines() if line.startswith("WARNING")]
    for fault in (
        "contains a link 'no-such-page.md', but the target is not found",
        "does not contain an anchor '#no-such-section'",
        "Parameter 'nope' does not appear in the function signature",
    ):
        assert any(fault in line for line in warnings), (fault, output)


def test_mkdocs_serve_serves_the_api_reference(tmp_path: Path) -> None:
    port = reserve_port()
    log_path = tmp_path / "mkdocs-serve.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mkdocs", "serve", "--no-livereload", "-a", f"127.0.0.1:{port}"],
            cwd=ROOT,
            env={**lr_env(), **NO_NETWORK},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    track("mkdocs serve", log_path, proc)

    def page() -> str:
        assert proc.poll() is None, log_path.read_text()
        try:
            url = f"http://127.0.0.1:{port}/reference/lr_client/"
            direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
            with direct.open(url, timeout=5) as resp:
                return str(resp.read().decode())
        except OSError:
            return ""

    try:
        html = wait_for(page, 60, what="mkdocs serve answering", detail=log_path.read_text)
        assert 'id="lr_client.RoutingQueueClient"' in html
    finally:
        proc.terminate()
        proc.wait(timeout=scaled(30))
