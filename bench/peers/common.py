"""What the PyTorch peers share: Hugging Face models built from their configurations with sdpa
attention, the precisions, AdamW as GPT-2 and BERT are trained, one training step's timing, and
the loop over cases that prints one peer-result line per case (lines.py). Imported after the
arguments are parsed (options.py), so --help works where PyTorch is absent. Timing is
bench/compare_common.py's (CUDA events around batches of back-to-back steps, the median per step)
and compare_resnet.py's (one call per latency sample)."""
import gc
import math
import os
import sys
import traceback

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the GPU machine has no network: models come from configurations
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

try:
    import torch
    import transformers
except ImportError as e:
    raise SystemExit(f"the PyTorch peers need torch and transformers (Hugging Face): {e}")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from compare_common import time_batches  # noqa: E402  (bench/)
from compare_resnet import time_singles  # noqa: E402

from lines import error_line, result_line  # noqa: E402


def setup_precision(precision):
    """The autocast dtype of a training precision (None: fp32 math), TF32 allowed for tf32 only."""
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)


def sdpa_model(model_class, config):
    """model_class built from config on the GPU (random initialisation, nothing downloaded) with
    PyTorch's scaled_dot_product_attention; refuses to go on with any other attention."""
    torch.manual_seed(0)
    with torch.device("cuda"):
        try:
            model = model_class._from_config(config, attn_implementation="sdpa")
        except (AttributeError, TypeError):  # a transformers without _from_config's keyword
            config._attn_implementation = "sdpa"
            model = model_class(config)
    got = getattr(model.config, "_attn_implementation", None)
    if got != "sdpa":
        raise RuntimeError(f"{model_class.__name__} was built with attention '{got}', not 'sdpa'")
    return model.cuda()


def compile_blocks(blocks, mode, dynamic=None):
    """torch.compile each of a model's repeated blocks in place (regional compilation), the model's
    own forward left eager. Why a peer needs it beside whole-model compilation: transformers' mask
    helpers skip the attention mask (sdpa's is_causal, or none, and so flash attention) only when
    not tracing; under a whole-model compile they may build a full [B, 1, T, T] mask, and sdpa then
    runs a masked kernel that is slower. The blocks share their code, so one compilation serves all
    of them; the cache limit is raised in case guards tell them apart."""
    limit, config = 8 * len(blocks), torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(config, name):  # renamed across PyTorch versions (the old names stay as aliases)
            setattr(config, name, max(getattr(config, name), limit))
    for block in blocks:
        block.compile(mode=mode, dynamic=dynamic)


def submodule(model, path):
    """model's submodule at a dotted path, or an error naming what this transformers lacks."""
    module = model
    for name in path.split("."):
        if not hasattr(module, name):
            raise RuntimeError(f"{type(model).__name__} has no '{path}' (transformers {transformers.__version__})")
        module = getattr(module, name)
    return module


def adamw(model, lr, weight_decay):
    """Fused AdamW, betas (0.9, 0.95), weight decay on the matrices (embeddings included) only, as
    llm.c and nanoGPT train GPT-2; tied weights counted once (named_parameters deduplicates)."""
    params = [p for _, p in model.named_parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8, fused=True)


def environment():
    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "transformers": transformers.__version__}


def require_gpu():
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU visible to PyTorch: the peers run on the GPU machine")


def time_train(model, loss_fn, args, batch_inputs):
    """Median seconds per training step (forward + loss, backward, clipping by the global norm,
    fused AdamW; fp16 with dynamic loss scaling) and the last loss; loss_fn(*batch_inputs) returns
    the loss, compiled or not. Nothing in the step waits for the host, so steps run back to back."""
    opt = adamw(model, args.lr, args.weight_decay)
    params = [p for p in model.parameters() if p.requires_grad]
    scaler = torch.amp.GradScaler("cuda", enabled=args.precision == "fp16")
    last = {}

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(*batch_inputs)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(params, args.grad_clip, foreach=True)
        scaler.step(opt)
        scaler.update()
        last["loss"] = loss.detach()

    step_s = time_batches(step, iters_per_batch=args.steps_per_batch, batches=args.batches,
                          warmup=args.warmup_steps, warmup_s=args.warmup_s)
    loss = float(last["loss"])
    if not math.isfinite(loss):
        raise RuntimeError(f"the training loss is not finite ({loss})")
    return step_s, loss


def latency(fn, samples, warmup):
    """(p50, p99) seconds of single calls of fn, each timed alone with CUDA events."""
    return time_singles(fn, samples=samples, warmup=warmup)


def peak_gib():
    return torch.cuda.max_memory_allocated() / 2**30


def fresh_memory():
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()


def run_cases(cases, measure, what):
    """measure(case) -> the fields of that case's peer-result line, for each case (a dict such as
    {"mode": "eager"} or {"mode": "compile", "batch": 256}, written into the line); each from fresh
    memory (its peak is its own) and a fresh torch.compile cache, a failure printed as a peer-error
    line with its traceback on stderr. Returns the exit status: 1 when any case failed."""
    failed = 0
    for case in cases:
        fresh_memory()
        torch._dynamo.reset()
        try:
            fields = measure(case)
        except Exception as e:  # noqa: BLE001  (any failure of a case is reported and the next runs)
            traceback.print_exc()
            print(error_line({**what, **case, "error": f"{type(e).__name__}: {e}"[:2000]}), flush=True)
            failed = 1
            continue
        print(result_line({**what, **case, **fields, **environment()}), flush=True)
    return failed
