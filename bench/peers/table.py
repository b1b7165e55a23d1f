#!/usr/bin/env python3
"""The tables of bench/gpt2.sh and bench/bert.sh: accelbench's records beside the peers' lines
(bench/peers/lines.py), matched by workload, model, precision, batch and sequence, with the ratio
accelbench / peer (above 1: accelbench is faster). Standard library only.
  table.py llmc LOG --batch 16 --seq 1024 --warmup-steps 10
      llm.c's peer-result line from its log (the mean step time after the warm-up steps)
  table.py compare --title TITLE --peers FILE... --accelbench DIR [--accelbench-log [BENCH=]FILE]...
                   [--md FILE] [--json FILE]
      the table of every peer-result line in FILEs against the records under DIR/runs/*/points.jsonl
      (what `accelbench run ... --out DIR` wrote); a peer or accelbench that failed gets its row
      with the reason, so the table is made whatever ran.
Training rows compare tokens/s (batch x sequence over the median step, accelbench's time.median_s
per step); inference rows sequences/s (batch over the p50 latency: accelbench's infer samples one
forward each, so its time.median_s is the p50) and the p50 latency itself. An inference row whose
head differs from accelbench's (a peer's --head mlm against accelbench's question answering,
metrics.model.head) gets no ratio: the two did not compute the same thing."""
import argparse
import glob
import json
import os
import sys

from lines import parse_llmc, read_lines, result_line

KEY_FIELDS = ("bench", "model", "precision", "batch", "seq")


def key_of(fields):
    return tuple(fields.get(k) for k in KEY_FIELDS)


def read_records(directory):
    """accelbench's records under DIR/runs/*/points.jsonl, oldest run first; a line that does not
    parse (a run killed while writing it) is left out."""
    records = []
    for path in sorted(glob.glob(os.path.join(directory, "runs", "*", "points.jsonl")), key=os.path.getmtime):
        with open(path, errors="replace") as f:
            for line in f:
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    return records


def accelbench_row(rec):
    """A record as a row like the peers': its key, and its figures where it measured."""
    params, t = rec.get("params", {}), rec.get("time") or {}
    row = {"peer": "accelbench", "bench": rec.get("workload"), "model": params.get("model"),
           "precision": params.get("precision"), "batch": params.get("batch"),
           "seq": params.get("seq", params.get("seq_len")),
           "mode": "accelbench", "status": rec.get("status")}
    median_s = t.get("median_s")
    if rec.get("status") != "ok" or not median_s:
        row["error"] = f"{rec.get('status')}: {rec.get('reason') or 'no median time'}"
        return row
    batch, seq = row["batch"] or 0, row["seq"] or 0
    if row["bench"] == "train":
        row.update(tokens_per_s=batch * seq / median_s, step_ms=median_s * 1e3)
    else:
        row.update(seqs_per_s=batch / median_s, tokens_per_s=batch * seq / median_s, p50_ms=median_s * 1e3,
                   p99_ms=(t.get("p99_s") or float("nan")) * 1e3)
    metrics = rec.get("metrics") or {}
    head = (metrics.get("model") or {}).get("head") if isinstance(metrics.get("model"), dict) else None
    if head:
        row["head"] = head
    # The allocator's peak (train and infer write metrics.device_bytes_peak); else any *peak*_bytes.
    peak = [metrics["device_bytes_peak"]] if "device_bytes_peak" in metrics else [
        v for k, v in metrics.items() if "peak" in k and k.endswith("_bytes")]
    if peak and isinstance(peak[0], (int, float)):
        row["peak_mem_gib"] = peak[0] / 2**30
    return row


def last_line(path):
    try:
        with open(path, errors="replace") as f:
            lines = [line.strip() for line in f if line.strip()]
    except FileNotFoundError:
        return f"no log {path}"
    return lines[-1][:300] if lines else f"{path} is empty"


def log_of(logs, bench):
    """The accelbench log for rows of this bench among --accelbench-log's BENCH=FILE (or FILE: any)."""
    for entry in logs:
        name, sep, path = entry.partition("=")
        if not sep or name == bench:
            return path if sep else entry
    return None


def build_rows(peers, peer_errors, records, accelbench_logs):
    """Rows grouped by key in the peers' order: accelbench's first, then each peer's with its ratio."""
    ours = {}
    for rec in records:
        row = accelbench_row(rec)
        ours[key_of(row)] = row  # a later run of the same point replaces an earlier one
    keys = list(dict.fromkeys(key_of(r) for r in peers + peer_errors if r.get("bench")))
    keys += [k for k in ours if k not in keys]
    rows = []
    for key in keys:
        mine = ours.get(key)
        if mine is None:
            log = log_of(accelbench_logs, key[0])
            why = "no record" + (f" (accelbench's log ends: {last_line(log)})" if log else "")
            mine = {**dict(zip(KEY_FIELDS, key)), "peer": "accelbench", "mode": "accelbench", "error": why}
        rows.append(mine)
        for peer in (p for p in peers + peer_errors if key_of(p) == key):
            row = dict(peer)
            figure = "tokens_per_s" if key[0] == "train" else "seqs_per_s"
            if mine.get("head") and row.get("head") and mine["head"] != row["head"]:
                row["not_compared"] = f"heads differ: accelbench {mine['head']}, this {row['head']}"
            elif "error" not in mine and "error" not in row and row.get(figure):
                row["accelbench_ratio"] = mine[figure] / row[figure]
                if key[0] == "infer" and row.get("p50_ms"):
                    row["accelbench_latency_ratio"] = row["p50_ms"] / mine["p50_ms"]
            rows.append(row)
    unkeyed = [e for e in peer_errors if not e.get("bench")]
    return rows, unkeyed


