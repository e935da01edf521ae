"""A small deterministic Hugging Face ``Trainer`` job that survives reclaims (design §17).

A tiny GPT-2 built from a ``GPT2Config`` (no weights are downloaded: ``HF_HUB_OFFLINE=1``) learns a synthetic
token data set. :class:`~nodeagent.jobkit_torch.ReclaimNetCallback` checkpoints on the agent's signals and at the
P1 interval through jobkit; a restarted run resumes with ``trainer.train(resume_from_checkpoint=...)`` from the
newest verified checkpoint, and ends with the same weights, bit for bit, as an uninterrupted run. At the end it
writes ``final_weights.pt`` (the model's state_dict) and ``result.json``.

    python examples/train_hf.py --epochs 2 --step-sleep 0.02
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach the hub: the model is built from its config
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing
from nodeagent import jobkit
from nodeagent.jobkit_torch import ReclaimNetCallback, make_deterministic


class SyntheticTokens(torch.utils.data.Dataset):
    """Fixed token sequences (a noisy counting pattern) drawn from their own generator."""

    def __init__(self, samples: int, seq_len: int, vocab: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        start = torch.randint(0, vocab, (samples, 1), generator=gen)
        ids = (start + torch.arange(seq_len)) % vocab
        noise = torch.randint(0, vocab, (samples, seq_len), generator=gen)
        keep = torch.rand(samples, seq_len, generator=gen) < 0.9
        self.ids = torch.where(keep, ids, noise)

    def __len__(self) -> int:
        return self.ids.shape[0]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class StepSleep(TrainerCallback):
    """Pretend each step is longer (so a test can signal the job mid-training)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        time.sleep(self.seconds)
        return control


def weights_sha256(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=64)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds of pretend GPU work per step")
    parser.add_argument("--output-dir", default="hf_out")
    parser.add_argument("--weights-out", default="final_weights.pt")
    parser.add_argument("--result", default=os.environ.get("RECLAIMNET_RESULT_FILE", "result.json"))
    args = parser.parse_args(argv)

    make_deterministic(threads=1)
    config = GPT2Config(vocab_size=args.vocab, n_positions=args.seq_len, n_embd=32, n_layer=2, n_head=2,
                        bos_token_id=0, eos_token_id=0, resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1)
    torch.manual_seed(args.seed)
    model = GPT2LMHeadModel(config)
    training_args = TrainingArguments(
        output_dir=args.output_dir,
        num_train_epochs=args.epochs,
        per_device_train_batch_size=args.batch,
        learning_rate=3e-3,
        warmup_steps=4,
        lr_scheduler_type="linear",
        weight_decay=0.01,
        seed=args.seed,
        data_seed=args.seed,
        full_determinism=True,
        save_strategy="no",  # ReclaimNetCallback asks for the saves the agent needs
        logging_strategy="no",
        report_to=[],
        disable_tqdm=True,
        dataloader_num_workers=0,
        use_cpu=not torch.cuda.is_available(),
    )
    ck = jobkit.Checkpointer.from_env()
    reclaim = ReclaimNetCallback(ck)
    callbacks: list[Any] = [reclaim]
    if args.step_sleep:
        callbacks.append(StepSleep(args.step_sleep))
    trainer = Trainer(model=model, args=training_args, callbacks=callbacks,
                      train_dataset=SyntheticTokens(args.samples, args.seq_len, args.vocab, args.seed))
    resume = reclaim.restore_dir(args.output_dir)
    if resume:
        print(f"resuming from {resume}", flush=True)
    trainer.train(resume_from_checkpoint=resume)
    ck.report_progress(trainer.state.global_step, min_period_s=0.0)
    torch.save(trainer.model.state_dict(), args.weights_out)
    result = {"steps": trainer.state.global_step, "weights_sha256": weights_sha256(trainer.model)}
    Path(args.result).write_text(json.dumps(result))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
