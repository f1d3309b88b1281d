"""`flotilla-bench llamacpp`'s report, from its batches: medians over rounds, ratios to llama-server, the issue's
targets met or not, a Markdown table, and the CPU it ran on (pure, but for `cpu_info` reading `lscpu`)."""

from __future__ import annotations

import os
import statistics
import subprocess

PEER = "llama-server"
ARMS = ("flotilla", "flotilla-float32", PEER)


def median_table(runs: list[dict]) -> dict[str, dict[str, dict[str, float]]]:
    """{isa: {server: {clients: median tokens/s over the rounds}}}, clients as strings (JSON keys)."""
    grouped: dict[tuple[str, str, int], list[float]] = {}
    for r in runs:
        grouped.setdefault((r["isa"], r["server"], r["clients"]), []).append(r["tokens_per_s"])
    out: dict[str, dict[str, dict[str, float]]] = {}
    for (isa, server, clients), values in grouped.items():
        out.setdefault(isa, {}).setdefault(server, {})[str(clients)] = statistics.median(values)
    return out


def ratio_table(medians: dict) -> dict[str, dict[str, dict[str, float]]]:
    """{isa: {clients: {"A/B": ratio}}}: each Flotilla arm over llama-server, and gguf over float32."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for isa, by in medians.items():
        for clients, peer in by.get(PEER, {}).items():
            row = {f"{arm}/{PEER}": by[arm][clients] / peer for arm in ARMS[:-1]
                   if clients in by.get(arm, {})}
            if "flotilla-float32" in by and clients in by["flotilla-float32"] and "flotilla" in by:
                row["flotilla/flotilla-float32"] = by["flotilla"][clients] / by["flotilla-float32"][clients]
            out.setdefault(isa, {})[clients] = row
    return out


def targets(ratios: dict) -> list[dict]:
    """The issue's bars: Flotilla (gguf) >= 1.0x llama-server at every client count, and at more than one client
    no lower than Flotilla's own float32 figure."""
    out = []
    for isa, by in ratios.items():
        for clients, row in by.items():
            keys = [f"flotilla/{PEER}"] + (["flotilla/flotilla-float32"] if int(clients) > 1 else [])
            out += [{"isa": isa, "clients": int(clients), "ratio": k, "value": row[k], "met": row[k] >= 1.0}
                    for k in keys if k in row]
    return out


def markdown_table(medians: dict, ratios: dict) -> str:
    lines = ["| ISA | clients | Flotilla gguf | Flotilla float32 | llama-server | gguf / llama-server | "
             "float32 / llama-server |", "|---|---:|---:|---:|---:|---:|---:|"]
    for isa, by in medians.items():
        for clients in sorted(by.get(PEER, {}), key=int):
            def cell(arm: str, by=by, clients=clients) -> str:
                return f"{by[arm][clients]:,.1f}" if clients in by.get(arm, {}) else "–"

            def ratio(key: str, isa=isa, clients=clients) -> str:
                value = ratios.get(isa, {}).get(clients, {}).get(key)
                return "–" if value is None else f"{value:.2f}x"
            lines.append(f"| {isa} | {clients} | {cell('flotilla')} | {cell('flotilla-float32')} | {cell(PEER)} | "
                         f"{ratio('flotilla/' + PEER)} | {ratio('flotilla-float32/' + PEER)} |")
    return "\n".join(lines)


def parse_lscpu(text: str) -> dict:
    fields = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in text.splitlines()) if v}
    flags = set(fields.get("Flags", "").split())
    return {"model_name": fields.get("Model name"), "family": fields.get("CPU family"), "model": fields.get("Model"),
            "avx512f": "avx512f" in flags, "avx512_vnni": "avx512_vnni" in flags,
            "amx": any(f.startswith("amx") for f in flags), "avx2": "avx2" in flags}


def cpu_info() -> dict:
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"}).stdout
    except OSError:
        text = ""
    return {**parse_lscpu(text), "cpus": os.cpu_count()}
