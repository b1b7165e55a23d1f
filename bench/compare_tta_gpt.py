"""compare_tta.py --part gpt: time to train a GPT on a text file to a target validation loss,
accelbench's `train --axis dataset=text:FILE --axis target_loss=X` side by side with the same model
and recipe in plain PyTorch.

The text: --text FILE, or (default) the Python standard library's own .py sources (sorted paths
under sysconfig's stdlib folder, site-packages left out) concatenated up to --text-bytes and
written to OUT/stdlib.txt: a file every machine with Python has, so the GPU machine (no internet)
needs nothing. Where the stdlib has no sources, /usr/share/common-licenses/* instead. Both sides
read the same file the same way (accelbench's datasets.cpp): each byte one token (vocabulary 256),
the first 90% of the bytes train, the last 10% (int(n * 0.1) bytes) are held out; the training
bytes are cut into (n - 1) // seq windows of seq + 1 bytes (inputs the first seq, targets the last
seq), each epoch a seeded permutation of them in batches (the remainder dropped); after every
epoch the mean cross-entropy in nats per token over every held-out window (the same windowing);
stop at the first evaluation at or below the target.

The model (accelbench's models/gpt.cpp, GPT-2 as Hugging Face and llm.c define it, with the
vocabulary set to 256): learned token and position embeddings, pre-norm blocks (LayerNorm eps
1e-5, fused qkv projection, causal attention, projection; LayerNorm, 4x MLP with GELU tanh,
projection), final LayerNorm, the head tied to the token embedding, no dropout; N(0, 0.02) for
weights and embeddings, the two projections into the residual stream N(0, 0.02 / sqrt(2 layers)),
zero biases. The recipe (accelbench's): AdamW betas (0.9, 0.95), eps 1e-8, decoupled weight decay
0.1 on the 2-D weights (embeddings included; not biases or LayerNorms), the gradient's global norm
clipped to 1, accelbench's schedule (linear warm-up over warmup_epochs, cosine to 1% of the peak at
schedule_epochs, piecewise constant over lr_updates_per_epoch segments an epoch).

PyTorch is given what is fastest for it: the tokens on the GPU, bf16 autocast, torch.compile,
fused AdamW, scaled_dot_product_attention (flash); compilation and a warm-up before its clock (the
weights and optimizer put back after). Both clocks run from the first epoch's start to the end of
the evaluation that reaches the target.
"""
import math
import os
import sysconfig
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from compare_common import accelbench

# accelbench's GPT configs (models/gpt.cpp): layers, heads, channels, positions.
GPT_CONFIGS = {
    "tiny_gpt2": (2, 1, 64, 64),
    "gpt2_124m": (12, 12, 768, 1024),
    "gpt2_350m": (24, 16, 1024, 1024),
}
VOCAB = 256  # byte tokens
HELD_OUT_SHARE = 0.1  # accelbench's kHeldOutShare


def add_arguments(ap):
    g = ap.add_argument_group("--part gpt")
    g.add_argument("--model", default="tiny_gpt2", choices=sorted(GPT_CONFIGS))
    g.add_argument("--seq", type=int, default=64)
    g.add_argument("--target-loss", type=float, default=1.0,
                   help="validation loss, nats per byte (2.0 is reached at the first evaluation: too easy to rank)")
    g.add_argument("--text", default="", help="a text file; default: the Python stdlib's sources")
    g.add_argument("--text-bytes", type=int, default=4_000_000, help="size of the generated text")


