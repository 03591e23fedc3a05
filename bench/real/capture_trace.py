"""A real 1M-entry allocation trace: a random-weight Llama (transformers) training with bf16 autocast and AdamW,
recorded with the settings oomdoc.record() uses, for max(SECONDS) then dumped."""
import sys, time, torch
from transformers import LlamaConfig, LlamaForCausalLM
out, seconds = sys.argv[1], float(sys.argv[2])
torch.manual_seed(0)
cfg = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
                  num_key_value_heads=16, vocab_size=32000, max_position_embeddings=1024)
model = LlamaForCausalLM(cfg).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="python")
t0 = time.time(); steps = 0
while time.time() - t0 < seconds:
    ids = torch.randint(0, 32000, (8, 512), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward(); opt.step(); opt.zero_grad(set_to_none=True); steps += 1
torch.cuda.synchronize()
t1 = time.time()
torch.cuda.memory._dump_snapshot(out)
print(f"steps {steps} in {t1 - t0:.1f} s; dump {time.time() - t1:.1f} s; torch {torch.__version__}", flush=True)
