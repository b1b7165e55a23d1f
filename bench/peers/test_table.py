"""The peers' tables without a GPU: llm.c's log read as run.sh leaves it, peer lines read back,
records matched and ratios computed. Standard library only:
  python3 -m unittest discover -s bench/peers -p 'test_*.py'"""
import contextlib
import io
import json
import math
import os
import subprocess
import sys
import tempfile
import unittest

from lines import error_line, parse_llmc, read_lines, result_line
from table import main as table_main

HERE = os.path.dirname(os.path.abspath(__file__))


def llmc_log(step_ms, losses=None):
    """What .anchors/llmc/run.sh prints: num_parameters, then one line per step in train_gpt2.cu's format."""
    lines = ["num_parameters: 124475904 => bytes: 248951808"]
    losses = losses or [11.0 - 0.01 * i for i in range(1, len(step_ms) + 1)]
    for i, (ms, loss) in enumerate(zip(step_ms, losses), 1):
        fmt = "step %4d/%d | loss %7.6f (%+.2fz)| norm %6.4f (%+.2fz)| lr %.2e | %.2f ms | %.1f%% bf16 MFU | %.0f tok/s"
        lines.append(fmt % (i, len(step_ms), loss, 0.1, 1.5, -0.2, 6e-4, ms, 45.0 + i / 10, 16384 / ms * 1e3))
    return "\n".join(lines) + "\n"


class LlmcLog(unittest.TestCase):
    def test_mean_after_warmup(self):
        times = [900.0, 60.0] + [30.0, 40.0] * 5  # the first two steps are warm-up
        got = parse_llmc(llmc_log(times), batch=16, seq=1024, warmup_steps=2)
        self.assertEqual(got["steps_timed"], 10)
        self.assertAlmostEqual(got["step_ms"], 35.0)
        self.assertAlmostEqual(got["tokens_per_s"], 16 * 1024 / 35.0 * 1e3)
        self.assertEqual(got["num_parameters"], 124475904)
        self.assertTrue(got["loss_finite"])
        self.assertAlmostEqual(got["loss_last"], 11.0 - 0.12)
        self.assertAlmostEqual(got["llmc_ema_tokens_per_s_last"], round(16384 / 40.0 * 1e3))

    def test_nan_loss_flagged(self):
        log = llmc_log([30.0] * 4, losses=[11.0, 10.9, float("nan"), 10.8])
        self.assertIn("loss     nan (", log)  # printf's %7.6f of a NaN
        self.assertFalse(parse_llmc(log, 16, 1024, 1)["loss_finite"])
        self.assertFalse(parse_llmc(log.replace(" nan", "-nan"), 16, 1024, 1)["loss_finite"])

    def test_no_steps_says_so(self):
        with self.assertRaisesRegex(ValueError, "no llm.c step lines.*make: \\*\\*\\* Error 1"):
            parse_llmc("nvcc fatal\nmake: *** Error 1\n", 16, 1024, 10)

    def test_too_few_steps(self):
        with self.assertRaisesRegex(ValueError, "printed 3 step lines, none after the 10"):
            parse_llmc(llmc_log([30.0] * 3), 16, 1024, 10)


def record(workload, model, batch, seq, median_s, status="ok", p99_s=None, reason=None):
    rec = {"workload": workload, "status": status, "params": {"model": model, "precision": "bf16", "batch": batch,
                                                                "seq": seq}}
    if status == "ok":
        rec["time"] = {"median_s": median_s, "p99_s": p99_s or median_s * 1.1}
        rec["metrics"] = {"device_bytes_peak": 30 * 2**30}  # what train and infer record
        if workload == "infer":
            rec["metrics"]["model"] = {"name": model, "head": "qa"}
    else:
        rec["reason"] = reason
    return rec