def write_default_text(out_dir, limit):
    """The stdlib's .py sources (else the common licenses) concatenated to `limit` bytes."""
    root = sysconfig.get_paths()["stdlib"]
    files = []
    for d, subdirs, names in os.walk(root):
        subdirs[:] = sorted(s for s in subdirs if s not in ("site-packages", "dist-packages", "__pycache__"))
        files += [os.path.join(d, n) for n in sorted(names) if n.endswith(".py")]
    source = f"the .py files under {root}"
    if not files:
        lic = "/usr/share/common-licenses"
        files = [os.path.join(lic, n) for n in sorted(os.listdir(lic))] if os.path.isdir(lic) else []
        source = f"the files in {lic}"
    if not files:
        raise SystemExit("no Python sources and no /usr/share/common-licenses: pass --text FILE")
    chunks, size = [], 0
    for f in sorted(files):
        with open(f, "rb") as fh:
            chunks.append(fh.read())
        size += len(chunks[-1])
        if size >= limit:
            break
    data = b"".join(chunks)[:limit]
    path = os.path.join(out_dir, "stdlib.txt" if "py files" in source else "licenses.txt")
    os.makedirs(out_dir, exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(data)
    return path, f"{len(data):,} bytes of {source}"


def splits(path):
    with open(path, "rb") as fh:
        data = fh.read()
    held = int(len(data) * HELD_OUT_SHARE)
    cut = len(data) - held
    return data[:cut], data[cut:]


class Block(nn.Module):
    def __init__(self, c, heads, proj_std):
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(c, eps=1e-5), nn.LayerNorm(c, eps=1e-5)
        self.c_attn, self.c_proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
        self.fc, self.proj = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)
        for lin, std in ((self.c_attn, 0.02), (self.c_proj, proj_std), (self.fc, 0.02), (self.proj, proj_std)):
            nn.init.normal_(lin.weight, 0.0, std)
            nn.init.zeros_(lin.bias)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(a.transpose(1, 2).reshape(b, t, c))
        return x + self.proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, layers, heads, channels, positions):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, channels), nn.Embedding(positions, channels)
        nn.init.normal_(self.wte.weight, 0.0, 0.02)
        nn.init.normal_(self.wpe.weight, 0.0, 0.02)
        proj_std = 0.02 / math.sqrt(2 * layers)
        self.blocks = nn.ModuleList(Block(channels, heads, proj_std) for _ in range(layers))
        self.ln_f = nn.LayerNorm(channels, eps=1e-5)

    def forward(self, tokens, targets, reduction="mean"):
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1], device=tokens.device))
        for blk in self.blocks:
            x = blk(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # the tied head
        return F.cross_entropy(logits.float().view(-1, VOCAB), targets.reshape(-1), reduction=reduction)


def windows(data, seq, dev):
    """Inputs and targets [W, seq] of the (len - 1) // seq windows of seq + 1 tokens (accelbench's TokenWindows)."""
    t = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(dev).long()
    w = (t.numel() - 1) // seq
    idx = torch.arange(w, device=dev)[:, None] * seq + torch.arange(seq, device=dev)[None, :]
    return t[idx], t[idx + 1]


def evaluate(model, ex, ey, batch):
    model.eval()
    total = torch.zeros((), device=ex.device)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        for i in range(0, ex.shape[0], batch):
            total += model(ex[i:i + batch], ey[i:i + batch], reduction="sum")
    model.train()
    return total.item() / ey.numel()


def torch_time_to_train(a, seed, text_path):
    from compare_tta import scheduled_lr  # noqa: E402 (the image part's schedule, shared)
    torch.manual_seed(seed)
    dev = "cuda"
    train, held = splits(text_path)
    tx, ty = windows(train, a.seq, dev)
    ex, ey = windows(held, a.seq, dev)
    layers, heads, channels, positions = GPT_CONFIGS[a.model]
    model = Gpt(layers, heads, channels, positions).to(dev)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]
    try:
        opt = torch.optim.AdamW(groups, lr=a.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    except (TypeError, RuntimeError):
        opt = torch.optim.AdamW(groups, lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    compiled = torch.compile(model)
    steps_per_epoch = tx.shape[0] // a.batch
    gen = torch.Generator(device=dev)

    def step(x, y, lr):
        for g in opt.param_groups:
            g["lr"] = lr
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = compiled(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    # Init: compile (train and eval) and warm up, then restore the initial state.
    state = {k: v.clone() for k, v in model.state_dict().items()}
    for _ in range(3):
        step(tx[:a.batch], ty[:a.batch], 0.0)
    evaluate(compiled, ex, ey, a.batch)
    model.load_state_dict(state)
    opt.state.clear()
    gen.manual_seed(seed)
    torch.cuda.synchronize()

    start = time.perf_counter()
    curve, total_step = [], 0
    for epoch in range(1, a.max_epochs + 1):
        order = torch.randperm(tx.shape[0], device=dev, generator=gen)
        for i in range(steps_per_epoch):
            idx = order[i * a.batch:(i + 1) * a.batch]
            loss = step(tx[idx], ty[idx], scheduled_lr(a.lr, total_step, steps_per_epoch, a))
            total_step += 1
        val = evaluate(compiled, ex, ey, a.batch)
        curve.append((epoch, val, loss.item(), time.perf_counter() - start))
        if not math.isfinite(val):
            break
        if val <= a.target_loss:
            return {"time_s": time.perf_counter() - start, "epochs": epoch, "loss": val, "curve": curve}
    return {"time_s": None, "epochs": len(curve), "loss": min(c[1] for c in curve), "curve": curve}


def accelbench_time_to_train(a, seeds, text_path):
    args = ["train", "--axis", f"model={a.model}", "--axis", f"dataset=text:{text_path}",
            "--axis", f"target_loss={a.target_loss}", "--axis", f"batch={a.batch}", "--axis", f"seq={a.seq}",
            "--axis", "precision=bf16", "--axis", "seed=" + ",".join(str(s) for s in seeds),
            "--option", f"max_epochs={a.max_epochs}", "--option", f"lr={a.lr}",
            "--option", f"warmup_epochs={a.warmup_epochs}", "--option", f"schedule_epochs={a.schedule_epochs}",
            "--option", f"lr_updates_per_epoch={a.lr_updates_per_epoch}"]
    out = {}
    for r in accelbench(a.accelbench, args, a.out):
        t = r.get("metrics", {}).get("time_to_train", {})
        seed = int(r["params"]["seed"]) if "seed" in r.get("params", {}) else t.get("seed")
        out[seed] = {"status": r["status"], "time_s": t.get("time_to_train_s"), "epochs": t.get("epochs"),
                     "loss": t.get("final_loss"), "init_s": t.get("init_s"),
                     "curve": [(c["epoch"], c["loss"], c["time_s"]) for c in t.get("curve", [])],
                     "energy_j": r.get("telemetry", {}).get("energy_j"), "reason": r.get("reason", ""),
                     "olympic": r.get("metrics", {}).get("time_to_train_olympic")}
    return out


def run(a, seeds):
    from compare_tta import fmt  # noqa: E402
    a.batch = 64 if a.batch is None else a.batch
    a.lr = 1e-3 if a.lr is None else a.lr
    a.warmup_epochs = 0.2 if a.warmup_epochs is None else a.warmup_epochs
    a.schedule_epochs = 5.0 if a.schedule_epochs is None else a.schedule_epochs
    if a.text:
        text_path, what = a.text, f"{os.path.getsize(a.text):,} bytes of {a.text}"
    else:
        text_path, what = write_default_text(a.out, a.text_bytes)
    text_path = os.path.abspath(text_path)
    print(f"time to train {a.model} (batch {a.batch}, seq {a.seq}, bf16, AdamW peak {a.lr}) on {what} "
          f"to a validation loss of {a.target_loss} nats/byte", flush=True)
    try:
        ab = accelbench_time_to_train(a, seeds, text_path)
    except SystemExit as e:  # accelbench exits 1 when no seed reached the target: PyTorch still runs
        print(f"accelbench: {e}", flush=True)
        ab = {}
    rows = []
    for seed in seeds:
        t = torch_time_to_train(a, seed, text_path)
        mine = ab.get(seed, {})
        rows.append((mine.get("time_s"), t["time_s"]))
        print(f"seed {seed}: accelbench {mine.get('status', '?')} {fmt(mine.get('time_s'), '.2f')} s "
              f"({mine.get('epochs')} epochs, loss {fmt(mine.get('loss'), '.4f')}, "
              f"init {fmt(mine.get('init_s'), '.1f')} s, {fmt(mine.get('energy_j'), '.0f')} J) | "
              f"PyTorch {fmt(t['time_s'], '.2f')} s ({t['epochs']} epochs, loss {t['loss']:.4f})", flush=True)
        if mine.get("reason"):
            print(f"  accelbench: {mine['reason']}", flush=True)
        print("  accelbench curve: " + ", ".join(f"e{e} {v:.4f} ({s:.1f} s)" for e, v, s in mine.get("curve", [])),
              flush=True)
        print("  PyTorch curve: " + ", ".join(f"e{e} {v:.4f} ({s:.1f} s)" for e, v, _, s in t["curve"]), flush=True)
    done = [(x, y) for x, y in rows if x is not None and y is not None]
    if done:
        ab_mean, pt_mean = sum(x for x, _ in done) / len(done), sum(y for _, y in done) / len(done)
        print(f"mean over {len(done)} seeds both converged: accelbench {ab_mean:.2f} s, PyTorch {pt_mean:.2f} s, "
              f"PyTorch / accelbench {pt_mean / ab_mean:.2f}x", flush=True)
    last = ab.get(seeds[-1], {}).get("olympic")
    if last:
        print(f"accelbench olympic mean over {last['runs']} seeds: {fmt(last.get('olympic_mean_s'), '.2f')} s",
              flush=True)
