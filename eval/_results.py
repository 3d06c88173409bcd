"""Write a benchmark's results as eval/results/<bench>.json + a short Markdown table beside it."""
import datetime
import json
import os
import subprocess
from pathlib import Path


def current_commit():
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return os.environ.get("HYBRIDSPEC_COMMIT", "unknown")


def _markdown(bench, rows, summary):
    lines = [f"# {bench}", ""]
    if summary:
        lines += ["| summary | value |", "|---|---|"] + [f"| {k} | {v} |" for k, v in summary.items()] + [""]
    if rows:
        keys = list(rows[0])
        lines += ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
        lines += ["| " + " | ".join(str(r.get(k, "")) for k in keys) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write_results(bench, rows, summary, command, device, out_dir="eval/results", extra=None, markdown=None):
    """Writes <out_dir>/<bench>.json (keys bench, device, commit, date, command, rows, summary, + extra) and
    <out_dir>/<bench>.md (a table of summary and rows, or `markdown` if given). Returns the JSON path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = {
        "bench": bench,
        "device": device,
        "commit": current_commit() if "HYBRIDSPEC_COMMIT" not in os.environ else os.environ["HYBRIDSPEC_COMMIT"],
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "rows": rows,
        "summary": summary,
    }
    doc.update(extra or {})
    path = out_dir / f"{bench}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    (out_dir / f"{bench}.md").write_text(markdown if markdown is not None else _markdown(bench, rows, summary))
    return path
