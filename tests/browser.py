"""Mermaid rendered as a reader sees it: a released Mermaid bundle (fetched once with `npm pack`
into the rca cache, only its `mermaid.min.js` kept) drawing a diagram in headless Chromium.

Chromium is the system's (Debian's `chromium`, or `RCA_CHROMIUM`); `.ci/run` installs it. Without
it, or without npm, the tests that render are skipped, and fail under CI, where both must be there."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest

from rca.inputs.sources import cache_dir, made_once

# The newest release of each major version the Markdown viewers ship (GitHub, GitLab, IDE previews).
MERMAID = ("11.17.2", "12.4.0")
# Chromium as a test driver on a closed network: no first-run work, no background connections.
_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--virtual-time-budget=20000",
)
_PAGE = """<!doctype html><html><head><meta charset="utf-8"></head><body>
<pre class="mermaid" id="diagram">{diagram}</pre><pre id="result"></pre>
<script src="{bundle}"></script>
<script>
mermaid.initialize({{startOnLoad: false, securityLevel: "strict"}});
mermaid.run({{querySelector: "#diagram"}}).then(() => {{
  const svg = document.querySelector("#diagram svg");
  const box = svg.viewBox.baseVal;  // its drawn size at scale 1, before a page fits it to its width
  const texts = (selector) => [...svg.querySelectorAll(selector)].map((e) => e.textContent.trim());
  const red = [...svg.querySelectorAll(".edgePaths path")].filter((e) => /#d33/i.test(e.getAttribute("style") || ""));
  document.getElementById("result").textContent = JSON.stringify({{
    width: box.width, height: box.height,
    nodes: texts(".node .nodeLabel"), edge_labels: texts("g.edgeLabel").filter((t) => t),
    clusters: texts(".cluster-label"), red_edges: red.length,
    shaded: [...svg.querySelectorAll(".node.differs")].map((e) => e.textContent.trim()),
  }});
}}).catch((error) => {{
  document.getElementById("result").textContent = JSON.stringify({{error: String(error)}});
}});
</script></body></html>"""


@dataclass(frozen=True)
class Rendered:
    """What a reader sees of a diagram: its drawn size in CSS pixels and the text it shows."""

    width: float
    height: float
    nodes: tuple[str, ...]
    edge_labels: tuple[str, ...]
    clusters: tuple[str, ...]
    red_edges: int
    shaded: tuple[str, ...]


def _required(what: str) -> NoReturn:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} (CI installs it: see .ci/run)", pytrace=False)
    pytest.skip(what)


def chromium() -> str:
    found = os.environ.get("RCA_CHROMIUM") or next(
        (path for name in ("chromium", "chromium-browser", "google-chrome") if (path := shutil.which(name))), None
    )
    if found is None:
        _required(
            "no Chromium to render with: install Debian's chromium (apt-get install chromium) or set RCA_CHROMIUM"
        )
    return str(found)


def mermaid_bundle(version: str) -> Path:
    """mermaid.min.js of a release, fetched once (`npm pack`, 28 MB, only the bundle kept)."""
    npm = shutil.which("npm")
    if npm is None:
        _required("no npm to fetch Mermaid with: install Node.js and npm")
    dest = cache_dir() / "browser" / f"mermaid-{version}"

    def make() -> None:
        dest.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as scratch:
            subprocess.run(
                [str(npm), "pack", "--silent", f"mermaid@{version}"], cwd=scratch, check=True, capture_output=True
            )
            with tarfile.open(Path(scratch) / f"mermaid-{version}.tgz") as archive:
                member = archive.extractfile("package/dist/mermaid.min.js")
                assert member is not None
                (dest / "mermaid.min.js").write_bytes(member.read())
        (dest / ".complete").write_text(f"mermaid@{version}\n")

    return made_once(dest, f"mermaid-{version}", make) / "mermaid.min.js"


def render(diagram: str, version: str, scratch: Path) -> Rendered:
    """The diagram drawn by Mermaid `version` in headless Chromium, as a page that loads nothing else."""
    bundle = mermaid_bundle(version)
    page = scratch / "diagram.html"
    page.write_text(_PAGE.format(diagram=html.escape(diagram), bundle=bundle.as_uri()), encoding="utf-8")
    browser = chromium()
    done = subprocess.run(
        [browser, *_FLAGS, f"--user-data-dir={scratch / 'profile'}", "--dump-dom", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    found = re.search(r'<pre id="result">(.*?)</pre>', done.stdout, re.DOTALL)
    assert found and found[1], f"Chromium drew nothing (exit {done.returncode}): {done.stderr[-2000:]}"
    result = json.loads(html.unescape(found[1]))
    assert "error" not in result, f"Mermaid {version} refused the diagram: {result['error']}\n{diagram}"
    return Rendered(
        result["width"],
        result["height"],
        tuple(result["nodes"]),
        tuple(result["edge_labels"]),
        tuple(result["clusters"]),
        result["red_edges"],
        tuple(result["shaded"]),
    )
