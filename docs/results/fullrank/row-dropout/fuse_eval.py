"""Interim MASR (eq. 20, alpha 0.5) of two checkpoints on AOTM validation (2,000 full cases)."""
import json, sys, time
import torch
from masr.checkpoint import load_model
from masr.dataset import load_prepared
from masr.evaluate import evaluate_model
from masr.models.masr import MASR
torch.set_num_threads(1)
mdr, _ = load_model(sys.argv[1]); mass, ck = load_model(sys.argv[2])
print("mass epoch", ck.get("epoch"), file=sys.stderr)
data = load_prepared("/tmp/aotm")
fused = MASR.from_parts(mdr, mass, alpha=0.5, parts=["mdr", "mass"]).eval()
t = time.time()
m = evaluate_model(fused, data, "valid", device="cpu", full_sample=2000, sample_seed=0, compile=True)
print(json.dumps({"sampled_hit@10": m["sampled"]["hit@10"], "full_hit@10": m["full"]["hit@10"], "seconds": time.time() - t}))
m = evaluate_model(mdr.eval(), data, "valid", device="cpu", full_sample=2000, sample_seed=0)
print("mdr alone", m["sampled"]["hit@10"], m["full"]["hit@10"])