def fmt(value, digits=0):
    if value is None or value != value:
        return "n/a"
    return f"{value:,.{digits}f}"


def ratio(row, name):
    """A ratio's cell: blank on accelbench's own row, n/a where either side has no figure (and why,
    where the two are not compared)."""
    if row["peer"] == "accelbench":
        return ""
    return f"n/a ({row['not_compared']})" if "not_compared" in row else fmt(row.get(name), 3)


def markdown(title, rows):
    train = [r for r in rows if r.get("bench") == "train"]
    infer = [r for r in rows if r.get("bench") == "infer"]
    lines = [title, ""]
    if train:
        lines += ["| what | who | tokens/s | step ms | peak GiB | accelbench / this |",
                  "|---|---|---:|---:|---:|---:|"]
        for r in train:
            what = f"train {r['model']} {r['precision']} b{r['batch']} x {r['seq']}"
            who = r["peer"] if r["peer"] in ("accelbench", "llm.c") else f"{r['peer']} {r['mode']}"
            if "error" in r:
                lines.append(f"| {what} | {who} | failed: {r['error'][:200]} | | | |")
                continue
            lines.append(f"| {what} | {who} | {fmt(r['tokens_per_s'])} | {fmt(r.get('step_ms'), 2)} | "
                         f"{fmt(r.get('peak_mem_gib'), 1)} | {ratio(r, 'accelbench_ratio')} |")
        lines.append("")
    if infer:
        lines += ["| what | who | sequences/s | p50 ms | p99 ms | accelbench / this (seq/s) "
                  "| this p50 / accelbench p50 |", "|---|---|---:|---:|---:|---:|---:|"]
        for r in infer:
            what = f"infer {r['model']} {r['precision']} b{r['batch']} x {r['seq']}"
            who = "accelbench" if r["peer"] == "accelbench" else f"{r['peer']} {r['mode']}"
            if "error" in r:
                lines.append(f"| {what} | {who} | failed: {r['error'][:200]} | | | | |")
                continue
            lines.append(f"| {what} | {who} | {fmt(r['seqs_per_s'], 1)} | {fmt(r['p50_ms'], 3)} | "
                         f"{fmt(r.get('p99_ms'), 3)} | {ratio(r, 'accelbench_ratio')} | "
                         f"{ratio(r, 'accelbench_latency_ratio')} |")
        lines.append("")
    return "\n".join(lines)


def compare(args):
    peers, peer_errors = read_lines(args.peers)
    records = read_records(args.accelbench) if os.path.isdir(args.accelbench) else []
    rows, unkeyed = build_rows(peers, peer_errors, records, args.accelbench_log)
    text = markdown(args.title, rows)
    if unkeyed:
        text += "\n" + "\n".join(f"- {e.get('source', '?')}: {e['error']}" for e in unkeyed) + "\n"
    if not rows:
        text += "\nnothing was measured: no peer-result line and no accelbench record\n"
    print(text, flush=True)
    if args.md:
        with open(args.md, "w") as f:
            f.write(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"title": args.title, "rows": rows, "errors": unkeyed}, f, indent=1)
    return 0 if rows else 1


def llmc(args):
    with open(args.log, errors="replace") as f:
        text = f.read()
    try:
        print(result_line(parse_llmc(text, args.batch, args.seq, args.warmup_steps)), flush=True)
    except ValueError as e:
        print(f"llm.c: {e}", file=sys.stderr)
        return 1
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("llmc", help="llm.c's peer-result line from its log")
    p.add_argument("log")
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--seq", type=int, required=True)
    p.add_argument("--warmup-steps", type=int, default=10)
    p = sub.add_parser("compare", help="accelbench's records beside the peers' lines")
    p.add_argument("--title", required=True)
    p.add_argument("--peers", nargs="*", default=[], help="logs holding peer-result / peer-error lines")
    p.add_argument("--accelbench", required=True, help="the --out folder accelbench run wrote")
    p.add_argument("--accelbench-log", action="append", default=[], metavar="[BENCH=]FILE",
                   help="its output, quoted where it left no record (BENCH=FILE: for train or infer rows only)")
    p.add_argument("--md")
    p.add_argument("--json")
    args = ap.parse_args(argv)
    return llmc(args) if args.command == "llmc" else compare(args)


if __name__ == "__main__":
    raise SystemExit(main())
