"""train: LoRA / QLoRA / full SFT of a KAIR student with TRL and PEFT (sft.py, under `accelerate
launch` with DDP or DeepSpeed ZeRO, or `kair train`), the training chat templates that mark the
assistant turns to learn (templates.py), checks of what training saves (checks.py), adapter
merging (merge.py) and the tiny test model (tiny_model.py). Imports kair_runtime, never the other
way."""
