import argparse

from vllm_hybridspec.tiny.build import build

parser = argparse.ArgumentParser(prog="python -m vllm_hybridspec.tiny", description="Build the tiny local models.")
parser.add_argument("out_dir", help="folder to build into (reused when it already holds this build)")
args = parser.parse_args()
models = build(args.out_dir)
for name in ("target", "target_exact", "dense", "dflash", "dspark"):
    print(f"{name:13s} {getattr(models, name)}")
print("stats", models.stats)