class Compare(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()

    def write(self, name, text):
        path = os.path.join(self.dir, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
        return path

    def run_table(self, peers, extra=()):
        out = os.path.join(self.dir, "t.json")
        md = os.path.join(self.dir, "t.md")
        with contextlib.redirect_stdout(io.StringIO()) as printed:
            code = table_main(["compare", "--title", "T", "--peers", *peers, "--accelbench",
                               os.path.join(self.dir, "ab"), "--json", out, "--md", md, *extra])
        with open(out) as f, open(md) as g:
            text = g.read()
            self.assertEqual(printed.getvalue().strip(), text.strip())
            return code, json.load(f)["rows"], text

    def test_train_ratios_against_every_peer(self):
        key = {"bench": "train", "model": "gpt2_124m", "precision": "bf16", "batch": 16, "seq": 1024}
        eager = self.write("eager.log", "noise\n" + result_line({**key, "peer": "pytorch", "mode": "eager",
                                                                  "tokens_per_s": 150e3, "step_ms": 109.2}) + "\n")
        compiled = self.write("compile.log", error_line({**key, "peer": "pytorch", "mode": "compile",
                                                         "error": "RuntimeError: boom"}) + "\n")
        llmc = self.write("llmc-result.txt", result_line(parse_llmc(llmc_log([31.0] * 12), 16, 1024, 2)) + "\n")
        self.write("ab/runs/r1/points.jsonl", json.dumps(record("train", "gpt2_124m", 16, 1024, 0.0300)) + "\n"
                   + '{"workload": "train", "status": "o')  # cut off by a time limit
        code, rows, md = self.run_table([llmc, eager, compiled, os.path.join(self.dir, "missing.log")])
        self.assertEqual(code, 0)
        self.assertEqual([r["peer"] for r in rows], ["accelbench", "llm.c", "pytorch", "pytorch"])
        ours = 16 * 1024 / 0.03
        self.assertAlmostEqual(rows[0]["tokens_per_s"], ours)
        self.assertAlmostEqual(rows[0]["peak_mem_gib"], 30.0)
        self.assertAlmostEqual(rows[1]["accelbench_ratio"], ours / (16 * 1024 / 31.0 * 1e3))
        self.assertAlmostEqual(rows[2]["accelbench_ratio"], ours / 150e3)
        self.assertNotIn("accelbench_ratio", rows[3])
        self.assertIn("failed: RuntimeError: boom", md)
        self.assertIn(f"| {ours / 150e3:,.3f} |", md)

    def test_accelbench_failure_keeps_the_peers(self):
        key = {"bench": "infer", "model": "bert_large", "precision": "bf16", "batch": 1, "seq": 384}
        peer = self.write("infer.log", result_line({**key, "peer": "pytorch", "mode": "cudagraph", "seqs_per_s": 400.0,
                                                    "p50_ms": 2.5, "p99_ms": 2.7}) + "\n")
        log = self.write("accelbench.log", "error: unknown model 'bert_large' (models: resnet50, ...)\n")
        other = self.write("accelbench-train.log", "train ran\n")
        code, rows, md = self.run_table([peer], ["--accelbench-log", f"train={other}",
                                                 "--accelbench-log", f"infer={log}"])
        self.assertEqual(code, 0)
        self.assertIn("unknown model 'bert_large'", rows[0]["error"])
        self.assertNotIn("accelbench_ratio", rows[1])
        self.assertIn("| infer bert_large bf16 b1 x 384 | pytorch cudagraph | 400.0 | 2.500 | 2.700 | n/a | n/a |", md)

    def test_infer_latency_ratio_and_failed_point(self):
        key = {"bench": "infer", "model": "bert_large", "precision": "bf16", "seq": 384}
        peer = self.write("infer.log", "\n".join(
            result_line({**key, "batch": b, "peer": "pytorch", "mode": "compile", "seqs_per_s": s,
                         "p50_ms": b / s * 1e3, "p99_ms": 1.1 * b / s * 1e3}) for b, s in ((1, 400.0), (256, 2000.0)))
            + "\n")
        self.write("ab/runs/r1/points.jsonl", "\n".join(json.dumps(r) for r in (
            record("infer", "bert_large", 1, 384, 0.002), record("infer", "bert_large", 256, 384, None, status="oom",
                                                                 reason="out of memory"))) + "\n")
        _, rows, md = self.run_table([peer])
        self.assertAlmostEqual(rows[1]["accelbench_ratio"], 500.0 / 400.0)
        self.assertAlmostEqual(rows[1]["accelbench_latency_ratio"], 2.5 / 2.0)
        self.assertEqual(rows[2]["error"], "oom: out of memory")
        self.assertNotIn("accelbench_ratio", rows[3])

    def test_infer_reads_accelbench_records_as_written(self):
        """An infer record's shape as accelbench writes it: sequences/s = batch / time.median_s
        (one forward per sample: the p50), p99 from time.p99_s, peak memory from
        metrics.device_bytes_peak; a peer of another head gets no ratio."""
        key = {"bench": "infer", "model": "bert_large", "precision": "bf16", "batch": 256, "seq": 384}
        peer = self.write("infer.log", "\n".join(
            result_line({**key, "peer": "pytorch", "mode": m, "head": h, "seqs_per_s": 1000.0, "p50_ms": 256.0,
                         "p99_ms": 260.0}) for m, h in (("cudagraph", "qa"), ("eager", "mlm"))) + "\n")
        rec = {"workload": "infer", "status": "ok",
               "params": {**{k: key[k] for k in ("model", "precision", "batch", "seq")}, "fold": "auto"},
               "counts": {"samples": 256, "tokens": 256 * 384},
               "time": {"median_s": 0.2, "p99_s": 0.21, "p90_s": 0.205},
               "rates": {"samples_per_s": 1280.0, "tokens_per_s": 1280.0 * 384},
               "metrics": {"model": {"name": "bert_large", "parameters": 334092290, "ops": 171, "head": "qa"},
                           "latency_s": {"p50": 0.2, "p99": 0.21}, "device_bytes_peak": 3 * 2**30,
                           "memory_plan": {"arena_bytes": 2**30}}}
        self.write("ab/runs/r1/points.jsonl", json.dumps(rec) + "\n")
        _, rows, md = self.run_table([peer])
        self.assertEqual([r["peer"] for r in rows], ["accelbench", "pytorch", "pytorch"])
        self.assertAlmostEqual(rows[0]["seqs_per_s"], 1280.0)
        self.assertAlmostEqual(rows[0]["p50_ms"], 200.0)
        self.assertAlmostEqual(rows[0]["p99_ms"], 210.0)
        self.assertAlmostEqual(rows[0]["peak_mem_gib"], 3.0)
        self.assertEqual(rows[0]["head"], "qa")
        self.assertAlmostEqual(rows[1]["accelbench_ratio"], 1.28)
        self.assertAlmostEqual(rows[1]["accelbench_latency_ratio"], 256.0 / 200.0)
        self.assertNotIn("accelbench_ratio", rows[2])
        self.assertIn("heads differ: accelbench qa, this mlm", rows[2]["not_compared"])
        self.assertIn("| 1.280 | 1.280 |", md)
        self.assertIn("n/a (heads differ: accelbench qa, this mlm)", md)

    def test_nothing_measured_fails(self):
        code, rows, md = self.run_table([os.path.join(self.dir, "none.log")])
        self.assertEqual((code, rows), (1, []))
        self.assertIn("nothing was measured", md)

    def test_unreadable_line_is_reported(self):
        path = self.write("bad.log", "peer-result {not json\n")
        results, errors = read_lines([path])
        self.assertEqual(results, [])
        self.assertIn("bad.log:1", errors[0]["source"])


class Cli(unittest.TestCase):
    def run_script(self, *args):
        return subprocess.run([sys.executable, os.path.join(HERE, args[0]), *args[1:]], capture_output=True, text=True)

    def test_llmc_subcommand(self):
        with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as f:
            f.write(llmc_log([33.0] * 12))
        got = self.run_script("table.py", "llmc", f.name, "--batch", "16", "--seq", "1024", "--warmup-steps", "2")
        self.assertEqual(got.returncode, 0, got.stderr)
        line = got.stdout.strip()
        self.assertTrue(line.startswith("peer-result "))
        self.assertTrue(math.isclose(json.loads(line.split(" ", 1)[1])["tokens_per_s"], 16384 / 0.033))
        os.unlink(f.name)

    def test_peers_parse_arguments_without_torch(self):
        for script in ("gpt2_train.py", "bert_train.py", "bert_infer.py"):
            got = self.run_script(script, "--help")
            self.assertEqual(got.returncode, 0, got.stderr)
            self.assertIn("--precision", got.stdout)
        bad = self.run_script("bert_infer.py", "--batch", "1,x")
        self.assertEqual(bad.returncode, 2)
        self.assertIn("not a comma-separated list", bad.stderr)
        bad = self.run_script("bert_train.py", "--seq", "1024")
        self.assertIn("exceeds BERT's 512 positions", bad.stderr)


if __name__ == "__main__":
    unittest.main()
