"""Other tools run on the bench's collections: dlt, in a venv of its own created on first use.

dlt and pymongoarrow pin pyarrow and pymongo versions of their own, so they live in
``.local/bench-venv`` (``--peer-venv``), never in the project's venv. The venv is made once and
reused while its stamp names the same pins; when it cannot be made (no package index, say) the
bench says why on dlt's row and goes on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

DLT_VERSION = "1.31.0"
# pymongoarrow turns BSON batches into Arrow (dlt's arrow backend for MongoDB); pyarrow 25.0.x is
# the one pymongoarrow 1.15 is built for
PEER_REQUIREMENTS = (f"dlt=={DLT_VERSION}", "pymongoarrow==1.15.0", "pymongo==4.20.0", "pyarrow==25.0.1")
DEFAULT_VENV = Path(".local") / "bench-venv"
INSTALL_TIMEOUT_S = 900
# the project venv's uv (make installs it): 10 s for these pins where pip took 49 with its cache warm
UV = Path(sys.executable).with_name("uv")
RUN_TIMEOUT_S = 3600
_PIPELINE = Path(__file__).with_name("dlt_pipeline.py")


@dataclass(frozen=True)
class PeerRun:
    """One peer's load of a collection; ``error`` says why there is no rate."""

    count: int = 0
    seconds: float = 0.0
    peak_mib: float = 0.0
    error: str = ""


def ensure_venv(venv: Path) -> str:
    """Create ``venv`` with the pinned peer packages unless it has them; '' or why it cannot be had."""
    stamp = venv / ".mongo-cdc-bench"
    wanted = "\n".join(PEER_REQUIREMENTS)
    if stamp.is_file() and stamp.read_text() == wanted and (venv / "bin" / "python").is_file():
        return ""
    print(f"creating {venv} with {' '.join(PEER_REQUIREMENTS)} (once)", flush=True)
    try:
        subprocess.run(
            [sys.executable, "-m", "venv", "--clear", "--without-pip", str(venv)],
            check=True,
            capture_output=True,
            text=True,
        )
        install = [str(UV), "pip", "install", "--quiet", "--python", str(venv / "bin" / "python")]
        subprocess.run(
            [*install, "--compile-bytecode", *PEER_REQUIREMENTS],
            check=True,
            capture_output=True,
            text=True,
            timeout=INSTALL_TIMEOUT_S,
        )
    except subprocess.CalledProcessError as exc:
        lines = (exc.stderr or exc.stdout or "").strip().splitlines()
        return f"install failed: {lines[-1] if lines else exc}"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"could not create {venv}: {exc}"
    stamp.write_text(wanted)
    return ""


def run_dlt(venv: Path, uri: str, db: str, collection: str, work_dir: str) -> PeerRun:
    """dlt's MongoDB → Parquet pipeline over one collection (``dlt_pipeline.py``), in ``venv``."""
    reason = ensure_venv(venv)
    if reason:
        return PeerRun(error=reason)
    task = {"uri": uri, "db": db, "collection": collection, "dir": work_dir}
    # the venv must not see this project's packages: PYTHONPATH is dropped
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env["RUNTIME__DLTHUB_TELEMETRY"] = "false"
    try:
        done = subprocess.run(
            [str(venv / "bin" / "python"), "-W", "ignore", str(_PIPELINE), json.dumps(task)],
            capture_output=True,
            text=True,
            env=env,
            timeout=RUN_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return PeerRun(error=f"did not finish in {RUN_TIMEOUT_S} s")
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        return PeerRun(error=f"failed: {lines[-1][:160] if lines else f'exit code {done.returncode}'}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return PeerRun(result["count"], result["seconds"], result["peak_mib"])
