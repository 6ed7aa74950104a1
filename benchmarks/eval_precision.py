"""What ``eval_precision = "bfloat16"`` changes in the reported numbers: accuracy and loss of CIFAR CNNs
on the real CIFAR-10 test set, evaluated in float32 and under bf16 autocast, at several stages of
training (one model trained centrally, checkpoints after each epoch). Runs on a CPU (bf16 autocast
rounds the same operands the GPU's does; both accumulate in float32) or a GPU.

    PYTHONPATH=src python3 benchmarks/eval_precision.py --data-dir ../shared/data --epochs 4
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from fedsl.config import schema as C
from fedsl.data.datasets import build_federation
from fedsl.engine.functional import FunctionalModel, evaluate
from fedsl.models import build_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default="../shared/data")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--lr", type=float, default=0.05)
    args = ap.parse_args()
    device = torch.device(args.device)
    cfg = C.validate({"name": "eval-precision", "rounds": 1, "data": {
        "dataset": "cifar10", "data_dir": args.data_dir, "num_clients": 10, "partition": "iid"},
        "model": {"name": "cifar_cnn"},
        "algorithm": {"name": "fedavg", "clients_per_round": 10, "local_lr": 0.01, "batch_size": 32}})
    fed = build_federation(cfg.data, 0).to(device, torch.float32)  # standardised as every run sees it
    model = build_model("cifar_cnn", 10, (3, 32, 32), seed=0).to(device)
    fm = FunctionalModel(model)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    g = torch.Generator().manual_seed(0)
    print(f"# float32 vs bf16-autocast evaluation, CIFAR CNN on CIFAR-10's 10,000 test images ({device})\n")
    print("| epochs trained | accuracy float32 | accuracy bfloat16 | Δ accuracy | loss float32 | loss bfloat16 | "
          "predictions that differ | eval s float32 | eval s bfloat16 |")
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    for epoch in range(args.epochs + 1):
        if epoch:
            model.train()
            for idx in torch.randperm(len(fed.x), generator=g).split(64):
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(fm.forward(dict(model.named_parameters()), fed.x[idx]), fed.y[idx]).backward()
                opt.step()
        params = fm.params()
        res, preds = {}, {}
        for p in ("float32", "bfloat16"):
            t0 = time.perf_counter()
            res[p] = (*evaluate(fm, params, fed.x_test, fed.y_test, 1000, p), time.perf_counter() - t0)
            with torch.inference_mode(), torch.autocast(device.type, torch.bfloat16, enabled=p == "bfloat16"):
                fm.train(False)
                preds[p] = torch.cat([fm.forward(params, fed.x_test[i:i + 1000]).argmax(1)
                                      for i in range(0, len(fed.x_test), 1000)])
        differ = (preds["float32"] != preds["bfloat16"]).float().mean().item()
        (a32, l32, t32), (a16, l16, t16) = res["float32"], res["bfloat16"]
        print(f"| {epoch} | {a32:.4f} | {a16:.4f} | {a16 - a32:+.4f} | {l32:.4f} | {l16:.4f} | {100 * differ:.2f}% | "
              f"{t32:.1f} | {t16:.1f} |", flush=True)


if __name__ == "__main__":
    main()
