"""test_lab_cli.py"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from typing import Any


def _read_json_doc(stream: Any, timeout_s: float = 20.0) -> dict[str, Any]:
    """Read lines until they form one JSON document."""
    text = ""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = stream.readline()
        if not line:
            break
        text += line
        try:
            doc: dict[str, Any] = json.loads(text)
            return doc
        except json.JSONDecodeError:
            continue
    raise AssertionError(f"no JSON document on stdout: {text!r}")


def test_lab_serve_port_0_json_prints_the_bound_port() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "chainrun", "lab", "serve", "--port", "0", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        doc = _read_json_doc(proc.stdout)
        assert doc["port"] != 0 and doc["base_url"].endswith(f":{doc['port']}/v1")
        with urllib.request.urlopen(f"{doc['base_url']}/models", timeout=5) as r:
            assert r.status == 200
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=10)
